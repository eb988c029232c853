//! The architectures Tandem compares and their serializable configurations (the `[[models]]`
//! entries of a manifest), one file each under `architectures/`: its config struct, its checks
//! and its block sequence. This file dispatches between them.
//!
//! A new architecture is its file, its variants here, and (for a new kind of block) `blocks.rs`.

mod cnn;
mod recurrent;
mod shared;
mod transformer;

use burn::module::Module;
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

pub use cnn::CnnConfig;
use recurrent::RecurrentCell;
pub use recurrent::RecurrentConfig;
pub use shared::InputSpec;
pub use transformer::TransformerConfig;

use crate::classifier::Classifier;
use crate::Invalid;

/// The four architectures Tandem compares.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum Architecture {
    Cnn,
    Lstm,
    Gru,
    Transformer,
}

impl Architecture {
    /// All architectures, in report order.
    pub const ALL: [Architecture; 4] = [Self::Cnn, Self::Lstm, Self::Gru, Self::Transformer];

    /// Lower-case name as used in manifests.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cnn => "cnn",
            Self::Lstm => "lstm",
            Self::Gru => "gru",
            Self::Transformer => "transformer",
        }
    }
}

/// A model's hyper-parameters; the data fixes vocabulary size, sequence length and classes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(tag = "architecture", rename_all = "kebab-case")]
pub enum ModelConfig {
    Cnn(CnnConfig),
    Lstm(RecurrentConfig),
    Gru(RecurrentConfig),
    Transformer(TransformerConfig),
}

impl ModelConfig {
    /// The architecture this config builds.
    pub fn architecture(&self) -> Architecture {
        match self {
            Self::Cnn(_) => Architecture::Cnn,
            Self::Lstm(_) => Architecture::Lstm,
            Self::Gru(_) => Architecture::Gru,
            Self::Transformer(_) => Architecture::Transformer,
        }
    }

    /// The same model on the fused forward passes (`true`) or on Burn's own (`false`).
    pub fn with_fused(&self, fused: bool) -> Self {
        let mut config = self.clone();
        match &mut config {
            Self::Cnn(c) => c.fused = fused,
            Self::Lstm(c) | Self::Gru(c) => c.fused = fused,
            Self::Transformer(c) => c.fused = fused,
        }
        config
    }

    /// Whether some dropout of the model draws from the backend's generator rather than the
    /// worker's stream ([`tandem_ops::dropout`]): Burn's own encoder layers, with dropout.
    pub fn draws_backend_dropout(&self) -> bool {
        matches!(self, Self::Transformer(c) if !c.fused && c.dropout > 0.0)
    }

    /// Checks the hyper-parameters against the input; the message names the offending field.
    pub fn validate(&self, input: &InputSpec) -> Result<(), Invalid> {
        match self {
            Self::Cnn(c) => c.validate(input),
            Self::Lstm(c) | Self::Gru(c) => c.validate(),
            Self::Transformer(c) => c.validate(),
        }
    }

    /// Blocks of the model `init` builds (the units model parallelism cuts between): CNN 3
    /// (embedding, conv-pool, head), recurrent and Transformer 2 + `layers`.
    pub fn num_blocks(&self) -> usize {
        match self {
            Self::Cnn(_) => 3,
            Self::Lstm(c) | Self::Gru(c) => 2 + c.layers,
            Self::Transformer(c) => 2 + c.layers,
        }
    }

    /// Builds the model on `device` (parameters drawn from the backend's seeded RNG).
    pub fn init<B: Backend>(&self, input: &InputSpec, device: &B::Device) -> Classifier<B> {
        let blocks = match self {
            Self::Cnn(c) => c.blocks(input, device),
            Self::Lstm(c) => c.blocks(RecurrentCell::Lstm, input, device),
            Self::Gru(c) => c.blocks(RecurrentCell::Gru, input, device),
            Self::Transformer(c) => c.blocks(input, device),
        };
        // Burn initializes parameters lazily, on first use, drawing from the backend's RNG then.
        // Drawing them now, in visiting order, makes the initial values independent of which
        // strategy (sequential, replicas, stages) touches which parameter first.
        let model = Classifier::from_blocks(blocks);
        model.visit(&mut Materialize);
        model
    }
}

/// Forces every lazily initialized parameter to be drawn, in visiting order.
struct Materialize;

impl<B: Backend> burn::module::ModuleVisitor<B> for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<burn::tensor::Tensor<B, D>>) {
        let _ = param.val();
    }
}
