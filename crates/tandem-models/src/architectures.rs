//! Serializable model configurations (the `[[models]]` entries of a manifest).

use burn::module::Module;
use burn::nn::conv::Conv1dConfig;
use burn::nn::gru::{BiGruConfig, GruConfig};
use burn::nn::lstm::{BiLstmConfig, LstmConfig};
use burn::nn::transformer::{TransformerEncoderConfig, TransformerEncoderLayer};
use burn::nn::{DropoutConfig, EmbeddingConfig, Initializer, LinearConfig};
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::blocks::{Block, ConvPoolBlock, EmbeddingBlock, EncoderBlock, HeadBlock, RecurrentBlock, Rnn};
use crate::Classifier;

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
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "architecture", rename_all = "kebab-case")]
pub enum ModelConfig {
    Cnn(CnnConfig),
    Lstm(RecurrentConfig),
    Gru(RecurrentConfig),
    Transformer(TransformerConfig),
}

/// Embedding → Conv1d of several widths → ReLU → max over time → dropout → linear.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CnnConfig {
    pub embedding_dim: usize,
    /// Filters per kernel width.
    pub filters: usize,
    pub kernel_widths: Vec<usize>,
    pub embedding_dropout: f64,
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

/// Embedding → stacked LSTM / GRU layers → masked mean pooling → dropout → linear.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RecurrentConfig {
    pub embedding_dim: usize,
    pub hidden: usize,
    pub layers: usize,
    pub bidirectional: bool,
    pub embedding_dropout: f64,
    /// Dropout after each recurrent layer and before the output layer.
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

/// Token + learned position embedding → encoder layers with a padding mask → masked mean → linear.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TransformerConfig {
    pub d_model: usize,
    pub heads: usize,
    pub layers: usize,
    pub d_ff: usize,
    pub embedding_dropout: f64,
    pub dropout: f64,
    /// Pre-norm (`true`) or post-norm (`false`, the original Transformer) layers.
    pub norm_first: bool,
    /// Tandem's encoder-layer forward, linear layers on rows, and its embedding lookup (`true`),
    /// or Burn's own. Same parameters and results either way; only the speed differs.
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

/// What the data fixes about a model: vocabulary, sequence length, classes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputSpec {
    pub vocab_size: usize,
    pub max_len: usize,
    pub num_classes: usize,
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

    /// Checks the hyper-parameters against the input; the message names the offending field.
    pub fn validate(&self, input: &InputSpec) -> Result<(), String> {
        let positive = |name: &str, v: usize| if v == 0 { Err(format!("`{name}` must be at least 1")) } else { Ok(()) };
        let dropout = |name: &str, p: f64| {
            if (0.0..1.0).contains(&p) {
                Ok(())
            } else {
                Err(format!("`{name}` must be in [0, 1), got {p}"))
            }
        };
        match self {
            Self::Cnn(c) => {
                positive("embedding_dim", c.embedding_dim)?;
                positive("filters", c.filters)?;
                if c.kernel_widths.is_empty() {
                    return Err("`kernel_widths` must list at least one width".into());
                }
                for &w in &c.kernel_widths {
                    positive("kernel_widths", w)?;
                    if w > input.max_len {
                        return Err(format!("kernel width {w} exceeds the sequence length {}", input.max_len));
                    }
                }
                dropout("embedding_dropout", c.embedding_dropout)?;
                dropout("dropout", c.dropout)
            }
            Self::Lstm(c) | Self::Gru(c) => {
                positive("embedding_dim", c.embedding_dim)?;
                positive("hidden", c.hidden)?;
                positive("layers", c.layers)?;
                dropout("embedding_dropout", c.embedding_dropout)?;
                dropout("dropout", c.dropout)
            }
            Self::Transformer(c) => {
                positive("d_model", c.d_model)?;
                positive("heads", c.heads)?;
                positive("layers", c.layers)?;
                positive("d_ff", c.d_ff)?;
                if c.d_model % c.heads != 0 {
                    return Err(format!("`d_model` ({}) must be divisible by `heads` ({})", c.d_model, c.heads));
                }
                dropout("embedding_dropout", c.embedding_dropout)?;
                dropout("dropout", c.dropout)
            }
        }
    }

    /// Builds the model on `device` (parameters drawn from the backend's seeded RNG).
    pub fn init<B: Backend>(&self, input: &InputSpec, device: &B::Device) -> Classifier<B> {
        let embedding = |dim: usize, positions: bool, p: f64, fused: bool| {
            Block::Embedding(EmbeddingBlock {
                tokens: EmbeddingConfig::new(input.vocab_size, dim).init(device),
                // Small learned positions: N(0, 1) positions would drown N(0, 1) word vectors.
                positions: positions.then(|| {
                    EmbeddingConfig::new(input.max_len, dim)
                        .with_initializer(Initializer::Normal { mean: 0.0, std: 0.02 })
                        .init(device)
                }),
                dropout: DropoutConfig::new(p).init(),
                fused,
            })
        };
        let head = |d_in: usize, p: f64| {
            Block::Head(HeadBlock {
                dropout: DropoutConfig::new(p).init(),
                output: LinearConfig::new(d_in, input.num_classes).init(device),
            })
        };
        let blocks = match self {
            Self::Cnn(c) => vec![
                embedding(c.embedding_dim, false, c.embedding_dropout, c.fused),
                Block::ConvPool(ConvPoolBlock {
                    convs: c
                        .kernel_widths
                        .iter()
                        .map(|&w| Conv1dConfig::new(c.embedding_dim, c.filters, w).init(device))
                        .collect(),
                    fused: c.fused,
                }),
                head(c.filters * c.kernel_widths.len(), c.dropout),
            ],
            Self::Lstm(c) | Self::Gru(c) => {
                let lstm = matches!(self, Self::Lstm(_));
                let directions = if c.bidirectional { 2 } else { 1 };
                let mut blocks = vec![embedding(c.embedding_dim, false, c.embedding_dropout, c.fused)];
                for layer in 0..c.layers {
                    let d_in = if layer == 0 { c.embedding_dim } else { c.hidden * directions };
                    let rnn = match (lstm, c.bidirectional) {
                        (true, false) => Rnn::Lstm(LstmConfig::new(d_in, c.hidden, true).init(device)),
                        (true, true) => Rnn::BiLstm(BiLstmConfig::new(d_in, c.hidden, true).init(device)),
                        (false, false) => Rnn::Gru(GruConfig::new(d_in, c.hidden, true).init(device)),
                        (false, true) => Rnn::BiGru(BiGruConfig::new(d_in, c.hidden, true).init(device)),
                    };
                    blocks.push(Block::Recurrent(RecurrentBlock {
                        rnn,
                        fused: c.fused,
                        dropout: DropoutConfig::new(c.dropout).init(),
                    }));
                }
                blocks.push(head(c.hidden * directions, c.dropout));
                blocks
            }
            Self::Transformer(c) => {
                let layer_config = TransformerEncoderConfig::new(c.d_model, c.d_ff, c.heads, c.layers)
                    .with_dropout(c.dropout)
                    .with_norm_first(c.norm_first);
                let mut blocks = vec![embedding(c.d_model, true, c.embedding_dropout, c.fused)];
                blocks.extend((0..c.layers).map(|_| {
                    Block::Encoder(EncoderBlock {
                        layer: TransformerEncoderLayer::new(&layer_config, device),
                        fused: c.fused,
                    })
                }));
                blocks.push(head(c.d_model, c.dropout));
                blocks
            }
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
