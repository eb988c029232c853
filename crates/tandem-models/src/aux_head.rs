//! Auxiliary classifier heads for local learning (Belilovsky, Eickenberg & Oyallon, "Decoupled
//! Greedy Learning of CNNs", ICML 2020): a small classifier on a stage's output gives the stage
//! a loss of its own, so it can learn without a gradient from the stages after it. A head is a
//! [`Classifier`] of its own (not part of the model that is evaluated and saved).

use burn::nn::{DropoutConfig, LinearConfig};
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::blocks::{Block, DenseBlock, HeadBlock};
use crate::classifier::Classifier;
use crate::Invalid;

/// `aux_head = { kind = "linear" }` or `{ kind = "mlp", hidden = 64 }`: the auxiliary classifier
/// on a stage's output.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum AuxHeadConfig {
    /// Mean over the sequence's tokens (of a sequence), then one linear layer to the classes.
    #[default]
    Linear,
    /// Mean over the tokens, a hidden layer with ReLU, then a linear layer to the classes.
    Mlp {
        /// Width of the hidden layer.
        #[schemars(range(min = 1, max = 65536))]
        hidden: usize,
    },
}

impl AuxHeadConfig {
    /// Checks values serde cannot; the message names the field.
    pub fn validate(&self) -> Result<(), Invalid> {
        match *self {
            Self::Mlp { hidden } if !(1..=65_536).contains(&hidden) => {
                Err(Invalid::at("aux_head.hidden", format!("`aux_head.hidden` must be in [1, 65536], got {hidden}")))
            }
            _ => Ok(()),
        }
    }

    /// For run names: `linear`, `mlp64`.
    pub fn label(&self) -> String {
        match self {
            Self::Linear => "linear".into(),
            Self::Mlp { hidden } => format!("mlp{hidden}"),
        }
    }

    /// A head from `features` input features (per token, or per sample) to `classes` logits.
    pub fn init<B: Backend>(&self, features: usize, classes: usize, device: &B::Device) -> Classifier<B> {
        let head = |d_in: usize| {
            Block::Head(HeadBlock {
                dropout: DropoutConfig::new(0.0).init(),
                output: LinearConfig::new(d_in, classes).init(device),
            })
        };
        Classifier::from_blocks(match *self {
            Self::Linear => vec![head(features)],
            Self::Mlp { hidden } => {
                vec![
                    Block::Dense(DenseBlock { linear: LinearConfig::new(features, hidden).init(device) }),
                    head(hidden),
                ]
            }
        })
    }
}
