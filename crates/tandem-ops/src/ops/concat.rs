//! Tensors laid side by side along one dimension (Burn's `cat`) in **one launch** on the GPU
//! backends compiled into this crate, with one autodiff node whose backward pass hands each piece
//! its slice of the gradient (a view, no launch). Burn's `cat` writes one piece per launch: the
//! recurrent layers lay their gates' weights side by side every forward pass. Elsewhere, and for
//! other than two to six f32 pieces with autodiff, Burn's `cat`.

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

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use super::gpu_path::{self, GpuPath};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::cpu::dispatch::{record_node, same_type};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::gpu::GpuKernels;

/// `pieces` (of one shape but along `dim`) side by side along `dim`, as `Tensor::cat`.
pub(crate) fn concat<B: Backend, const D: usize>(pieces: Vec<Tensor<B, D>>, dim: usize) -> Tensor<B, D> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if pieces.iter().all(|p| p.dtype() == DType::F32) {
        return match gpu_path::run::<B, _>(Concat { pieces, dim }) {
            Ok(output) => output,
            Err(Concat { pieces, .. }) => Tensor::cat(pieces, dim),
        };
    }
    Tensor::cat(pieces, dim)
}

/// One concatenation for [`gpu_path::run`].
#[cfg(any(feature = "wgpu", feature = "cuda"))]
struct Concat<B: Backend, const D: usize> {
    pieces: Vec<Tensor<B, D>>,
    dim: usize,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl<B: Backend, const D: usize> GpuPath<B> for Concat<B, D> {
    type Output = Tensor<B, D>;

    fn plain<G: GpuKernels>(self) -> Tensor<B, D> {
        let pieces: Vec<Tensor<G, D>> = same_type(self.pieces);
        let primitives = pieces.into_iter().map(|p| p.into_primitive().tensor()).collect();
        same_type(Tensor::<G, D>::from_primitive(TensorPrimitive::Float(G::concat(primitives, self.dim))))
    }

    /// One autodiff node for two to six pieces.
    fn autodiff<G: GpuKernels>(self) -> Tensor<B, D> {
        let (pieces, dim): (Vec<Tensor<Autodiff<G>, D>>, _) = (same_type(self.pieces), self.dim);
        same_type(match pieces.len() {
            2 => tracked::<G, D, 2>(pieces.try_into().expect("two pieces"), dim),
            3 => tracked::<G, D, 3>(pieces.try_into().expect("three pieces"), dim),
            4 => tracked::<G, D, 4>(pieces.try_into().expect("four pieces"), dim),
            5 => tracked::<G, D, 5>(pieces.try_into().expect("five pieces"), dim),
            6 => tracked::<G, D, 6>(pieces.try_into().expect("six pieces"), dim),
            _ => Tensor::cat(pieces, dim),
        })
    }
}

/// Runs the kernel on `G` and registers one autodiff node for it.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn tracked<G: GpuKernels, const D: usize, const N: usize>(
    pieces: [Tensor<Autodiff<G>, D>; N],
    dim: usize,
) -> Tensor<Autodiff<G>, D> {
    let widths = pieces.each_ref().map(|p| p.dims()[dim]);
    let parents = pieces.map(|p| p.into_primitive().tensor());
    let output =
        record_node(ConcatBackward::<D> { dim }, parents, |values, _| (G::concat(values.into(), dim), Some(widths)));
    Tensor::from_primitive(TensorPrimitive::Float(output))
}

/// The autodiff node of one concatenation along `dim` of `D`-dimensional pieces; its state is
/// the pieces' widths along `dim`.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[derive(Debug)]
struct ConcatBackward<const D: usize> {
    dim: usize,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl<G: GpuKernels, const D: usize, const N: usize> Backward<G, N> for ConcatBackward<D> {
    type State = [usize; N];

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = Tensor::<G, D>::from_primitive(TensorPrimitive::Float(grads.consume::<G>(&ops.node)));
        let mut start = 0;
        for (node, width) in ops.parents.into_iter().zip(ops.state) {
            if let Some(node) = node {
                let piece = grad.clone().narrow(self.dim, start, width);
                grads.register::<G>(node.id, piece.into_primitive().tensor());
            }
            start += width;
        }
    }
}
