//! One-input operations (same rank) computed in host memory on the CPU backends, each one
//! autodiff node with a hand-written backward pass ([`super::gelu`], [`super::softmax`],
//! [`super::layer_norm`], [`super::permute`]; run by [`crate::ops::host_ops`]).
//!
//! Burn runs such an operation as several tensor operations (softmax: five, each with its own
//! backward), with scalar libm calls, or (a copy of a permuted view) one value at a time; here
//! each pass is one loop the compiler vectorises ([`tandem_simd`]) or one copy per row.

use std::fmt::Debug;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};

use super::dispatch::{host_f32, record_node, same_type};
use crate::backend::Which;

/// An operation for [`apply`].
pub(crate) trait HostOp: Copy + Debug + Send + Sync + 'static {
    /// Whether ndarray runs it too (else Flex only).
    const ON_NDARRAY: bool;
    /// Whether the backends without autodiff run it too (else Burn's operation: worth it where
    /// Burn's is several operations only under autodiff, and one fused kernel without).
    const WITHOUT_AUTODIFF: bool;
    /// What the backward pass needs from the forward pass.
    type Kept: Clone + Debug + Send + 'static;
    /// The output from `x` (f32 values), and what the backward pass needs.
    fn forward(self, x: TensorData) -> (TensorData, Self::Kept);
    /// The input's gradient from the output's, `grad` (f32 values).
    fn backward(self, kept: &Self::Kept, grad: TensorData) -> TensorData;
}

/// `op` on `x`: one autodiff node on `Autodiff<Flex>` (and `Autodiff<NdArray>` where the
/// operation allows), the same forward pass on plain Flex (ndarray) where it allows; `None`
/// elsewhere, where the caller runs Burn's operation.
pub(crate) fn apply<B: Backend, Op: HostOp, const D: usize>(op: Op, x: Tensor<B, D>) -> Option<Tensor<B, D>> {
    match Which::of::<B>() {
        #[cfg(feature = "flex")]
        Which::AutodiffFlex => Some(same_type(tracked::<burn::backend::Flex, Op, D>(op, same_type(x)))),
        #[cfg(feature = "ndarray")]
        Which::AutodiffNdArray if Op::ON_NDARRAY => {
            Some(same_type(tracked::<burn::backend::NdArray, Op, D>(op, same_type(x))))
        }
        Which::Flex if Op::WITHOUT_AUTODIFF => Some(forward(op, x).0),
        Which::NdArray if Op::WITHOUT_AUTODIFF && Op::ON_NDARRAY => Some(forward(op, x).0),
        _ => None,
    }
}

/// Whether [`apply`] runs `Op` as one autodiff node on `B`.
pub(crate) fn one_node<B: Backend, Op: HostOp>() -> bool {
    match Which::of::<B>() {
        Which::AutodiffFlex => true,
        Which::AutodiffNdArray => Op::ON_NDARRAY,
        _ => false,
    }
}

/// The length of the rows of `data` (its last dimension; at least 1, so that an empty tensor
/// is zero rows, not a panic).
pub(crate) fn row_len(data: &TensorData) -> usize {
    data.shape.last().copied().unwrap_or(1).max(1)
}

fn forward<B: Backend, Op: HostOp, const D: usize>(op: Op, x: Tensor<B, D>) -> (Tensor<B, D>, Op::Kept) {
    let device = x.device();
    let (out, kept) = op.forward(host_f32(x));
    (Tensor::from_data(out, &device), kept)
}

/// Runs the forward pass on `I` and registers one autodiff node for it.
fn tracked<I: Backend, Op: HostOp, const D: usize>(op: Op, x: Tensor<Autodiff<I>, D>) -> Tensor<Autodiff<I>, D> {
    let output = record_node(Node::<Op, D>(op), [x.into_primitive().tensor()], |[x], record| {
        let (out, kept) = forward::<I, Op, D>(op, Tensor::from_primitive(TensorPrimitive::Float(x)));
        (out.into_primitive().tensor(), record.then_some(kept))
    });
    Tensor::from_primitive(TensorPrimitive::Float(output))
}

/// The autodiff node of one [`apply`]; its state is what [`HostOp::forward`] kept.
#[derive(Debug)]
struct Node<Op, const D: usize>(Op);

impl<I: Backend, Op: HostOp, const D: usize> Backward<I, 1> for Node<Op, D> {
    type State = Op::Kept;

    fn backward(self, ops: Ops<Op::Kept, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = Tensor::<I, D>::from_primitive(TensorPrimitive::Float(grads.consume::<I>(&ops.node)));
        let [parent] = ops.parents;
        let Some(parent) = parent else { return };
        let device = grad.device();
        let grad = self.0.backward(&ops.state, host_f32(grad));
        grads.register::<I>(parent.id, Tensor::<I, D>::from_data(grad, &device).into_primitive().tensor());
    }
}
