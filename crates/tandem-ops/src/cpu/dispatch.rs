//! Running a backend-specific path behind a generic `B: Backend`: once [`crate::backend::Which`] has told
//! which backend `B` is, the operations move their tensors across with [`same_type`], read and
//! write host memory with [`host_f32`], and register their node with [`record_node`].

use std::any::Any;

use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::ops::{Backward, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorData};

/// `value` as a `T`; `A` and `T` must be the same type (checked by the caller, with [`crate::backend::Which::of`]).
pub(crate) fn same_type<A: 'static, T: 'static>(value: A) -> T {
    let mut slot = Some(value);
    let cast = (&mut slot as &mut dyn Any)
        .downcast_mut::<Option<T>>()
        .expect("the caller checked that the types are the same");
    cast.take().expect("the slot was filled above")
}

/// `tensor`'s values as f32 in host memory (no copy for a uniquely owned contiguous f32 Flex tensor).
pub(crate) fn host_f32<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> TensorData {
    let data = tensor.into_data();
    if data.dtype == DType::F32 {
        data
    } else {
        data.convert::<f32>()
    }
}

/// The values of data from [`host_f32`].
pub(crate) fn values(data: &TensorData) -> &[f32] {
    data.as_slice::<f32>().expect("converted to f32 by `host_f32`")
}

/// The values of data from [`host_f32`], writable.
pub(crate) fn values_mut(data: &mut TensorData) -> &mut [f32] {
    data.as_mut_slice::<f32>().expect("converted to f32 by `host_f32`")
}

/// Runs an operation on the inner backend `I` and registers it as **one autodiff node** with the
/// hand-written backward pass `op`. `run` gets the parents' values and whether the node is
/// tracked (some parent needs a gradient); it returns the output and, when tracked, the state
/// `op` needs.
pub(crate) fn record_node<I: Backend, Op: Backward<I, N>, const N: usize>(
    op: Op,
    parents: [FloatTensor<Autodiff<I>>; N],
    run: impl FnOnce([FloatTensor<I>; N], bool) -> (FloatTensor<I>, Option<Op::State>),
) -> FloatTensor<Autodiff<I>> {
    let nodes = parents.each_ref().map(|p| p.node.clone());
    // The parents stay referenced until the node is registered, as in Burn's own operations.
    let _held = parents.each_ref().map(|p| p.rc.clone());
    let values = parents.map(|p| p.primitive);
    match op.prepare::<NoCheckpointing>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (out, state) = run(values, true);
            prep.finish(state.expect("a tracked run returns its state"), out)
        }
        OpsKind::UnTracked(prep) => prep.finish(run(values, false).0),
    }
}
