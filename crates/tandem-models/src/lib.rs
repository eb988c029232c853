//! Tandem's four text classifiers, generic over the Burn backend.
//!
//! Every model is a [`Classifier`]: an ordered list of [`Block`]s
//! (embedding → feature extractor(s) → head). A classifier can be cut into
//! contiguous **stages** with [`Classifier::split`]; running the stages one
//! after another computes exactly what the uncut model computes. That cut is
//! the seam model parallelism places on devices.

mod blocks;
mod classifier;
mod config;
pub mod conv_max;
mod dispatch;
mod embedding;
pub mod fused;
pub mod gelu;
mod host_gemm;
mod host_math;
mod host_op;
pub mod layer_norm;
pub mod linear;
mod permute;
pub mod recurrence;
mod recurrence_host;
pub mod softmax;
pub mod wide;

pub use blocks::{Activation, Block, ConvPoolBlock, EmbeddingBlock, EncoderBlock, HeadBlock, RecurrentBlock};
pub use classifier::{Classifier, CutError};
pub use config::{Architecture, CnnConfig, InputSpec, ModelConfig, RecurrentConfig, TransformerConfig};
pub use dispatch::on_cpu;
