//! Running an operation's GPU path behind a generic `B: Backend`: the one place that asks which
//! GPU backend compiled into this crate `B` is (by `TypeId`), with or without autodiff.

use std::any::TypeId;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;

use crate::gpu::GpuKernels;

/// An operation with a path for each GPU backend `G`: `plain` where `B` is `G`, `autodiff` where
/// `B` is `Autodiff<G>` (each moves its tensors from `B` to `G` with
/// [`crate::kernels::dispatch::same_type`]).
pub(crate) trait GpuPath<B: Backend>: Sized {
    type Output;
    /// The operation on `B` = `G`.
    fn plain<G: GpuKernels>(self) -> Self::Output;
    /// The operation on `B` = `Autodiff<G>`.
    fn autodiff<G: GpuKernels>(self) -> Self::Output;
}

/// `task` on `B`'s GPU path, or `task` back where `B` is no GPU backend compiled into this crate.
pub(crate) fn run<B: Backend, T: GpuPath<B>>(task: T) -> Result<T::Output, T> {
    let id = TypeId::of::<B>();
    #[cfg(feature = "wgpu")]
    {
        use burn::backend::Wgpu;
        if id == TypeId::of::<Wgpu>() {
            return Ok(task.plain::<Wgpu>());
        }
        if id == TypeId::of::<Autodiff<Wgpu>>() {
            return Ok(task.autodiff::<Wgpu>());
        }
    }
    #[cfg(feature = "cuda")]
    {
        use burn::backend::Cuda;
        if id == TypeId::of::<Cuda>() {
            return Ok(task.plain::<Cuda>());
        }
        if id == TypeId::of::<Autodiff<Cuda>>() {
            return Ok(task.autodiff::<Cuda>());
        }
    }
    let _ = id;
    Err(task)
}
