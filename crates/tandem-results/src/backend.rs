//! The Burn backends a run can use, by name: what `summary.json` and manifests record.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A Burn backend Tandem can run on (each behind a cargo feature of the runner).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
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

    /// Whether the backend computes on the CPU (a "device" is then a number of cores).
    pub fn is_cpu(self) -> bool {
        matches!(self, Self::Flex | Self::Ndarray)
    }

    /// The kind its devices are named with in manifests: `cpu`, `wgpu` or `cuda`.
    pub fn device_kind(self) -> &'static str {
        if self.is_cpu() {
            "cpu"
        } else {
            self.name()
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A backend name that is none of [`BackendKind::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{0}` (expected one of: flex, ndarray, wgpu, cuda)")]
pub struct UnknownBackend(pub String);

impl FromStr for BackendKind {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<Self, UnknownBackend> {
        Self::ALL.into_iter().find(|b| b.name() == s).ok_or_else(|| UnknownBackend(s.to_string()))
    }
}
