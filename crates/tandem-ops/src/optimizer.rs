//! The optimizer's kernels, for tandem-train's optimizer: on the GPU backends one AdamW step over
//! many parameters, and the sum of the squares of every gradient (global-norm clipping), each in
//! one launch per group of tensors (its CPU backends run a one-pass AdamW loop of their own; see
//! tandem-train's `optim`); on Flex a gradient's squared norm read in place.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};

use crate::adamw::AdamWScalars;

/// The parameter, first and second moments after one AdamW step.
pub type AdamWOutput<B, const D: usize> = [Tensor<B, D>; 3];

/// `N` float primitives of `B`.
pub type Floats<B, const N: usize> = [FloatTensor<B>; N];

/// AdamW's step of many parameters on a backend's primitives: `[param, grad, moment 1, moment 2]`
/// of each and `‖g‖²` → each parameter and both its moments.
type AdamWSteps<B> = fn(&AdamWScalars, Vec<Floats<B, 4>>, FloatTensor<B>) -> Vec<Floats<B, 3>>;

/// The optimizer kernels of a GPU backend `B`, on its float primitives.
struct Kernels<B: Backend> {
    adamw: AdamWSteps<B>,
    /// The sum of the squares of every element of every tensor, one value.
    squared_sum: fn(Vec<FloatTensor<B>>) -> FloatTensor<B>,
}

/// `B`'s kernels, if `B` is a GPU backend compiled into this crate.
fn kernels<B: Backend>() -> Option<Kernels<B>> {
    match crate::backend::Which::of::<B>() {
        #[cfg(feature = "wgpu")]
        crate::backend::Which::Wgpu => Some(gpu::<B, burn::backend::Wgpu>()),
        #[cfg(feature = "cuda")]
        crate::backend::Which::Cuda => Some(gpu::<B, burn::backend::Cuda>()),
        _ => None,
    }
}

/// Whether [`adamw_step`] and [`squared_sum`] run as kernels on `B` (for f32 tensors).
pub fn adamw_kernel_on<B: Backend>() -> bool {
    kernels::<B>().is_some()
}

/// The primitive of a float tensor.
fn primitive<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> FloatTensor<B> {
    tensor.into_primitive().tensor()
}

/// A float primitive as a tensor of `D` dimensions.
fn tensor<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

/// One AdamW step of many parameters where `B` is a GPU backend compiled into this crate and
/// every tensor is f32: each `[param, grad, moment 1, moment 2]` (one shape; the gradient in any
/// layout) → the parameter and both moments after it, in one launch per group of parameters. The
/// gradients are clipped by `squared_norm` (one value: `‖g‖²` over every gradient, see
/// [`squared_sum`]; any value when `scalars.clip_norm` is infinite). Elsewhere `None`, the
/// tensors dropped: callers check [`adamw_kernel_on`] and the dtypes first.
pub fn adamw_steps<B: Backend>(
    scalars: &AdamWScalars,
    tensors: Vec<Floats<B, 4>>,
    squared_norm: Tensor<B, 1>,
) -> Option<Vec<Floats<B, 3>>> {
    let kernels = kernels::<B>()?;
    let f32 = |t: &FloatTensor<B>| burn::tensor::TensorMetadata::dtype(t) == DType::F32;
    let f32s = tensors.iter().flatten().all(f32) && squared_norm.dtype() == DType::F32;
    f32s.then(|| (kernels.adamw)(scalars, tensors, primitive(squared_norm)))
}

/// [`adamw_steps`] of one parameter.
pub fn adamw_step<B: Backend, const D: usize>(
    scalars: &AdamWScalars,
    tensors: [Tensor<B, D>; 4],
    squared_norm: Tensor<B, 1>,
) -> Option<AdamWOutput<B, D>> {
    let mut steps = adamw_steps(scalars, vec![tensors.map(primitive)], squared_norm)?;
    steps.pop().map(|three| three.map(tensor))
}

/// The sum of the squares of every element of `tensors` (one value), in one launch per group of
/// tensors and one sum, where `B` is a GPU backend compiled into this crate and every tensor is
/// f32 (of any shape and layout; at least one). Elsewhere `None`.
pub fn squared_sum<B: Backend>(tensors: Vec<FloatTensor<B>>) -> Option<Tensor<B, 1>> {
    let kernels = kernels::<B>()?;
    let f32s = !tensors.is_empty() && tensors.iter().all(|t| burn::tensor::TensorMetadata::dtype(t) == DType::F32);
    f32s.then(|| tensor((kernels.squared_sum)(tensors)))
}

/// `‖tensor‖²`, summed in f64 in one read of its values where `B` is Flex and the tensor is f32
/// and contiguous (Burn's `square().sum()` first writes a squared copy); `None` elsewhere, where
/// the caller asks Burn.
pub fn squared_sum_without_copy<B: Backend, const D: usize>(tensor: &Tensor<B, D>) -> Option<f64> {
    #[cfg(feature = "flex")]
    return crate::cpu::squared_sum::squared_sum_without_copy(tensor);
    #[cfg(not(feature = "flex"))]
    {
        let _ = tensor;
        None
    }
}

/// The kernels of the GPU backend `G`, which `B` is.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn gpu<B: Backend, G: crate::gpu::GpuKernels>() -> Kernels<B> {
    use crate::cpu::dispatch::same_type;
    Kernels {
        adamw: |scalars, tensors, squared_norm| {
            same_type(G::adamw(scalars, same_type::<_, Vec<Floats<G, 4>>>(tensors), same_type(squared_norm)))
        },
        squared_sum: |tensors| same_type(G::squared_sum(same_type(tensors))),
    }
}
