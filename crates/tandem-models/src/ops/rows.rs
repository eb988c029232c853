//! GELU, softmax and layer norm's normalisation on the GPU backends compiled into this crate:
//! one kernel forward and one backward ([`crate::gpu::GpuKernels::rows_forward`]), one autodiff
//! node. Burn runs each as five to fifteen tensor operations a pass there.

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use burn::backend::autodiff::{
    checkpoint::base::Checkpointer,
    grads::Gradients,
    ops::{Backward, Ops},
};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use burn::tensor::{ops::FloatTensor, DType, TensorPrimitive};

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use super::gpu_path::{self, GpuPath};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::gpu::{GpuKernels, RowTape};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::kernels::dispatch::{record_node, same_type};

/// An operation over the last dimension of a tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum RowOp {
    /// `x · Φ(x)`, element by element (Burn's `gelu`).
    Gelu,
    /// `exp(x − max) / Σ exp(x − max)` (Burn's `softmax` over the last dimension).
    Softmax,
    /// `(x − mean) / √(var + ε)` (layer norm without its scale and shift).
    Normalize { epsilon: f32 },
}

/// `op` on `x` (f32) where `B` is a GPU backend compiled into this crate, with autodiff or not;
/// `None` elsewhere.
pub(crate) fn on_gpu<B: Backend, const D: usize>(op: RowOp, x: Tensor<B, D>) -> Option<Tensor<B, D>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if x.dtype() == DType::F32 {
        return gpu_path::run::<B, _>(Rows { op, x }).ok();
    }
    let _ = (op, x);
    None
}

/// One row operation for [`gpu_path::run`].
#[cfg(any(feature = "wgpu", feature = "cuda"))]
struct Rows<B: Backend, const D: usize> {
    op: RowOp,
    x: Tensor<B, D>,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl<B: Backend, const D: usize> GpuPath<B> for Rows<B, D> {
    type Output = Tensor<B, D>;

    fn plain<G: GpuKernels>(self) -> Tensor<B, D> {
        let x: Tensor<G, D> = same_type(self.x);
        let (output, _) = G::rows_forward(self.op, x.into_primitive().tensor());
        same_type(Tensor::<G, D>::from_primitive(TensorPrimitive::Float(output)))
    }

    fn autodiff<G: GpuKernels>(self) -> Tensor<B, D> {
        let x: Tensor<Autodiff<G>, D> = same_type(self.x);
        let op = self.op;
        let output = record_node(RowsBackward, [x.into_primitive().tensor()], |[x], record| {
            let (output, tape) = G::rows_forward(op, x);
            (output, record.then_some(tape))
        });
        same_type(Tensor::<Autodiff<G>, D>::from_primitive(TensorPrimitive::Float(output)))
    }
}

/// The autodiff node of one row operation; its state is the forward kernel's tape.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[derive(Debug)]
struct RowsBackward;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl<G: GpuKernels> Backward<G, 1> for RowsBackward {
    type State = RowTape<FloatTensor<G>>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<G>(&ops.node);
        let [parent] = ops.parents;
        if let Some(parent) = parent {
            grads.register::<G>(parent.id, G::rows_backward(ops.state, grad));
        }
    }
}
