//! The mean cross-entropy loss of a batch: on the GPU backends compiled into this crate one
//! kernel forward and one backward, one autodiff node ([`crate::gpu::GpuKernels::cross_entropy_forward`]);
//! elsewhere Burn's `CrossEntropyLoss`.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use gpu::CrossEntropy;

/// The mean cross-entropy `[1]` of `logits` `[rows, classes]` against `labels` `[rows]` (each
/// below `classes`), as Burn's `CrossEntropyLoss` computes it.
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if logits.dtype() == burn::tensor::DType::F32 {
        return match crate::ops::gpu_path::run::<B, _>(CrossEntropy { logits, labels }) {
            Ok(loss) => loss,
            Err(CrossEntropy { logits, labels }) => burns(logits, labels),
        };
    }
    burns(logits, labels)
}

/// Burn's `CrossEntropyLoss` (on logits, no smoothing, weights or padding).
fn burns<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    CrossEntropyLossConfig::new().init(&logits.device()).forward(logits, labels)
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu {
    use burn::backend::Autodiff;
    use burn::tensor::backend::Backend;
    use burn::tensor::ops::{FloatTensor, IntTensor};
    use burn::tensor::{Int, Tensor, TensorPrimitive};

    use crate::cpu::dispatch::same_type;
    use crate::gpu::GpuKernels;
    use crate::ops::gpu_path::{gpu_node, GpuBackward, GpuPath};

    /// One loss for [`crate::ops::gpu_path::run`].
    pub(super) struct CrossEntropy<B: Backend> {
        pub(super) logits: Tensor<B, 2>,
        pub(super) labels: Tensor<B, 1, Int>,
    }

    impl<B: Backend> GpuPath<B> for CrossEntropy<B> {
        type Output = Tensor<B, 1>;

        fn plain<G: GpuKernels>(self) -> Tensor<B, 1> {
            let (logits, labels): (Tensor<G, 2>, Tensor<G, 1, Int>) = (same_type(self.logits), same_type(self.labels));
            let (loss, _) = G::cross_entropy_forward(logits.into_primitive().tensor(), labels.into_primitive());
            same_type(Tensor::<G, 1>::from_primitive(TensorPrimitive::Float(loss)))
        }

        fn autodiff<G: GpuKernels>(self) -> Tensor<B, 1> {
            let logits: Tensor<Autodiff<G>, 2> = same_type(self.logits);
            let labels: IntTensor<G> = same_type::<_, Tensor<Autodiff<G>, 1, Int>>(self.labels).into_primitive();
            let loss = gpu_node(Backward, [logits.into_primitive().tensor()], |[logits], tracked| {
                let (loss, softmax) = G::cross_entropy_forward(logits, labels.clone());
                (loss, tracked.then_some((softmax, labels)))
            });
            same_type(Tensor::<Autodiff<G>, 1>::from_primitive(TensorPrimitive::Float(loss)))
        }
    }

    /// The loss's backward kernel, from the rows' softmax and the labels.
    #[derive(Debug)]
    struct Backward;

    impl<G: GpuKernels> GpuBackward<G, 1> for Backward {
        type Kept = (FloatTensor<G>, IntTensor<G>);

        fn input_gradients(self, (softmax, labels): Self::Kept, grad: FloatTensor<G>) -> [FloatTensor<G>; 1] {
            [G::cross_entropy_backward(softmax, labels, grad)]
        }
    }
}
