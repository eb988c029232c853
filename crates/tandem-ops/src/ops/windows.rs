//! The windows of a sequence (im2col): row `p` of a sample holds its positions `p .. p + width`
//! side by side, zeros past the end. On the GPU backends compiled into this crate one kernel
//! forward and one backward, one autodiff node ([`crate::gpu::GpuKernels::windows_forward`]);
//! elsewhere shifted views laid side by side, whose backward pass is a fill and a slice-assign
//! per view.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::concat::concat;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use gpu::Windows;

/// The first `positions` windows of `width` positions of `x` (`[batch, seq, channels]`):
/// `[batch, positions, width × channels]`, position-major within a row.
pub(crate) fn windows<B: Backend>(x: Tensor<B, 3>, width: usize, positions: usize) -> Tensor<B, 3> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if x.dtype() == burn::tensor::DType::F32 {
        return match crate::ops::gpu_path::run::<B, _>(Windows { x, width, positions }) {
            Ok(windows) => windows,
            Err(Windows { x, .. }) => shifted_views(x, width, positions),
        };
    }
    shifted_views(x, width, positions)
}

/// [`windows`] as tensor operations: zeros after the end, and the sequence shifted by each
/// offset, side by side.
fn shifted_views<B: Backend>(x: Tensor<B, 3>, width: usize, positions: usize) -> Tensor<B, 3> {
    let [batch, seq, channels] = x.dims();
    let x = match (positions + width - 1).saturating_sub(seq) {
        0 => x,
        extra => concat(vec![x.clone(), Tensor::zeros([batch, extra, channels], &x.device())], 1),
    };
    concat((0..width).map(|k| x.clone().narrow(1, k, positions)).collect(), 2)
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu {
    use burn::backend::Autodiff;
    use burn::tensor::backend::Backend;
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{Tensor, TensorPrimitive};

    use crate::cpu::dispatch::same_type;
    use crate::gpu::GpuKernels;
    use crate::ops::gpu_path::{gpu_node, GpuBackward, GpuPath};

    /// One windowing for [`crate::ops::gpu_path::run`].
    pub(super) struct Windows<B: Backend> {
        pub(super) x: Tensor<B, 3>,
        pub(super) width: usize,
        pub(super) positions: usize,
    }

    impl<B: Backend> GpuPath<B> for Windows<B> {
        type Output = Tensor<B, 3>;

        fn plain<G: GpuKernels>(self) -> Tensor<B, 3> {
            let x: Tensor<G, 3> = same_type(self.x);
            let windows = G::windows_forward(x.into_primitive().tensor(), self.width, self.positions);
            same_type(Tensor::<G, 3>::from_primitive(TensorPrimitive::Float(windows)))
        }

        fn autodiff<G: GpuKernels>(self) -> Tensor<B, 3> {
            let x: Tensor<Autodiff<G>, 3> = same_type(self.x);
            let (seq, width, positions) = (x.dims()[1], self.width, self.positions);
            let x = x.into_primitive().tensor();
            let windows =
                gpu_node(Backward { seq, width }, [x], |[x], _| (G::windows_forward(x, width, positions), Some(())));
            same_type(Tensor::<Autodiff<G>, 3>::from_primitive(TensorPrimitive::Float(windows)))
        }
    }

    /// The windows' backward kernel, for a sequence of `seq` positions.
    #[derive(Debug)]
    struct Backward {
        seq: usize,
        width: usize,
    }

    impl<G: GpuKernels> GpuBackward<G, 1> for Backward {
        type Kept = ();

        fn input_gradients(self, _: (), grad: FloatTensor<G>) -> [FloatTensor<G>; 1] {
            [G::windows_backward(grad, self.seq, self.width)]
        }
    }
}
