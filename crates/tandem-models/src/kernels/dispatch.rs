//! Running a backend-specific path behind a generic `B: Backend`, chosen by `TypeId` at run time.
//!
//! Burn 0.21 gives a generic `B: Backend` no custom autodiff operation without an extra trait
//! bound on every model, so the operations with their own backward pass ([`crate::ops`]'s and
//! [`super::host_op`]'s) ask which backend `B` is ([`Known::of`]; the recurrence, which knows the
//! GPU backends too, compares `TypeId`s itself), move their tensors across with [`same_type`],
//! and register their node with [`record_node`].

use std::any::{Any, TypeId};

use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::ops::{Backward, OpsKind};
use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorData};

/// The CPU backends compiled into this crate, whose values the fast paths read and write in host
/// memory, with and without autodiff; `Other` is every other backend (the GPUs, f64 ndarray…).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Known {
    AutodiffFlex,
    AutodiffNdArray,
    Flex,
    NdArray,
    Other,
}

impl Known {
    /// Which of them `B` is.
    pub(crate) fn of<B: Backend>() -> Self {
        let id = TypeId::of::<B>();
        let known = [
            (TypeId::of::<Autodiff<Flex>>(), Self::AutodiffFlex),
            (TypeId::of::<Autodiff<NdArray>>(), Self::AutodiffNdArray),
            (TypeId::of::<Flex>(), Self::Flex),
            (TypeId::of::<NdArray>(), Self::NdArray),
        ];
        known.into_iter().find(|&(known_id, _)| known_id == id).map_or(Self::Other, |(_, known)| known)
    }
}

/// Whether `B` is a CPU backend compiled into this crate (Flex, ndarray) without autodiff.
pub(crate) fn on_cpu<B: Backend>() -> bool {
    matches!(Known::of::<B>(), Known::Flex | Known::NdArray)
}

/// `value` as a `T`; `A` and `T` must be the same type (checked by the caller, with [`Known::of`] or a `TypeId`).
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
