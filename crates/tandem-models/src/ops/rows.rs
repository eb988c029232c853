//! GELU, softmax and dropout on the GPU backends compiled into this crate:
//! one kernel forward and one backward ([`crate::gpu::GpuKernels::rows_forward`]), one autodiff
//! node. Burn runs each as five to fifteen tensor operations a pass there.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use crate::dropout::Draw;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use gpu::Rows;

/// An operation over the last dimension of a tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum RowOp {
    /// `x · Φ(x)`, element by element (Burn's `gelu`).
    Gelu,
    /// `exp(x − max) / Σ exp(x − max)` (Burn's `softmax` over the last dimension).
    Softmax,
    /// `x` times its factor in the mask `draw` (0 or `1 / keep`), element by element.
    Dropout(Draw),
}

/// `op` on `x` (f32) where `B` is a GPU backend compiled into this crate, with autodiff or not;
/// `None` elsewhere.
pub(crate) fn on_gpu<B: Backend, const D: usize>(op: RowOp, x: Tensor<B, D>) -> Option<Tensor<B, D>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if x.dtype() == burn::tensor::DType::F32 {
        return crate::ops::gpu_path::run::<B, _>(Rows { op, x }).ok();
    }
    let _ = (op, x);
    None
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu {
    use burn::backend::Autodiff;
    use burn::tensor::backend::Backend;
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{Tensor, TensorPrimitive};

    use super::RowOp;
    use crate::gpu::{GpuKernels, RowTape};
    use crate::kernels::dispatch::same_type;
    use crate::ops::gpu_path::{gpu_node, GpuBackward, GpuPath};

    /// One row operation for [`crate::ops::gpu_path::run`].
    pub(super) struct Rows<B: Backend, const D: usize> {
        pub(super) op: RowOp,
        pub(super) x: Tensor<B, D>,
    }

    impl<B: Backend, const D: usize> GpuPath<B> for Rows<B, D> {
        type Output = Tensor<B, D>;

        fn plain<G: GpuKernels>(self) -> Tensor<B, D> {
            let x: Tensor<G, D> = same_type(self.x);
            let (output, _) = G::rows_forward(self.op, x.into_primitive().tensor());
            same_type(Tensor::<G, D>::from_primitive(TensorPrimitive::Float(output)))
        }

        fn autodiff<G: GpuKernels>(self) -> Tensor<B, D> {
            let op = self.op;
            let x = same_type::<_, Tensor<Autodiff<G>, D>>(self.x).into_primitive().tensor();
            let output = gpu_node(Backward, [x], |[x], tracked| {
                let (output, tape) = G::rows_forward(op, x);
                (output, tracked.then_some(tape))
            });
            same_type(Tensor::<Autodiff<G>, D>::from_primitive(TensorPrimitive::Float(output)))
        }
    }

    /// The backward kernel of a row operation, from the forward kernel's tape.
    #[derive(Debug)]
    struct Backward;

    impl<G: GpuKernels> GpuBackward<G, 1> for Backward {
        type Kept = RowTape<FloatTensor<G>>;

        fn input_gradients(self, tape: Self::Kept, grad: FloatTensor<G>) -> [FloatTensor<G>; 1] {
            [G::rows_backward(tape, grad)]
        }
    }
}
