//! The operations the blocks run on their fused path: the same maths as Burn's modules in fewer,
//! larger operations, each with its own autodiff node (a hand-written backward pass) on the
//! backends that have one and Burn's tensor operations elsewhere. Their host-memory loops are in
//! [`crate::cpu`].

pub(crate) mod attention;
pub(crate) mod concat;
pub(crate) mod conv_max;
pub(crate) mod embedding;
pub mod fused;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) mod gpu_path;
pub(crate) mod host_ops;
pub(crate) mod layer_norm;
pub(crate) mod linear;
pub(crate) mod loss;
pub(crate) mod recurrence;
pub(crate) mod rows;
pub(crate) mod windows;
