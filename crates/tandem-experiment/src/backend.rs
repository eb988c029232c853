//! Backends compiled into this build, and device names as manifests write them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A Burn backend Tandem can run on (each behind a cargo feature).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// Burn's pure-Rust CPU backend: the CPU backend for runs.
    Flex,
    /// ndarray CPU backend: the test suite's reference.
    Ndarray,
    /// Any GPU through wgpu (Vulkan, Metal, DX12).
    Wgpu,
    /// NVIDIA GPUs through CUDA.
    Cuda,
}

impl BackendKind {
    pub const ALL: [BackendKind; 4] = [Self::Flex, Self::Ndarray, Self::Wgpu, Self::Cuda];

    /// Name as written in manifests and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Flex => "flex",
            Self::Ndarray => "ndarray",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        }
    }

    /// Whether this build was compiled with the backend's cargo feature.
    pub fn is_compiled(self) -> bool {
        match self {
            Self::Flex => cfg!(feature = "flex"),
            Self::Ndarray => cfg!(feature = "ndarray"),
            Self::Wgpu => cfg!(feature = "wgpu"),
            Self::Cuda => cfg!(feature = "cuda"),
        }
    }

    /// The backends this build can run on.
    pub fn compiled() -> Vec<BackendKind> {
        Self::ALL.into_iter().filter(|b| b.is_compiled()).collect()
    }

    /// Whether the backend computes on the CPU (a "device" is then a number of cores).
    pub fn is_cpu(self) -> bool {
        matches!(self, Self::Flex | Self::Ndarray)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| format!("unknown backend `{s}` (expected one of: flex, ndarray, wgpu, cuda)"))
    }
}

/// A device as manifests name it: `cpu`, `wgpu:0`, `cuda:1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    pub kind: String,
    pub index: usize,
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, index) = match s.split_once(':') {
            Some((k, i)) => (k, i.parse().map_err(|_| format!("device `{s}`: `{i}` is not a device index"))?),
            None => (s, 0),
        };
        if !["cpu", "wgpu", "cuda"].contains(&kind) {
            return Err(format!("device `{s}`: unknown kind `{kind}` (expected cpu, wgpu:N or cuda:N)"));
        }
        Ok(Self { kind: kind.to_string(), index })
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == "cpu" { f.write_str("cpu") } else { write!(f, "{}:{}", self.kind, self.index) }
    }
}

impl DeviceSpec {
    /// Checks that this device belongs to `backend` (`cpu` for flex/ndarray, `wgpu:N`, `cuda:N`).
    pub fn check_backend(&self, backend: BackendKind) -> Result<(), String> {
        let expected = if backend.is_cpu() { "cpu" } else { backend.name() };
        if self.kind == expected {
            Ok(())
        } else {
            Err(format!("device `{self}` does not belong to backend `{backend}` (use `{expected}{}`)", if backend.is_cpu() { "" } else { ":0" }))
        }
    }
}
