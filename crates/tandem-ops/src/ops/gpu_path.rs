//! Running an operation's GPU path behind a generic `B: Backend`, on the GPU backend
//! [`crate::backend::Which`] says `B` is, with or without autodiff; and the autodiff node of the GPU
//! operations ([`GpuBackward`]).

use std::fmt::Debug;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Bool, Tensor};

use crate::backend::Which;
use crate::cpu::dispatch::{record_node, same_type};
use crate::gpu::GpuKernels;

/// An operation with a path for each GPU backend `G`: `plain` where `B` is `G`, `autodiff` where
/// `B` is `Autodiff<G>` (each moves its tensors from `B` to `G` with
/// [`crate::cpu::dispatch::same_type`]).
pub(crate) trait GpuPath<B: Backend>: Sized {
    type Output;
    /// The operation on `B` = `G`.
    fn plain<G: GpuKernels>(self) -> Self::Output;
    /// The operation on `B` = `Autodiff<G>`.
    fn autodiff<G: GpuKernels>(self) -> Self::Output;
}

/// `task` on `B`'s GPU path, or `task` back where `B` is no GPU backend compiled into this crate.
pub(crate) fn run<B: Backend, T: GpuPath<B>>(task: T) -> Result<T::Output, T> {
    match Which::of::<B>() {
        #[cfg(feature = "wgpu")]
        Which::Wgpu => Ok(task.plain::<burn::backend::Wgpu>()),
        #[cfg(feature = "wgpu")]
        Which::AutodiffWgpu => Ok(task.autodiff::<burn::backend::Wgpu>()),
        #[cfg(feature = "cuda")]
        Which::Cuda => Ok(task.plain::<burn::backend::Cuda>()),
        #[cfg(feature = "cuda")]
        Which::AutodiffCuda => Ok(task.autodiff::<burn::backend::Cuda>()),
        _ => Err(task),
    }
}

/// `mask_pad` (`true` at padding) as floats, 1 at padding, on `G`, where `B` is `G` or
/// `Autodiff<G>` (whose Bool tensors are `G`'s).
pub(crate) fn padding_on<B: Backend, G: Backend>(mask_pad: &Tensor<B, 2, Bool>) -> FloatTensor<G> {
    let mask = Tensor::<G, 2, Bool>::from_primitive(same_type(mask_pad.clone().into_primitive()));
    mask.float().into_primitive().tensor()
}

/// The backward pass of a GPU operation of `N` float inputs on `G`: the inputs' gradients from the
/// output's and what the forward pass kept.
pub(crate) trait GpuBackward<G: GpuKernels, const N: usize>: Debug + Send + Sync + 'static {
    /// What the forward pass keeps for the backward pass.
    type Kept: Clone + Send + Debug + 'static;
    /// The inputs' gradients from the output's, `grad`.
    fn input_gradients(self, kept: Self::Kept, grad: FloatTensor<G>) -> [FloatTensor<G>; N];
}

/// Runs `forward` on the values of `inputs` on `G` (told whether the node is tracked) and
/// registers it as one autodiff node whose backward pass is `op`'s.
pub(crate) fn gpu_node<G: GpuKernels, Op: GpuBackward<G, N>, const N: usize>(
    op: Op,
    inputs: [FloatTensor<Autodiff<G>>; N],
    forward: impl FnOnce([FloatTensor<G>; N], bool) -> (FloatTensor<G>, Option<Op::Kept>),
) -> FloatTensor<Autodiff<G>> {
    record_node(Node(op), inputs, forward)
}

/// The autodiff node of a [`GpuBackward`] operation.
#[derive(Debug)]
struct Node<Op>(Op);

impl<G: GpuKernels, Op: GpuBackward<G, N>, const N: usize> Backward<G, N> for Node<Op> {
    type State = Op::Kept;

    fn backward(self, ops: Ops<Op::Kept, N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<G>(&ops.node);
        let gradients = self.0.input_gradients(ops.state, grad);
        for (parent, gradient) in ops.parents.into_iter().zip(gradients) {
            if let Some(parent) = parent {
                grads.register::<G>(parent.id, gradient);
            }
        }
    }
}
