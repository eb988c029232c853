//! The GPU backends (wgpu, cuda) compute what the ndarray reference computes, and every
//! strategy runs on them end to end.
//!
//! Runs on each GPU backend compiled into the test (`--features wgpu`, `cuda`; ndarray is the reference). A backend whose
//! device cannot start here is skipped with a message, unless `TANDEM_REQUIRE_BACKENDS` names it
//! (e.g. `wgpu`: CI runs wgpu on lavapipe, Mesa's CPU Vulkan driver, and must not skip it).
#![cfg(all(feature = "ndarray", any(feature = "wgpu", feature = "cuda")))]

mod common;

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Int, Tensor, TensorData};
use tandem_experiment::backend::probe_device;
use tandem_experiment::BackendKind;
use tandem_models::{Classifier, CnnConfig, InputSpec, ModelConfig, RecurrentConfig, TransformerConfig};
use tandem_parallel::{DataParallel, DataParallelConfig, ModelParallel, ModelParallelConfig, Schedule};
use tandem_testing::{exact_train_config, initial_model, one_epoch, relative_difference, toy_data, toy_models};
use tandem_train::{Sequential, Strategy};

type Reference = Autodiff<NdArray>;

/// The backends' seeded RNGs are process-global: tests that seed them must not interleave.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

const INPUT: InputSpec = InputSpec { vocab_size: 60, max_len: 12, num_classes: 4 };

/// Each architecture at a small size, dropout off (dropout masks differ between backends).
fn configs() -> Vec<ModelConfig> {
    let recurrent = RecurrentConfig {
        embedding_dim: 8,
        hidden: 6,
        layers: 2,
        embedding_dropout: 0.0,
        dropout: 0.0,
        ..Default::default()
    };
    vec![
        ModelConfig::Cnn(CnnConfig {
            embedding_dim: 8,
            filters: 5,
            kernel_widths: vec![2, 3],
            embedding_dropout: 0.0,
            dropout: 0.0,
            ..Default::default()
        }),
        ModelConfig::Lstm(recurrent.clone()),
        ModelConfig::Gru(recurrent),
        ModelConfig::Transformer(TransformerConfig {
            d_model: 8,
            heads: 2,
            layers: 2,
            d_ff: 16,
            embedding_dropout: 0.0,
            dropout: 0.0,
            ..Default::default()
        }),
    ]
}

/// The GPU backends to test: those compiled in whose device starts, or that must be tested.
fn backends_to_test() -> Vec<BackendKind> {
    let required = std::env::var("TANDEM_REQUIRE_BACKENDS").unwrap_or_default();
    let mut out = Vec::new();
    let mut consider = |kind: BackendKind, started: Result<(), String>| match started {
        Ok(()) => out.push(kind),
        Err(e) if required.split(',').any(|r| r.trim() == kind.name()) => panic!("{kind} is required here: {e}"),
        Err(e) => eprintln!("skipped {kind}: {e}"),
    };
    #[cfg(feature = "wgpu")]
    consider(
        BackendKind::Wgpu,
        probe_device::<burn::backend::Wgpu>("wgpu:0", &tandem_experiment::backend::wgpu_device(0)),
    );
    #[cfg(feature = "cuda")]
    consider(
        BackendKind::Cuda,
        probe_device::<burn::backend::Cuda>("cuda:0", &burn::backend::cuda::CudaDevice::new(0)),
    );
    out
}

/// Runs `$check::<Autodiff<GPU backend>>(name, device 0)` on each backend of [`backends_to_test`].
macro_rules! on_each_gpu_backend {
    ($check:ident) => {
        for backend in backends_to_test() {
            match backend {
                #[cfg(feature = "wgpu")]
                BackendKind::Wgpu => {
                    $check::<Autodiff<burn::backend::Wgpu>>("wgpu", tandem_experiment::backend::wgpu_device(0))
                }
                #[cfg(feature = "cuda")]
                BackendKind::Cuda => {
                    $check::<Autodiff<burn::backend::Cuda>>("cuda", burn::backend::cuda::CudaDevice::new(0))
                }
                _ => unreachable!("only GPU backends are tested here"),
            }
        }
    };
}

/// Sequences with 12, 7 and 1 real tokens.
fn batch<B: Backend>(device: &B::Device) -> (Tensor<B, 2, Int>, Tensor<B, 2, Bool>) {
    let mut ids = Vec::new();
    let mut pad = Vec::new();
    for (row, len) in [12usize, 7, 1].into_iter().enumerate() {
        for pos in 0..INPUT.max_len {
            ids.push(if pos < len { ((row * 13 + pos * 7) % 58 + 2) as i64 } else { 0 });
            pad.push(pos >= len);
        }
    }
    (
        Tensor::from_data(TensorData::new(ids, [3, INPUT.max_len]), device),
        Tensor::from_data(TensorData::new(pad, [3, INPUT.max_len]), device),
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
fn logits_and_gradients<B: AutodiffBackend>(model: &Classifier<B>, device: &B::Device) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (tokens, mask) = batch::<B>(device);
    let logits = model.forward(tokens, &mask);
    let weights: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
    let weights = Tensor::<B, 2>::from_data(TensorData::new(weights, [3, 4]), device);
    let grads = (logits.clone() * weights).sum().backward();
    let mut collect = CollectGradients::<B>(&grads, Vec::new());
    model.visit(&mut collect);
    (logits.into_data().convert::<f32>().iter::<f32>().collect(), collect.1)
}

/// Largest difference relative to the largest reference value (at least 1).
fn largest_relative_difference(reference: &[f32], got: &[f32]) -> f32 {
    assert_eq!(reference.len(), got.len());
    let scale = reference.iter().fold(1f32, |m, v| m.max(v.abs()));
    reference.iter().zip(got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max) / scale
}

/// Builds each architecture on ndarray, copies its parameters to `B`, and compares logits and
/// every gradient (relative difference ≤ 1e-4; on CUDA ≤ 2e-3, whose f32 matrix products round
/// more coarsely: on an NVIDIA H200 the largest difference over the four architectures was
/// 7.1e-4, as TensorFloat-32 products would give); the recurrent layers run as one autodiff node
/// on both.
fn agrees_with_ndarray<B: AutodiffBackend>(name: &str, device: B::Device) {
    assert!(
        tandem_models::FastPath::Recurrence.active_on::<B>(),
        "{name}: the recurrent layers fall back to ordinary operations (is tandem-models' `{name}` feature on?)"
    );
    let reference_device = Default::default();
    let tolerance = if name == "cuda" { 2e-3 } else { 1e-4 };
    // Every comparison is made and printed before the test fails, so one run shows them all.
    let mut beyond = Vec::new();
    for config in configs() {
        let reference: Classifier<Reference> = config.init(&INPUT, &reference_device);
        let model: Classifier<B> = config.init(&INPUT, &device).with_parameters_of(&reference);
        let (expected_logits, expected_grads) = logits_and_gradients(&reference, &reference_device);
        let (logits, grads) = logits_and_gradients(&model, &device);
        let arch = config.architecture().name();
        let mut check = |what: String, d: f32| {
            eprintln!("{name} {arch}: {what} within {d:e} (relative) of ndarray");
            if d > tolerance {
                beyond.push(format!("{name} {arch}: {what} differ from ndarray by {d:e} (relative)"));
            }
        };
        check("logits".into(), largest_relative_difference(&expected_logits, &logits));
        assert_eq!(expected_grads.len(), grads.len());
        for (i, (e, g)) in expected_grads.iter().zip(&grads).enumerate() {
            assert!(
                e.iter().any(|v| *v != 0.0),
                "{arch}: parameter {i} has a zero gradient, the test would prove nothing"
            );
            check(format!("gradient of parameter {i}"), largest_relative_difference(e, g));
        }
    }
    assert!(beyond.is_empty(), "{}", beyond.join("\n"));
}

#[test]
fn every_architecture_agrees_with_ndarray_in_logits_and_every_gradient() {
    let _serial = serial();
    on_each_gpu_backend!(agrees_with_ndarray);
}

/// One epoch of sequential training, data parallel (2 replicas, row-sparse embedding exchange)
/// and model parallel (2 stages, 1F1B) on one device of `B` end with the same parameters.
/// (Replicas and stages run on threads of their own: this is what caught CubeCL's per-thread
/// streams, see `one_stream_per_device`.)
fn strategies_agree_on<B: AutodiffBackend>(name: &str, device: B::Device) {
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    for config in toy_models() {
        let arch = config.architecture().name();
        let mut sequential = Sequential::new(initial_model::<B>(&config, vocab_size), &train, device.clone());
        one_epoch(&mut sequential, &data, &train);
        let expected = sequential.model().parameter_values();
        let dp = DataParallelConfig { replicas: 2, sparse_embedding: true, ..Default::default() };
        let mut data_parallel =
            DataParallel::new(initial_model::<B>(&config, vocab_size), &train, &dp, vec![device.clone(); 2]).unwrap();
        let mp =
            ModelParallelConfig { stages: 2, schedule: Schedule::ONE_F_ONE_B, micro_batches: 3, ..Default::default() };
        let mut model_parallel =
            ModelParallel::new(initial_model::<B>(&config, vocab_size), &train, &mp, vec![device.clone(); 2], &data)
                .unwrap();
        for (strategy, parallel) in
            [("data parallel", &mut data_parallel as &mut dyn Strategy<B>), ("model parallel", &mut model_parallel)]
        {
            one_epoch(parallel, &data, &train);
            let d = relative_difference(&parallel.model().parameter_values(), &expected);
            assert!(d <= 1e-5, "{name} {arch}: {strategy} ends {d:e} (relative) away from sequential");
        }
        eprintln!("{name} {arch}: data parallel and model parallel match sequential");
    }
}

#[test]
fn data_and_model_parallel_on_one_gpu_match_sequential_on_it() {
    let _serial = serial();
    on_each_gpu_backend!(strategies_agree_on);
}

#[test]
fn every_strategy_runs_end_to_end_with_replicas_and_stages_sharing_one_gpu() {
    let _serial = serial();
    let Some(data) = common::data_dir() else { return };
    for backend in backends_to_test() {
        let device = format!("{backend}:0");
        let (out, result) = common::run_tiny(&data, backend, &[&device, &device]);
        let summaries = result.unwrap();
        common::check_results(out.path(), &summaries, backend);
        for s in &summaries {
            assert_eq!(s.shared_devices, !s.strategy.starts_with("sequential"), "{}", s.run_id);
        }
    }
}

#[test]
fn a_device_that_does_not_exist_fails_the_run_with_its_name() {
    let _serial = serial();
    let Some(data) = common::data_dir() else { return };
    for backend in backends_to_test() {
        let missing = format!("{backend}:7");
        let (out, result) = common::run_tiny(&data, backend, &[&missing]);
        let err = result.unwrap_err();
        assert!(err.to_string().contains("6 of 6 runs failed"), "{err}");
        let summary: tandem_experiment::RunSummary = serde_json::from_str(
            &std::fs::read_to_string(out.path().join("tiny/gru-sequential-seed1/summary.json")).unwrap(),
        )
        .unwrap();
        let why = summary.error.unwrap();
        assert!(why.contains(&format!("device `{missing}` does not exist or cannot start")), "{why}");
    }
}
