//! Layer norm with its scale and shift on the GPU backends compiled into this crate: one kernel
//! forward and one backward ([`crate::gpu::GpuKernels::layer_norm_forward`]), one autodiff node of
//! the input, γ and β. Elsewhere the caller runs the CPU path or Burn's operations.

use burn::nn::LayerNorm;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// `norm` applied to `x` (f32) over its last dimension with ε `epsilon`, where `B` is a GPU
/// backend compiled into this crate and `norm` has a shift; `None` elsewhere.
pub(crate) fn on_gpu<B: Backend, const D: usize>(
    norm: &LayerNorm<B>,
    x: Tensor<B, D>,
    epsilon: f32,
) -> Option<Tensor<B, D>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let (Some(beta), burn::tensor::DType::F32) = (&norm.beta, x.dtype()) {
        let task = gpu::Normalize { x, gamma: norm.gamma.val(), beta: beta.val(), epsilon };
        return crate::ops::gpu_path::run::<B, _>(task).ok();
    }
    let _ = (norm, x, epsilon);
    None
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu {
    use burn::backend::Autodiff;
    use burn::tensor::backend::Backend;
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{Tensor, TensorPrimitive};

    use crate::cpu::dispatch::same_type;
    use crate::gpu::{GpuKernels, LayerNormTape};
    use crate::ops::gpu_path::{gpu_node, GpuBackward, GpuPath};

    /// One layer norm for [`crate::ops::gpu_path::run`].
    pub(super) struct Normalize<B: Backend, const D: usize> {
        pub(super) x: Tensor<B, D>,
        pub(super) gamma: Tensor<B, 1>,
        pub(super) beta: Tensor<B, 1>,
        pub(super) epsilon: f32,
    }

    impl<B: Backend, const D: usize> GpuPath<B> for Normalize<B, D> {
        type Output = Tensor<B, D>;

        fn plain<G: GpuKernels>(self) -> Tensor<B, D> {
            let x = same_type::<_, Tensor<G, D>>(self.x).into_primitive().tensor();
            let [gamma, beta] =
                [self.gamma, self.beta].map(|t| same_type::<_, Tensor<G, 1>>(t).into_primitive().tensor());
            let (output, _) = G::layer_norm_forward(x, gamma, beta, self.epsilon);
            same_type(Tensor::<G, D>::from_primitive(TensorPrimitive::Float(output)))
        }

        fn autodiff<G: GpuKernels>(self) -> Tensor<B, D> {
            let epsilon = self.epsilon;
            let x = same_type::<_, Tensor<Autodiff<G>, D>>(self.x).into_primitive().tensor();
            let [gamma, beta] =
                [self.gamma, self.beta].map(|t| same_type::<_, Tensor<Autodiff<G>, 1>>(t).into_primitive().tensor());
            let output = gpu_node(Backward, [x, gamma, beta], |[x, gamma, beta], tracked| {
                let (output, tape) = G::layer_norm_forward(x, gamma, beta, epsilon);
                (output, tracked.then_some(tape))
            });
            same_type(Tensor::<Autodiff<G>, D>::from_primitive(TensorPrimitive::Float(output)))
        }
    }

    /// Layer norm's backward kernel, from the forward kernel's tape.
    #[derive(Debug)]
    struct Backward;

    impl<G: GpuKernels> GpuBackward<G, 3> for Backward {
        type Kept = LayerNormTape<FloatTensor<G>>;

        fn input_gradients(self, tape: Self::Kept, grad: FloatTensor<G>) -> [FloatTensor<G>; 3] {
            G::layer_norm_backward(tape, grad)
        }
    }
}
