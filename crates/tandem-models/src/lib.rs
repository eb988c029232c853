//! Tandem's four text classifiers, generic over the Burn backend.
//!
//! Every model is a [`Classifier`]: an ordered list of [`Block`]s
//! (embedding → feature extractor(s) → head). A classifier can be cut into
//! contiguous **stages** with [`Classifier::split`]; running the stages one
//! after another computes exactly what the uncut model computes. That cut is
//! the seam model parallelism places on devices.
//!
//! A [`ModelConfig`] names the architecture (one file each under `architectures/`) and builds
//! its blocks. The blocks' fused forward passes run the operations of `ops/`, whose CPU kernels
//! are in `kernels/` and GPU kernels in `gpu/`; [`FastPath`] and [`on_cpu`] tell which of them
//! run on a backend.

mod adamw;
mod architectures;
mod aux_head;
mod blocks;
mod classifier;
pub mod dropout;
mod fast_path;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu;
mod invalid;
mod kernels;
mod ops;
mod optimizer;

// The manifest types: the architecture enums, the input spec and each architecture's config.
pub use adamw::AdamWScalars;
pub use architectures::*;
pub use aux_head::AuxHeadConfig;
pub use blocks::{
    Activation, Block, ConvPoolBlock, DenseBlock, EmbeddingBlock, EncoderBlock, HeadBlock, NotFeatures, RecurrentBlock,
};
pub use classifier::{Classifier, CutError};
pub use fast_path::{on_cpu, FastPath};
pub use invalid::{positive, Invalid};
pub use ops::loss::cross_entropy;
pub use optimizer::{adamw_kernel_on, adamw_step, adamw_steps, squared_sum, AdamWOutput, Floats};
