//! Devices as manifests and the command line name them (`cpu`, `wgpu:0`, `cuda:1`), and starting
//! one before a run uses it.

use std::fmt;
use std::str::FromStr;

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use tandem_results::BackendKind;

/// What a device is: the CPU (Flex, ndarray) or a GPU of wgpu or CUDA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu,
    Wgpu,
    Cuda,
}

impl DeviceKind {
    /// The kinds, as manifests write them.
    const NAMES: [(Self, &'static str); 3] = [(Self::Cpu, "cpu"), (Self::Wgpu, "wgpu"), (Self::Cuda, "cuda")];

    /// The name manifests use.
    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(kind, _)| *kind == self).map_or("cpu", |(_, name)| name)
    }

    /// The kind of `backend`'s devices.
    pub fn of(backend: BackendKind) -> Self {
        match backend {
            BackendKind::Flex | BackendKind::Ndarray => Self::Cpu,
            BackendKind::Wgpu => Self::Wgpu,
            BackendKind::Cuda => Self::Cuda,
        }
    }
}

/// A device as manifests name it: `cpu`, `wgpu:0`, `cuda:1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceSpec {
    pub kind: DeviceKind,
    pub index: usize,
}

/// A device name that is not `cpu`, `wgpu:N` or `cuda:N`; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadDevice(String);

impl FromStr for DeviceSpec {
    type Err = BadDevice;

    fn from_str(s: &str) -> Result<Self, BadDevice> {
        let (name, index) = match s.split_once(':') {
            // CubeCL keeps device numbers as u16: a larger one would silently wrap around.
            Some((k, i)) => (
                k,
                i.parse::<u16>()
                    .map_err(|_| BadDevice(format!("device `{s}`: `{i}` is not a device number (0–65535)")))?
                    .into(),
            ),
            None => (s, 0),
        };
        let kind =
            DeviceKind::NAMES.iter().find(|(_, known)| *known == name).map(|(kind, _)| *kind).ok_or_else(|| {
                BadDevice(format!("device `{s}`: unknown kind `{name}` (expected cpu, wgpu:N or cuda:N)"))
            })?;
        Ok(Self { kind, index })
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::Cpu => f.write_str("cpu"),
            kind => write!(f, "{}:{}", kind.name(), self.index),
        }
    }
}

impl DeviceSpec {
    /// The first device of `backend`: `cpu`, `wgpu:0` or `cuda:0`.
    pub fn first_of(backend: BackendKind) -> Self {
        Self { kind: DeviceKind::of(backend), index: 0 }
    }

    /// Checks that this device belongs to `backend` (`cpu` for flex/ndarray, `wgpu:N`, `cuda:N`).
    pub(crate) fn check_backend(&self, backend: BackendKind) -> Result<(), String> {
        let expected = DeviceKind::of(backend);
        if self.kind == expected {
            Ok(())
        } else {
            Err(format!("device `{self}` does not belong to backend `{backend}` (use `{}`)", Self::first_of(backend)))
        }
    }
}

/// Starts `device` and runs one small tensor op on it. Backends panic on the first use of a
/// GPU that does not exist or whose driver is missing; this turns that into an error naming
/// the device, before any training starts.
pub(crate) fn probe_device<B: Backend>(name: &str, device: &B::Device) -> Result<(), String> {
    let device = device.clone();
    let started = std::thread::Builder::new()
        .name(format!("tandem-probe-{name}"))
        .spawn(move || {
            // On this thread too, so that a malformed `cubecl.toml` fails the probe, not the caller.
            #[cfg(any(feature = "wgpu", feature = "cuda"))]
            one_stream_per_device();
            Tensor::<B, 1>::ones([4], &device).sum().into_scalar()
        })
        .map_err(|e| format!("device `{name}`: cannot start a thread to probe it: {e}"))?;
    match started.join() {
        Ok(_) => Ok(()),
        Err(panic) => {
            let message =
                panic.downcast_ref::<String>().map(String::as_str).or_else(|| panic.downcast_ref::<&str>().copied());
            // CubeCL starts a device on a thread of its own; when that panics, the caller only
            // sees its channel close (`RecvError`), and the real reason is on stderr.
            let why = match message {
                Some(m) if !m.contains("RecvError") => m,
                _ => "the backend's own message is printed above",
            };
            let hint = match name.split(':').next() {
                Some("wgpu") => "wgpu:0 is the default adapter and wgpu:N (N ≥ 1) discrete GPU number N, counted from 0 (`vulkaninfo --summary` lists them)",
                Some("cuda") => "cuda:N is CUDA device number N, counted from 0 (`nvidia-smi -L` lists them)",
                _ => "see the backend's message above",
            };
            Err(format!("device `{name}` does not exist or cannot start: {why}; {hint}"))
        }
    }
}

/// Makes all threads that use one GPU share its command stream. CubeCL 0.10 gives each thread a
/// stream of its own, and a tensor handed to another thread (a stage's activations, a replica's
/// gradients) is then read on a stream that does not wait for the one that wrote it: training with
/// replicas or stages on one GPU silently went wrong (wgpu, toy epoch: model parallel 4e-2 away
/// from sequential, data parallel up to 6e-5; 2e-8 with one stream). Called by [`probe_device`],
/// which runs before any training on a GPU; settings from a `cubecl.toml` are kept.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn one_stream_per_device() {
    use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut slot = CubeClRuntimeConfig::storage().lock();
        let mut config = match slot.as_deref() {
            Some(config) => config.clone(),
            None => CubeClRuntimeConfig::from_current_dir().override_from_env(),
        };
        config.streaming.max_streams = 1;
        *slot = Some(std::sync::Arc::new(config));
    });
}

/// The wgpu device a manifest's `wgpu:N` names: `wgpu:0` is wgpu's default adapter (the
/// highest-power GPU, normally discrete GPU 0, or a software Vulkan driver such as lavapipe
/// where there is no GPU); `wgpu:N` for N ≥ 1 is discrete GPU number N, counted from 0 as
/// CubeCL counts them (so on a 2-GPU machine `wgpu:0` and `wgpu:1` are the two GPUs).
#[cfg(feature = "wgpu")]
pub(super) fn wgpu_device(index: usize) -> burn::backend::wgpu::WgpuDevice {
    use burn::backend::wgpu::WgpuDevice;
    if index == 0 {
        WgpuDevice::DefaultDevice
    } else {
        WgpuDevice::DiscreteGpu(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_read_as_they_are_written() {
        for name in ["cpu", "wgpu:0", "wgpu:3", "cuda:1"] {
            assert_eq!(name.parse::<DeviceSpec>().unwrap().to_string(), name);
        }
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec { kind: DeviceKind::Cuda, index: 0 });
        let err = "tpu:0".parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(err.contains("unknown kind `tpu`"), "{err}");
        let err = DeviceSpec::first_of(BackendKind::Cuda).check_backend(BackendKind::Flex).unwrap_err();
        assert!(err.contains("`cuda:0` does not belong to backend `flex` (use `cpu`)"), "{err}");
    }
}
