//! GELU, softmax and dropout on the GPU backends compiled into this crate:
//! one kernel forward and one backward ([`crate::gpu::GpuKernels::rows_forward`]), one autodiff
//! node. Burn runs each as five to fifteen tensor operations a pass there. Dropout, with the
//! masks of the thread's stream ([`crate::dropout`]), on every backend.

use burn::nn::Dropout;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData};

use crate::backend::Which;
use crate::dropout::Draw;
use crate::row_op::RowOp;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use gpu::Rows;

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

/// `layer`'s dropout of `x` in training (with autodiff); `x` itself otherwise.
pub fn dropout<B: Backend, const D: usize>(layer: &Dropout, x: Tensor<B, D>) -> Tensor<B, D> {
    if !B::ad_enabled(&x.device()) {
        return x;
    }
    let Some(draw) = Draw::next(layer.prob, x.shape().num_elements()) else {
        return x;
    };
    if let Some(dropped) = on_gpu(RowOp::Dropout(draw), x.clone()) {
        return dropped;
    }
    if !Which::of::<B>().on_host() {
        let keep = 1.0 - layer.prob;
        return x.clone() * x.random_like(Distribution::Bernoulli(keep)) * (1.0 / keep);
    }
    let shape = x.shape();
    let mask: Vec<f32> = (0..shape.num_elements()).map(|i| draw.factor(i as u32)).collect();
    let device = x.device();
    x * Tensor::from_data(TensorData::new(mask, shape), &device)
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu {
    use burn::backend::Autodiff;
    use burn::tensor::backend::Backend;
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{Tensor, TensorPrimitive};

    use super::RowOp;
    use crate::cpu::dispatch::same_type;
    use crate::gpu::{GpuKernels, RowTape};
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

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};

    use super::*;
    use crate::dropout::begin_step;

    type B = Autodiff<NdArray>;

    fn mask(seed: u64, worker: usize, step: usize) -> Vec<f32> {
        begin_step(seed, worker, step);
        let x = Tensor::<B, 2>::ones([64, 64], &Default::default());
        dropout(&burn::nn::DropoutConfig::new(0.25).init(), x).into_data().to_vec().unwrap()
    }

    #[test]
    fn a_step_of_a_worker_draws_the_same_mask_on_any_thread() {
        let here = mask(7, 1, 3);
        let there = std::thread::spawn(|| mask(7, 1, 3)).join().unwrap();
        assert_eq!(here, there);
        assert_ne!(here, mask(7, 0, 3));
        assert_ne!(here, mask(7, 1, 4));
        let kept = here.iter().filter(|&&v| v > 0.0).count() as f64 / here.len() as f64;
        assert!((kept - 0.75).abs() < 0.03, "{kept}");
        assert!(here.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    }
}
