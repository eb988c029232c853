//! The LSTM and the GRU: embedding → stacked recurrent layers → masked mean pooling → dropout →
//! linear.

use burn::nn::gru::{BiGruConfig, GruConfig};
use burn::nn::lstm::{BiLstmConfig, LstmConfig};
use burn::nn::DropoutConfig;
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::shared::{dropouts, embedding, head, InputSpec};
use crate::blocks::{Block, RecurrentBlock, Rnn};
use crate::{positive, Invalid};

/// Embedding → stacked LSTM / GRU layers → masked mean pooling → dropout → linear.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RecurrentConfig {
    /// Width of the token embedding.
    #[schemars(range(min = 1))]
    pub embedding_dim: usize,
    /// Hidden state size per direction.
    #[schemars(range(min = 1))]
    pub hidden: usize,
    /// Stacked recurrent layers (each a block model parallelism can cut after).
    #[schemars(range(min = 1))]
    pub layers: usize,
    /// A second recurrence reads each sequence backwards; their states are concatenated.
    pub bidirectional: bool,
    /// Dropout on the embedded tokens.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub embedding_dropout: f64,
    /// Dropout after each recurrent layer and before the output layer.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub dropout: f64,
    /// Tandem's fused recurrence, a few large matmuls per step, and its embedding lookup
    /// (`true`), or Burn's LSTM / GRU forward and lookup. Same parameters and results either
    /// way; only the speed differs.
    pub fused: bool,
}

impl Default for RecurrentConfig {
    fn default() -> Self {
        Self {
            embedding_dim: 128,
            hidden: 128,
            layers: 1,
            bidirectional: false,
            embedding_dropout: 0.0,
            dropout: 0.3,
            fused: true,
        }
    }
}

/// The recurrent cell a [`RecurrentConfig`] stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecurrentCell {
    Lstm,
    Gru,
}

impl RecurrentConfig {
    /// Checks the hyper-parameters; the message names the offending field.
    pub(crate) fn validate(&self) -> Result<(), Invalid> {
        positive("embedding_dim", self.embedding_dim)?;
        positive("hidden", self.hidden)?;
        positive("layers", self.layers)?;
        dropouts(self.embedding_dropout, self.dropout)
    }

    /// The block sequence: embedding, one recurrent block of `cell`s per layer, head.
    pub(crate) fn blocks<B: Backend>(
        &self,
        cell: RecurrentCell,
        input: &InputSpec,
        device: &B::Device,
    ) -> Vec<Block<B>> {
        let directions = if self.bidirectional { 2 } else { 1 };
        let mut blocks = vec![embedding(input, self.embedding_dim, false, self.embedding_dropout, self.fused, device)];
        for layer in 0..self.layers {
            let d_in = if layer == 0 { self.embedding_dim } else { self.hidden * directions };
            let rnn = match (cell, self.bidirectional) {
                (RecurrentCell::Lstm, false) => Rnn::Lstm(LstmConfig::new(d_in, self.hidden, true).init(device)),
                (RecurrentCell::Lstm, true) => Rnn::BiLstm(BiLstmConfig::new(d_in, self.hidden, true).init(device)),
                (RecurrentCell::Gru, false) => Rnn::Gru(GruConfig::new(d_in, self.hidden, true).init(device)),
                (RecurrentCell::Gru, true) => Rnn::BiGru(BiGruConfig::new(d_in, self.hidden, true).init(device)),
            };
            blocks.push(Block::Recurrent(RecurrentBlock {
                rnn,
                fused: self.fused,
                dropout: DropoutConfig::new(self.dropout).init(),
            }));
        }
        blocks.push(head(input, self.hidden * directions, self.dropout, device));
        blocks
    }
}
