//! The block count a config announces is the one `init` builds.

use burn::backend::NdArray;
use tandem_models::{CnnConfig, InputSpec, ModelConfig, RecurrentConfig, TransformerConfig};

#[test]
fn num_blocks_matches_the_built_model() {
    let input = InputSpec { vocab_size: 30, max_len: 8, num_classes: 4 };
    let configs = [
        ModelConfig::Cnn(CnnConfig { embedding_dim: 4, filters: 3, ..Default::default() }),
        ModelConfig::Lstm(RecurrentConfig { embedding_dim: 4, hidden: 3, layers: 3, ..Default::default() }),
        ModelConfig::Gru(RecurrentConfig { embedding_dim: 4, hidden: 3, layers: 1, ..Default::default() }),
        ModelConfig::Transformer(TransformerConfig { d_model: 4, heads: 2, layers: 2, d_ff: 8, ..Default::default() }),
    ];
    for config in configs {
        let built = config.init::<NdArray>(&input, &Default::default()).num_blocks();
        assert_eq!(config.num_blocks(), built, "{config:?}");
    }
}
