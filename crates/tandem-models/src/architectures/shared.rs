//! What every architecture is built from: the input the data fixes, the two blocks it shapes (the
//! embedding and the head), and the hyper-parameter checks.

use burn::nn::{DropoutConfig, EmbeddingConfig, Initializer, LinearConfig};
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::blocks::{Block, EmbeddingBlock, HeadBlock};
use crate::Invalid;

/// What the data fixes about a model: vocabulary, sequence length, classes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputSpec {
    pub vocab_size: usize,
    pub max_len: usize,
    pub num_classes: usize,
}

/// The token embedding of width `dim`, with learned positions when `positions`, dropout `p`.
pub(crate) fn embedding<B: Backend>(
    input: &InputSpec,
    dim: usize,
    positions: bool,
    p: f64,
    fused: bool,
    device: &B::Device,
) -> Block<B> {
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
}

/// The head from `d_in` features to the class logits, dropout `p` before it.
pub(crate) fn head<B: Backend>(input: &InputSpec, d_in: usize, p: f64, device: &B::Device) -> Block<B> {
    Block::Head(HeadBlock {
        dropout: DropoutConfig::new(p).init(),
        output: LinearConfig::new(d_in, input.num_classes).init(device),
    })
}

/// The two dropout probabilities every architecture has, `embedding_dropout` and `dropout`: each in
/// [0, 1).
pub(crate) fn dropouts(embedding_dropout: f64, dropout: f64) -> Result<(), Invalid> {
    for (name, p) in [("embedding_dropout", embedding_dropout), ("dropout", dropout)] {
        if !(0.0..1.0).contains(&p) {
            return Err(Invalid::at(name, format!("`{name}` must be in [0, 1), got {p}")));
        }
    }
    Ok(())
}
