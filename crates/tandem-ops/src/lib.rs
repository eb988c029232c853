//! Tandem's operations and their kernels: the layers' forward passes as fewer, larger operations
//! than Burn's modules run, each with a hand-written backward pass (one autodiff node), the
//! optimizer's kernels and dropout's masks.
//!
//! `ops/` holds the operations ([`fused`] the layers' forward passes built on them), each with its
//! CPU kernels in `cpu/` (loops over host memory, for Flex and ndarray) and its GPU kernels in
//! `gpu/` (CubeCL, for wgpu and CUDA, and Burn's fusion over them). [`Which`] says which path a
//! backend takes; a backend whose feature is off runs Burn's own operations, which compute the
//! same values.

// Without a CPU backend's feature the host-memory kernels have no caller.
#![cfg_attr(not(any(feature = "flex", feature = "ndarray")), allow(dead_code, unused_imports))]

mod adamw;
mod backend;
mod cpu;
pub mod dropout;
mod fast_path;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu;
#[cfg(all(test, feature = "wgpu"))]
mod gpu_agreement;
pub mod ledger;
mod ops;
mod optimizer;
mod row_op;

pub use adamw::AdamWScalars;
pub use backend::Which;
pub use fast_path::{on_cpu, FastPath};
pub use ops::fused;
pub use ops::loss::cross_entropy;
pub use optimizer::{
    adamw_kernel_on, adamw_step, adamw_steps, squared_sum, squared_sum_without_copy, AdamWOutput, Floats,
};
