//! The one place where a backend's name becomes its type: [`with_backend`] runs a
//! [`BackendTask`] on the backend a run names, with its devices started. It holds the build's
//! only backend `#[cfg(feature)]` arms and the device probe; the runner, inference, the
//! benchmarks and the GPU test all come through it. Devices are named as manifests name them
//! ([`DeviceSpec`]).

mod device;
pub mod launches;

use burn::tensor::backend::AutodiffBackend;

pub(crate) use device::probe_device;
pub use device::{BadDevice, DeviceKind, DeviceSpec};
pub use tandem_results::BackendKind;

/// Whether this build was compiled with `backend`'s cargo feature.
pub fn is_compiled(backend: BackendKind) -> bool {
    match backend {
        BackendKind::Flex => cfg!(feature = "flex"),
        BackendKind::Ndarray => cfg!(feature = "ndarray"),
        BackendKind::Wgpu => cfg!(feature = "wgpu"),
        BackendKind::Cuda => cfg!(feature = "cuda"),
    }
}

/// The backends this build can run on.
pub fn compiled_backends() -> Vec<BackendKind> {
    BackendKind::ALL.into_iter().filter(|b| is_compiled(*b)).collect()
}

/// Work that runs on whichever backend it is given: the generic body [`with_backend`] calls
/// with the concrete type.
pub trait BackendTask {
    type Output;

    /// Runs on `B` (with autodiff; inference uses `B::InnerBackend`, which has the same
    /// devices). `devices`: one per [`DeviceSpec`] given to [`with_backend`], in that order and
    /// started; on a CPU backend every one is the CPU.
    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output;
}

/// Runs `task` on `backend` with `devices`. Each GPU device is started first (one small
/// operation): one that does not exist or cannot start is an error naming it, and nothing runs.
/// A backend this build was compiled without is an error naming the feature to build with.
pub fn with_backend<T: BackendTask>(
    backend: BackendKind,
    devices: &[DeviceSpec],
    task: T,
) -> Result<T::Output, String> {
    #[allow(unused_imports)] // without any backend feature, nothing below uses it
    use burn::backend::Autodiff;
    match backend {
        #[cfg(feature = "flex")]
        BackendKind::Flex => start::<Autodiff<burn::backend::Flex>, T>(devices, |_| Default::default(), task),
        #[cfg(feature = "ndarray")]
        BackendKind::Ndarray => start::<Autodiff<burn::backend::NdArray>, T>(devices, |_| Default::default(), task),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => start::<Autodiff<burn::backend::Wgpu>, T>(devices, device::wgpu_device, task),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            start::<Autodiff<burn::backend::Cuda>, T>(devices, burn::backend::cuda::CudaDevice::new, task)
        }
        #[allow(unreachable_patterns)]
        other => Err(format!(
            "backend `{other}` is not compiled into this build (it has: {}); rebuild with `--features {other}`",
            compiled_backends().iter().map(|b| b.name()).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// Starts `specs` on `B` (each GPU device once) and runs `task` with them.
#[allow(dead_code)] // unused in a build without backends
fn start<B: AutodiffBackend, T: BackendTask>(
    specs: &[DeviceSpec],
    device: impl Fn(usize) -> B::Device,
    task: T,
) -> Result<T::Output, String> {
    let devices: Vec<B::Device> = specs.iter().map(|spec| device(spec.index)).collect();
    for (i, spec) in specs.iter().enumerate() {
        let first = specs.iter().position(|s| s == spec) == Some(i);
        if spec.kind != DeviceKind::Cpu && first {
            probe_device::<B>(&spec.to_string(), &devices[i])?;
        }
    }
    Ok(task.run::<B>(devices))
}
