//! The Transformer: token + learned position embedding → encoder layers with a padding mask →
//! masked mean → linear.

use burn::nn::transformer::{TransformerEncoderConfig, TransformerEncoderLayer};
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::shared::{dropouts, embedding, head, InputSpec};
use crate::blocks::{Block, EncoderBlock};
use crate::{positive, Invalid};

/// Token + learned position embedding → encoder layers with a padding mask → masked mean → linear.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TransformerConfig {
    /// Width of the embeddings and of every layer (a multiple of `heads`).
    #[schemars(range(min = 1))]
    pub d_model: usize,
    /// Attention heads per layer.
    #[schemars(range(min = 1))]
    pub heads: usize,
    /// Encoder layers (each a block model parallelism can cut after).
    #[schemars(range(min = 1))]
    pub layers: usize,
    /// Width of each layer's feed-forward part.
    #[schemars(range(min = 1))]
    pub d_ff: usize,
    /// Dropout on the embedded tokens and positions.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub embedding_dropout: f64,
    /// Dropout inside each layer (attention and feed-forward) and before the output layer.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub dropout: f64,
    /// Pre-norm (`true`) or post-norm (`false`, the original Transformer) layers.
    pub norm_first: bool,
    /// Tandem's encoder-layer forward, linear layers on rows, and its embedding lookup (`true`),
    /// or Burn's own. Same parameters either way, and the same results without dropout; Burn's
    /// layers draw their dropout masks from the backend's generator, not the worker's stream.
    pub fused: bool,
}

impl Default for TransformerConfig {
    fn default() -> Self {
        Self {
            d_model: 128,
            heads: 4,
            layers: 2,
            d_ff: 256,
            embedding_dropout: 0.1,
            dropout: 0.1,
            norm_first: true,
            fused: true,
        }
    }
}

impl TransformerConfig {
    /// Checks the hyper-parameters; the message names the offending field.
    pub(crate) fn validate(&self) -> Result<(), Invalid> {
        positive("d_model", self.d_model)?;
        positive("heads", self.heads)?;
        positive("layers", self.layers)?;
        positive("d_ff", self.d_ff)?;
        if !self.d_model.is_multiple_of(self.heads) {
            let message = format!("`d_model` ({}) must be divisible by `heads` ({})", self.d_model, self.heads);
            return Err(Invalid::at("d_model", message));
        }
        dropouts(self.embedding_dropout, self.dropout)
    }

    /// The block sequence: embedding with positions, one encoder block per layer, head.
    pub(crate) fn blocks<B: Backend>(&self, input: &InputSpec, device: &B::Device) -> Vec<Block<B>> {
        let layer_config = TransformerEncoderConfig::new(self.d_model, self.d_ff, self.heads, self.layers)
            .with_dropout(self.dropout)
            .with_norm_first(self.norm_first);
        let mut blocks = vec![embedding(input, self.d_model, true, self.embedding_dropout, self.fused, device)];
        blocks.extend((0..self.layers).map(|_| {
            Block::Encoder(EncoderBlock {
                layer: TransformerEncoderLayer::new(&layer_config, device),
                fused: self.fused,
            })
        }));
        blocks.push(head(input, self.d_model, self.dropout, device));
        blocks
    }
}
