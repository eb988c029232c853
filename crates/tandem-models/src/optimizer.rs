//! The optimizer's GPU kernels, for tandem-train's optimizer on the GPU backends (its CPU backends
//! run a one-pass loop of their own; see tandem-train's `optim`): one AdamW step over a parameter
//! tensor as one kernel, and the sum of the squares of every gradient (global-norm clipping) in
//! one launch per gradient.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};

use crate::adamw::AdamWScalars;

/// The parameter, first and second moments after one AdamW step.
pub type AdamWOutput<B, const D: usize> = [Tensor<B, D>; 3];

/// `N` float primitives of `B`.
type Floats<B, const N: usize> = [FloatTensor<B>; N];

/// The optimizer kernels of a GPU backend `B`, on its float primitives.
struct Kernels<B: Backend> {
    /// `[param, grad, moment 1, moment 2]` and `‖g‖²` → the parameter and both moments.
    adamw: fn(&AdamWScalars, Floats<B, 4>, FloatTensor<B>) -> Floats<B, 3>,
    /// The sum of the squares of every element of every tensor, one value.
    squared_sum: fn(Vec<FloatTensor<B>>) -> FloatTensor<B>,
}

/// `B`'s kernels, if `B` is a GPU backend compiled into this crate.
fn kernels<B: Backend>() -> Option<Kernels<B>> {
    #[cfg(feature = "wgpu")]
    if std::any::TypeId::of::<B>() == std::any::TypeId::of::<burn::backend::Wgpu>() {
        return Some(gpu::<B, burn::backend::Wgpu>());
    }
    #[cfg(feature = "cuda")]
    if std::any::TypeId::of::<B>() == std::any::TypeId::of::<burn::backend::Cuda>() {
        return Some(gpu::<B, burn::backend::Cuda>());
    }
    None
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

/// One AdamW step as one kernel where `B` is a GPU backend compiled into this crate and every
/// tensor is f32 (`[param, grad, moment 1, moment 2]`, one shape), the gradient clipped by
/// `squared_norm` (one value: `‖g‖²` over every gradient, see [`squared_sum`]; any value when
/// `scalars.clip_norm` is infinite). Elsewhere `None`, the tensors dropped: callers check
/// [`adamw_kernel_on`] and the dtypes first.
pub fn adamw_step<B: Backend, const D: usize>(
    scalars: &AdamWScalars,
    tensors: [Tensor<B, D>; 4],
    squared_norm: Tensor<B, 1>,
) -> Option<AdamWOutput<B, D>> {
    let kernels = kernels::<B>()?;
    let f32s = tensors.iter().all(|t| t.dtype() == DType::F32) && squared_norm.dtype() == DType::F32;
    f32s.then(|| (kernels.adamw)(scalars, tensors.map(primitive), primitive(squared_norm)).map(tensor))
}

/// The sum of the squares of every element of `tensors` (one value), in one launch per tensor
/// and one sum, where `B` is a GPU backend compiled into this crate and every tensor is f32 (of
/// any shape and layout; at least one). Elsewhere `None`.
pub fn squared_sum<B: Backend>(tensors: Vec<FloatTensor<B>>) -> Option<Tensor<B, 1>> {
    let kernels = kernels::<B>()?;
    let f32s = !tensors.is_empty() && tensors.iter().all(|t| burn::tensor::TensorMetadata::dtype(t) == DType::F32);
    f32s.then(|| tensor((kernels.squared_sum)(tensors)))
}

/// The kernels of the GPU backend `G`, which `B` is.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn gpu<B: Backend, G: crate::gpu::GpuKernels>() -> Kernels<B> {
    use crate::kernels::dispatch::same_type;
    Kernels {
        adamw: |scalars, tensors, squared_norm| {
            let [param, grad, moment_1, moment_2] = same_type::<_, Floats<G, 4>>(tensors);
            same_type(G::adamw(scalars, [param, grad, moment_1, moment_2, same_type(squared_norm)]))
        },
        squared_sum: |tensors| same_type(G::squared_sum(same_type(tensors))),
    }
}
