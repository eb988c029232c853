//! The fused forward passes compute what Burn's stock modules compute: same logits, same
//! gradient for every parameter, on both CPU backends (the recurrent layers' hand-written
//! backward runs on each backend's autodiff) and on one whose recurrent layers fall back to
//! ordinary operations, and the same logits without autodiff (inference).

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Int, Tensor, TensorData};
use tandem_models::{Classifier, CnnConfig, InputSpec, ModelConfig, RecurrentConfig, TransformerConfig};
use tandem_ops::{FastPath, Which};

const INPUT: InputSpec = InputSpec { vocab_size: 50, max_len: 12, num_classes: 4 };

/// The backends' seeded RNG is process-global: the dropout test seeds it, and the other tests
/// draw initial parameters from it, so they take turns.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// Each fusable shape, built stock (`fused = false`).
fn stock_configs() -> Vec<ModelConfig> {
    let recurrent = |layers, bidirectional| RecurrentConfig {
        embedding_dim: 8,
        hidden: 6,
        layers,
        bidirectional,
        dropout: 0.0,
        fused: false,
        ..Default::default()
    };
    let transformer = |norm_first| TransformerConfig {
        d_model: 8,
        heads: 2,
        layers: 2,
        d_ff: 12,
        embedding_dropout: 0.0,
        dropout: 0.0,
        norm_first,
        fused: false,
    };
    vec![
        ModelConfig::Cnn(CnnConfig {
            embedding_dim: 8,
            filters: 5,
            kernel_widths: vec![2, 3, 5],
            dropout: 0.0,
            fused: false,
            ..Default::default()
        }),
        ModelConfig::Cnn(CnnConfig {
            embedding_dim: 8,
            filters: 4,
            kernel_widths: vec![3],
            dropout: 0.0,
            fused: false,
            ..Default::default()
        }),
        ModelConfig::Lstm(recurrent(2, false)),
        ModelConfig::Lstm(recurrent(1, true)),
        ModelConfig::Gru(recurrent(2, false)),
        ModelConfig::Gru(recurrent(1, true)),
        ModelConfig::Transformer(transformer(true)),
        ModelConfig::Transformer(transformer(false)),
    ]
}

/// Sequences with 12, 7 and 1 real tokens (padding zeroed by the embedding block).
fn batch<B: Backend>() -> (Tensor<B, 2, Int>, Tensor<B, 2, Bool>) {
    let device = Default::default();
    let mut ids = Vec::new();
    let mut pad = Vec::new();
    for (row, len) in [12usize, 7, 1].into_iter().enumerate() {
        for pos in 0..INPUT.max_len {
            ids.push(if pos < len { ((row * 13 + pos * 7) % 48 + 2) as i64 } else { 0 });
            pad.push(pos >= len);
        }
    }
    (
        Tensor::from_data(TensorData::new(ids, [3, INPUT.max_len]), &device),
        Tensor::from_data(TensorData::new(pad, [3, INPUT.max_len]), &device),
    )
}

/// Every parameter's gradient, in visiting order.
struct CollectGradients<'a, B: AutodiffBackend>(&'a B::Gradients, Vec<Vec<f32>>);

impl<B: AutodiffBackend> ModuleVisitor<B> for CollectGradients<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let grad = param.val().grad(self.0).expect("every parameter takes part in the loss");
        self.1.push(grad.into_data().convert::<f32>().iter::<f32>().collect());
    }
}

/// Logits and every parameter's gradient of a fixed weighted sum of the logits.
fn logits_and_gradients<B: AutodiffBackend>(model: &Classifier<B>) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (tokens, mask) = batch();
    let logits = model.forward(tokens, &mask);
    let weights = Tensor::<B, 2>::from_data(
        TensorData::new((0..12).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<_>>(), [3, 4]),
        &Default::default(),
    );
    let grads = (logits.clone() * weights).sum().backward();
    let mut collect = CollectGradients(&grads, Vec::new());
    model.visit(&mut collect);
    (logits.into_data().convert::<f32>().iter::<f32>().collect(), collect.1)
}

/// Equal within f32 rounding: 2e-4 of the largest value (at least 1). The recurrent layers' one-node
/// path computes sigmoid and tanh from a polynomial `exp` on the CPU backends, which rounds
/// differently from Burn's own (CI once saw a gradient differ by 3e-5 relative with `exp`-based ones),
/// and the Transformer's one-node softmax and layer norm, through two layers, have left gradients
/// 1.3e-4 apart on ndarray.
fn assert_close(what: &str, expected: &[f32], got: &[f32]) {
    assert_eq!(expected.len(), got.len(), "{what}: lengths differ");
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let worst = expected.iter().zip(got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 2e-4 * scale.max(1.0), "{what}: largest difference {worst:e} (largest value {scale:e})");
}

/// Logits without autodiff.
fn inference_logits<B: AutodiffBackend>(model: &Classifier<B>) -> Vec<f32> {
    let (tokens, mask) = batch();
    model.valid().forward(tokens, &mask).into_data().convert::<f32>().iter::<f32>().collect()
}

fn fused_matches_stock<B: AutodiffBackend>(one_node: bool) {
    let _serial = serial();
    assert_eq!(FastPath::Recurrence.active_on::<B>(), one_node, "{}", std::any::type_name::<B>());
    assert_eq!(FastPath::ConvMax.active_on::<B>(), one_node, "{}", std::any::type_name::<B>());
    assert_eq!(FastPath::Softmax.active_on::<B>(), one_node, "{}", std::any::type_name::<B>());
    let flex = Which::of::<B>() == Which::AutodiffFlex;
    assert_eq!(FastPath::Gelu.active_on::<B>(), flex, "{}: GELU's own node is Flex's only", std::any::type_name::<B>());
    let device = Default::default();
    // Seeded: the comparison runs on the same parameters every time.
    B::seed(&device, 11);
    for stock_config in stock_configs() {
        let stock: Classifier<B> = stock_config.init(&INPUT, &device);
        let fused: Classifier<B> = stock_config.with_fused(true).init(&INPUT, &device).with_parameters_of(&stock);
        assert_eq!(stock.parameter_values(), fused.parameter_values(), "same parameters");
        let (stock_logits, stock_grads) = logits_and_gradients(&stock);
        let (fused_logits, fused_grads) = logits_and_gradients(&fused);
        let name = format!("{} {stock_config:?}", std::any::type_name::<B>());
        assert_close(&format!("{name} inference logits"), &inference_logits(&stock), &inference_logits(&fused));
        assert_close(&format!("{name} logits"), &stock_logits, &fused_logits);
        assert_eq!(stock_grads.len(), fused_grads.len());
        for (i, (s, f)) in stock_grads.iter().zip(&fused_grads).enumerate() {
            assert!(
                s.iter().any(|v| *v != 0.0),
                "{name}: parameter {i} has a zero gradient, the test would prove nothing"
            );
            assert_close(&format!("{name} gradient of parameter {i}"), s, f);
        }
    }
}

#[test]
fn fused_forward_passes_match_the_stock_modules_in_logits_and_every_gradient_on_ndarray() {
    fused_matches_stock::<Autodiff<NdArray>>(true);
}

#[test]
fn fused_forward_passes_match_the_stock_modules_in_logits_and_every_gradient_on_flex() {
    fused_matches_stock::<Autodiff<Flex>>(true);
}

#[test]
fn fused_forward_passes_match_the_stock_modules_where_the_recurrence_is_ordinary_operations() {
    fused_matches_stock::<Autodiff<NdArray<f64>>>(false);
}

#[test]
fn the_fused_encoder_layer_draws_its_dropouts_from_the_workers_stream() {
    type B = Autodiff<NdArray>;
    let _serial = serial();
    let device = Default::default();
    for norm_first in [true, false] {
        let config = ModelConfig::Transformer(TransformerConfig {
            d_model: 8,
            heads: 2,
            layers: 2,
            d_ff: 12,
            embedding_dropout: 0.0,
            dropout: 0.3,
            norm_first,
            fused: true,
        });
        let fused: Classifier<B> = config.init(&INPUT, &device);
        // The backend's generator is reseeded differently each time: the masks do not come from it.
        let logits = |step: usize, backend_seed: u64| {
            B::seed(&device, backend_seed);
            tandem_ops::dropout::begin_step(11, 0, step);
            let (tokens, mask) = batch::<B>();
            fused.forward(tokens, &mask).into_data().convert::<f32>().iter::<f32>().collect::<Vec<_>>()
        };
        let what = format!("norm_first = {norm_first}");
        assert_eq!(logits(3, 1), logits(3, 2), "{what}: one step of one worker draws the same masks");
        assert_ne!(logits(3, 1), logits(4, 1), "{what}: another step draws other masks");
        assert_ne!(logits(3, 1), inference_logits(&fused), "{what}: dropout changes the logits in training");
    }
}
