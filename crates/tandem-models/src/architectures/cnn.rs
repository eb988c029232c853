//! The CNN: embedding → Conv1d of several widths → ReLU → max over time → dropout → linear.

use burn::nn::conv::Conv1dConfig;
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::shared::{dropouts, embedding, head, InputSpec};
use crate::blocks::{Block, ConvPoolBlock};
use crate::{positive, Invalid};

/// Embedding → Conv1d of several widths → ReLU → max over time → dropout → linear.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CnnConfig {
    /// Width of the token embedding.
    #[schemars(range(min = 1))]
    pub embedding_dim: usize,
    /// Filters per kernel width.
    #[schemars(range(min = 1))]
    pub filters: usize,
    /// Kernel widths in tokens (each at most `max_len`), one convolution each.
    #[schemars(range(min = 1))]
    pub kernel_widths: Vec<usize>,
    /// Dropout on the embedded tokens.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub embedding_dropout: f64,
    /// Dropout before the output layer.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub dropout: f64,
    /// All widths as one im2col matmul and the embedding lookup as one operation (`true`), or
    /// Burn's `Conv1d` forward per width and Burn's lookup. Same parameters and results either
    /// way; only the speed differs.
    pub fused: bool,
}

impl Default for CnnConfig {
    fn default() -> Self {
        Self {
            embedding_dim: 128,
            filters: 100,
            kernel_widths: vec![3, 4, 5],
            embedding_dropout: 0.0,
            dropout: 0.5,
            fused: true,
        }
    }
}

impl CnnConfig {
    /// Checks the hyper-parameters against the input; the message names the offending field.
    pub(crate) fn validate(&self, input: &InputSpec) -> Result<(), Invalid> {
        positive("embedding_dim", self.embedding_dim)?;
        positive("filters", self.filters)?;
        if self.kernel_widths.is_empty() {
            return Err(Invalid::at("kernel_widths", "`kernel_widths` must list at least one width"));
        }
        for &w in &self.kernel_widths {
            positive("kernel_widths", w)?;
            if w > input.max_len {
                return Err(Invalid::rule(format!("kernel width {w} exceeds the sequence length {}", input.max_len)));
            }
        }
        dropouts(self.embedding_dropout, self.dropout)
    }

    /// The block sequence: embedding, one conv-pool block, head.
    pub(crate) fn blocks<B: Backend>(&self, input: &InputSpec, device: &B::Device) -> Vec<Block<B>> {
        vec![
            embedding(input, self.embedding_dim, false, self.embedding_dropout, self.fused, device),
            Block::ConvPool(ConvPoolBlock {
                convs: self
                    .kernel_widths
                    .iter()
                    .map(|&w| Conv1dConfig::new(self.embedding_dim, self.filters, w).init(device))
                    .collect(),
                fused: self.fused,
            }),
            head(input, self.filters * self.kernel_widths.len(), self.dropout, device),
        ]
    }
}
