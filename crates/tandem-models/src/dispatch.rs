//! Running a backend-specific path behind a generic `B: Backend`, chosen by `TypeId` at run time.
//!
//! Burn 0.21 gives a generic `B: Backend` no custom autodiff operation without an extra trait
//! bound on every model, so the operations with their own backward pass ([`crate::recurrence`],
//! [`crate::conv_max`]) compare `TypeId::of::<B>()` with the backends they know and then move
//! their tensors across with [`same_type`].

use std::any::{Any, TypeId};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};

/// Whether `B` is a CPU backend compiled into this crate (Flex, ndarray), whose values the
/// fast paths read and write in host memory.
pub fn on_cpu<B: Backend>() -> bool {
    [TypeId::of::<burn::backend::Flex>(), TypeId::of::<burn::backend::NdArray>()].contains(&TypeId::of::<B>())
}

/// `value` as a `T`; `A` and `T` must be the same type (checked by the caller's `TypeId`).
pub(crate) fn same_type<A: 'static, T: 'static>(value: A) -> T {
    let mut slot = Some(value);
    let cast = (&mut slot as &mut dyn Any).downcast_mut::<Option<T>>().expect("the caller checked that the types are the same");
    cast.take().expect("the slot was filled above")
}

/// `tensor`'s values as f32 in host memory (no copy for a uniquely owned contiguous f32 Flex tensor).
pub(crate) fn host_f32<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> TensorData {
    let data = tensor.into_data();
    if data.dtype == DType::F32 { data } else { data.convert::<f32>() }
}

/// The values of data from [`host_f32`].
pub(crate) fn values(data: &TensorData) -> &[f32] {
    data.as_slice::<f32>().expect("converted to f32 by `host_f32`")
}

/// The values of data from [`host_f32`], writable.
pub(crate) fn values_mut(data: &mut TensorData) -> &mut [f32] {
    data.as_mut_slice::<f32>().expect("converted to f32 by `host_f32`")
}
