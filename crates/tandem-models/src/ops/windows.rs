//! The windows of a sequence (im2col): row `p` of a sample holds its positions `p .. p + width`
//! side by side, zeros past the end. On the GPU backends compiled into this crate one kernel
//! forward and one backward, one autodiff node ([`crate::gpu::GpuKernels::windows_forward`]);
//! elsewhere shifted views laid side by side, whose backward pass is a fill and a slice-assign
//! per view.

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
use burn::tensor::{DType, TensorPrimitive};

use super::concat::concat;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use super::gpu_path::{self, GpuPath};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::gpu::GpuKernels;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::kernels::dispatch::{record_node, same_type};

/// The first `positions` windows of `width` positions of `x` (`[batch, seq, channels]`):
/// `[batch, positions, width × channels]`, position-major within a row.
pub(crate) fn windows<B: Backend>(x: Tensor<B, 3>, width: usize, positions: usize) -> Tensor<B, 3> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if x.dtype() == DType::F32 {
        return match gpu_path::run::<B, _>(Windows { x, width, positions }) {
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

/// One windowing for [`gpu_path::run`].
#[cfg(any(feature = "wgpu", feature = "cuda"))]
struct Windows<B: Backend> {
    x: Tensor<B, 3>,
    width: usize,
    positions: usize,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
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
        let node = WindowsBackward { seq, width };
        let windows = record_node(node, [x.into_primitive().tensor()], |[x], _| {
            (G::windows_forward(x, width, positions), Some(()))
        });
        same_type(Tensor::<Autodiff<G>, 3>::from_primitive(TensorPrimitive::Float(windows)))
    }
}

/// The autodiff node of one windowing of a sequence of `seq` positions.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[derive(Debug)]
struct WindowsBackward {
    seq: usize,
    width: usize,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl<G: GpuKernels> Backward<G, 1> for WindowsBackward {
    type State = ();

    fn backward(self, ops: Ops<(), 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<G>(&ops.node);
        let [parent] = ops.parents;
        if let Some(parent) = parent {
            grads.register::<G>(parent.id, G::windows_backward(grad, self.seq, self.width));
        }
    }
}
