//! The mean cross-entropy loss of a batch: on the GPU backends compiled into this crate one
//! kernel forward and one backward, one autodiff node ([`crate::gpu::GpuKernels::cross_entropy_forward`]);
//! elsewhere Burn's `CrossEntropyLoss`.

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use burn::backend::autodiff::{
    checkpoint::base::Checkpointer,
    grads::Gradients,
    ops::{Backward, Ops},
};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use burn::backend::Autodiff;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::Backend;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use burn::tensor::ops::{FloatTensor, IntTensor};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use burn::tensor::{DType, TensorPrimitive};
use burn::tensor::{Int, Tensor};

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use super::gpu_path::{self, GpuPath};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::gpu::GpuKernels;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::kernels::dispatch::{record_node, same_type};

/// The mean cross-entropy `[1]` of `logits` `[rows, classes]` against `labels` `[rows]` (each
/// below `classes`), as Burn's `CrossEntropyLoss` computes it.
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if logits.dtype() == DType::F32 {
        return match gpu_path::run::<B, _>(CrossEntropy { logits, labels }) {
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

/// One loss for [`gpu_path::run`].
#[cfg(any(feature = "wgpu", feature = "cuda"))]
struct CrossEntropy<B: Backend> {
    logits: Tensor<B, 2>,
    labels: Tensor<B, 1, Int>,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
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
        let loss = record_node(CrossEntropyBackward, [logits.into_primitive().tensor()], |[logits], record| {
            let (loss, softmax) = G::cross_entropy_forward(logits, labels.clone());
            (loss, record.then_some((softmax, labels)))
        });
        same_type(Tensor::<Autodiff<G>, 1>::from_primitive(TensorPrimitive::Float(loss)))
    }
}

/// The autodiff node of one loss; its state is the rows' softmax and the labels.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[derive(Debug)]
struct CrossEntropyBackward;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl<G: GpuKernels> Backward<G, 1> for CrossEntropyBackward {
    type State = (FloatTensor<G>, IntTensor<G>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<G>(&ops.node);
        let [parent] = ops.parents;
        if let Some(parent) = parent {
            let (softmax, labels) = ops.state;
            grads.register::<G>(parent.id, G::cross_entropy_backward(softmax, labels, grad));
        }
    }
}
