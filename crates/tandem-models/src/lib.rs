//! Tandem's four text classifiers, generic over the Burn backend.
//!
//! Every model is a [`Classifier`]: an ordered list of [`Block`]s
//! (embedding → feature extractor(s) → head). A classifier can be cut into
//! contiguous **stages** with [`Classifier::split`]; running the stages one
//! after another computes exactly what the uncut model computes. That cut is
//! the seam model parallelism places on devices.
//!
//! A [`ModelConfig`] names the architecture (one file each under `architectures/`) and builds
//! its blocks. The blocks' fused forward passes run tandem-ops' operations, with kernels of their
//! own on the backends whose features are on (`flex`, `ndarray`, `wgpu`, `cuda`).

mod architectures;
mod aux_head;
mod blocks;
mod classifier;
mod invalid;

// The manifest types: the architecture enums, the input spec and each architecture's config.
pub use architectures::*;
pub use aux_head::AuxHeadConfig;
pub use blocks::{
    Activation, Block, ConvPoolBlock, DenseBlock, EmbeddingBlock, EncoderBlock, HeadBlock, NotFeatures, RecurrentBlock,
};
pub use classifier::{Classifier, CutError};
pub use invalid::{positive, Invalid};
