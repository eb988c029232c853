//! The memory estimate counts the parameters `init` builds.

use burn::backend::NdArray;
use tandem_experiment::memory::parameter_count;
use tandem_models::{CnnConfig, InputSpec, ModelConfig, RecurrentConfig, TransformerConfig};

#[test]
fn the_parameter_estimate_is_the_built_models_count() {
    let input = InputSpec { vocab_size: 50, max_len: 12, num_classes: 4 };
    let recurrent = RecurrentConfig { embedding_dim: 8, hidden: 6, layers: 2, ..Default::default() };
    let configs = [
        ModelConfig::Cnn(CnnConfig {
            embedding_dim: 8,
            filters: 5,
            kernel_widths: vec![2, 3, 5],
            ..Default::default()
        }),
        ModelConfig::Lstm(recurrent.clone()),
        ModelConfig::Lstm(RecurrentConfig { bidirectional: true, ..recurrent.clone() }),
        ModelConfig::Gru(recurrent.clone()),
        ModelConfig::Gru(RecurrentConfig { bidirectional: true, layers: 3, ..recurrent }),
        ModelConfig::Transformer(TransformerConfig { d_model: 8, heads: 2, layers: 2, d_ff: 16, ..Default::default() }),
    ];
    for config in configs {
        let built = config.init::<NdArray>(&input, &Default::default()).parameter_count();
        assert_eq!(parameter_count(&config, &input), built as u128, "{config:?}");
    }
}
