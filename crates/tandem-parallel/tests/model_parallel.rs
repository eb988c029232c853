//! Model parallelism must compute what one device computes, whatever the cut and schedule.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, NdArray};
use tandem_models::{Architecture, Classifier, ModelConfig};
use tandem_parallel::link::{link, Interconnect};
use tandem_parallel::{Balance, ModelParallel, ModelParallelConfig, Schedule};
use tandem_testing::{
    epoch_plan, exact_train_config, initial_model, one_epoch, relative_difference, toy_data, toy_model, toy_models,
    train_toy,
};
use tandem_train::{Sequential, Strategy, TrainConfig};

type B = Autodiff<NdArray>;

/// The backend's seeded RNG is process-global: tests that seed it must not interleave.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

fn mp_config(cuts: Vec<usize>, schedule: Schedule, micro_batches: usize) -> ModelParallelConfig {
    ModelParallelConfig { stages: cuts.len() + 1, cuts: Some(cuts), schedule, micro_batches, ..Default::default() }
}

/// All stages on the CPU device.
fn model_parallel(model: Classifier<B>, config: &ModelParallelConfig, train: &TrainConfig) -> ModelParallel<B> {
    let (data, _, _) = toy_data();
    ModelParallel::new(model, train, config, vec![Default::default(); config.stages], &data).unwrap()
}

#[test]
fn every_schedule_and_cut_matches_sequential_for_every_architecture() {
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    for config in toy_models() {
        let mut sequential = Sequential::new(initial_model::<B>(&config, vocab_size), &train, Default::default());
        let expected = one_epoch(&mut sequential, &data, &train);
        let reference = sequential.model().parameter_values();
        let blocks = initial_model::<B>(&config, vocab_size).num_blocks();
        let name = config.architecture().name();
        let cuts: Vec<Vec<usize>> = (2..=3.min(blocks)).map(|k| (1..k).map(|s| s * blocks / k).collect()).collect();
        for cuts in cuts {
            // 5 micro-batches of a batch of 12 are uneven (3, 3, 2, 2, 2); the last batch of 4 has 4.
            for (schedule, micro) in [(Schedule::NAIVE, 1), (Schedule::GPIPE, 5), (Schedule::ONE_F_ONE_B, 5)] {
                let mut parallel = model_parallel(
                    initial_model(&config, vocab_size),
                    &mp_config(cuts.clone(), schedule, micro),
                    &train,
                );
                let got = one_epoch(&mut parallel, &data, &train);
                let diff = relative_difference(&parallel.model().parameter_values(), &reference);
                assert!(diff <= 1e-5, "{name}, cuts {cuts:?}, {schedule:?}: parameters differ by {diff:e} (relative)");
                assert!(
                    (got.loss() - expected.loss()).abs() <= 1e-5 * expected.loss(),
                    "{name} {schedule:?}: loss {} vs {}",
                    got.loss(),
                    expected.loss()
                );
                assert_eq!(
                    (got.samples, got.steps),
                    (expected.samples, expected.steps),
                    "{name}: every sample once per epoch"
                );
                assert_eq!(
                    (got.tested, got.correct),
                    (expected.tested, expected.correct),
                    "{name} {schedule:?}: test-then-train counts"
                );
            }
        }
    }
}

#[test]
fn links_count_the_bytes_of_every_activation_and_gradient() {
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let cnn = &toy_model(Architecture::Cnn);
    // Cut after the embedding: each sample sends a [10 tokens × 16] f32 sequence forward and its
    // gradient back.
    let mut parallel = model_parallel(initial_model(cnn, vocab_size), &mp_config(vec![1], Schedule::GPIPE, 3), &train);
    let stats = one_epoch(&mut parallel, &data, &train);
    let pipeline = stats.figures.pipeline().unwrap();
    let link = &pipeline.links_per_step[0];
    let per_epoch = |value: f64| value * stats.steps as f64;
    let bytes = (data.len() * 10 * 16 * 4) as f64;
    assert!((per_epoch(link.forward.bytes) - bytes).abs() < 1e-6 * bytes);
    assert!((per_epoch(link.backward.bytes) - bytes).abs() < 1e-6 * bytes);
    // 13 batches of 3 micro-batches and a last one (4 samples) of 3.
    assert!((per_epoch(link.forward.messages) - 42.0).abs() < 1e-9);
    assert!((per_epoch(link.backward.messages) - 42.0).abs() < 1e-9);
    assert_eq!(pipeline.cuts, [1]);
}

#[test]
fn a_simulated_link_delays_each_message_by_its_size_over_the_bandwidth() {
    // 10 MB/s: 1 MB takes 100 ms; a second message queues behind the first.
    let (mut tx, rx) = link::<Vec<u8>>(Interconnect::Custom { latency_us: 0.0, bandwidth_gb_s: 0.01 });
    let stop = AtomicBool::new(false);
    let sent = Instant::now();
    tx.send(vec![0; 10], 1_000_000).unwrap();
    tx.send(vec![0; 10], 1_000_000).unwrap();
    rx.recv(Duration::from_secs(5), &stop).unwrap();
    let first = sent.elapsed().as_secs_f64();
    rx.recv(Duration::from_secs(5), &stop).unwrap();
    let second = sent.elapsed().as_secs_f64();
    assert!((0.08..=0.12).contains(&first), "first message after {first} s, expected 0.1 s");
    assert!((0.16..=0.24).contains(&second), "second message after {second} s, expected 0.2 s");
    assert_eq!(rx.traffic().bytes, 2_000_000);
}

#[test]
fn one_f_one_b_keeps_fewer_activations_than_gpipe_and_bubbles_are_reported() {
    let _serial = serial();
    let (data, holdout, vocab_size) = toy_data();
    let train_cfg = TrainConfig { epochs: 2, ..exact_train_config() };
    let gru = &toy_model(Architecture::Gru);
    let run = |schedule| {
        let mut parallel = model_parallel(initial_model(gru, vocab_size), &mp_config(vec![1], schedule, 4), &train_cfg);
        let records = train_toy(&mut parallel, &train_cfg, &data, &holdout);
        assert_eq!(records.len(), 2);
        assert_eq!(records[1].holdout.confusion.total(), holdout.len() as u64, "every holdout sample evaluated once");
        records[1].figures.pipeline().unwrap().clone()
    };
    let (gpipe, one_f_one_b) = (run(Schedule::GPIPE), run(Schedule::ONE_F_ONE_B));
    assert_eq!(gpipe.peak_live_activations, [4, 4]);
    assert_eq!(one_f_one_b.peak_live_activations, [2, 1]);
    assert_eq!(gpipe.bubble_fraction_theory, 1.0 / 5.0);
    for figures in [&gpipe, &one_f_one_b] {
        for (key, values) in [
            ("bubble_fraction", &figures.bubble_fraction),
            ("compute_seconds", &figures.compute_seconds),
            ("idle_seconds", &figures.idle_seconds),
            ("transfer_seconds", &figures.transfer_seconds),
        ] {
            assert_eq!(values.len(), 2, "{key}");
            assert!(values.iter().all(|v| (0.0..1e4).contains(v)), "{key}: {values:?}");
        }
    }
}

#[test]
fn automatic_balance_picks_legal_cuts_and_bad_settings_are_refused() {
    let _serial = serial();
    let (_, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let transformer = &toy_model(Architecture::Transformer);
    for balance in [Balance::Params, Balance::Time] {
        let config = ModelParallelConfig { stages: 3, balance, ..Default::default() };
        let parallel = model_parallel(initial_model(transformer, vocab_size), &config, &train);
        let cuts = parallel.cuts();
        assert_eq!(cuts.len(), 2, "{balance:?}");
        assert!(cuts[0] >= 1 && cuts[0] < cuts[1], "{balance:?}: {cuts:?}");
    }
    // By parameters, the embedding and the encoder layer (the two heaviest blocks) are split.
    let by_params = model_parallel(
        initial_model(transformer, vocab_size),
        &ModelParallelConfig { balance: Balance::Params, ..Default::default() },
        &train,
    );
    assert_eq!(by_params.cuts(), &[1]);

    let (data, _, _) = toy_data();
    let build = |config: ModelParallelConfig| {
        let devices = vec![Default::default(); config.stages];
        ModelParallel::<B>::new(initial_model(transformer, vocab_size), &train, &config, devices, &data)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(build(ModelParallelConfig { stages: 3, cuts: Some(vec![1]), ..Default::default() }).contains("`cuts`"));
    assert!(build(ModelParallelConfig { stages: 2, cuts: Some(vec![7]), ..Default::default() }).contains("cut point 7"));
    assert!(build(ModelParallelConfig { stages: 9, ..Default::default() }).contains("9 stages"));
    assert!(build(ModelParallelConfig { micro_batches: 0, ..Default::default() }).contains("micro_batches"));
}

#[test]
fn a_failing_stage_stops_the_run_with_its_name_instead_of_hanging() {
    let _serial = serial();
    let (mut data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let config: &ModelConfig = &toy_model(Architecture::Gru);
    let mut parallel =
        model_parallel(initial_model(config, vocab_size), &mp_config(vec![1], Schedule::ONE_F_ONE_B, 4), &train);
    // A token id outside the vocabulary in the third batch: the embedding (stage 0) fails.
    let order: Vec<usize> = (0..data.len()).collect();
    data.tokens[(2 * 12 + 7) * data.max_len] = (vocab_size + 1000) as u32;
    let batches = tandem_data::batches(&order, train.batch_size).map(<[usize]>::to_vec).collect();
    let plan = epoch_plan(batches, &data, 14);
    let started = Instant::now();
    let error = parallel.train_epoch(&plan).expect_err("a stage failed").to_string();
    assert!(error.contains("stage 0 failed at step 3"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(60));
    // The parameters of before the failed epoch are still there, whole.
    let before = initial_model::<B>(config, vocab_size).parameter_values();
    assert_eq!(parallel.model().parameter_values(), before);
}

/// A toy model with two recurrent or encoder layers (four blocks); `None` for the CNN, whose
/// three blocks cannot make two stages on each of two devices.
fn two_layers(config: &ModelConfig) -> Option<ModelConfig> {
    match config.clone() {
        ModelConfig::Cnn(_) => None,
        ModelConfig::Lstm(c) => Some(ModelConfig::Lstm(tandem_models::RecurrentConfig { layers: 2, ..c })),
        ModelConfig::Gru(c) => Some(ModelConfig::Gru(tandem_models::RecurrentConfig { layers: 2, ..c })),
        ModelConfig::Transformer(c) => {
            Some(ModelConfig::Transformer(tandem_models::TransformerConfig { layers: 2, ..c }))
        }
    }
}

#[test]
fn interleaved_one_f_one_b_matches_sequential_for_every_architecture_with_enough_blocks() {
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let configs: Vec<ModelConfig> = toy_models().iter().filter_map(two_layers).collect();
    assert_eq!(configs.len(), 3, "LSTM, GRU and Transformer");
    for config in configs {
        let name = config.architecture().name();
        let mut sequential = Sequential::new(initial_model::<B>(&config, vocab_size), &train, Default::default());
        let expected = one_epoch(&mut sequential, &data, &train);
        let reference = sequential.model().parameter_values();
        // 2 devices × 2 stages each; 4 micro-batches fill whole groups of one per device, 5 do not.
        for (cuts, micro) in [(Some(vec![1, 2, 3]), 4), (Some(vec![1, 2, 3]), 5), (None, 3)] {
            let mp = ModelParallelConfig {
                stages: 2,
                virtual_stages: 2,
                cuts: cuts.clone(),
                balance: Balance::Params,
                schedule: Schedule::INTERLEAVED_1F1B,
                micro_batches: micro,
                ..Default::default()
            };
            let mut parallel = model_parallel(initial_model(&config, vocab_size), &mp, &train);
            assert_eq!(parallel.cuts(), &[1, 2, 3], "{name}: four blocks, four stages");
            let got = one_epoch(&mut parallel, &data, &train);
            let diff = relative_difference(&parallel.model().parameter_values(), &reference);
            assert!(diff <= 1e-5, "{name}, {micro} micro-batches: parameters differ by {diff:e} (relative)");
            assert!(
                (got.loss() - expected.loss()).abs() <= 1e-5 * expected.loss(),
                "{name}: loss {} vs {}",
                got.loss(),
                expected.loss()
            );
            assert_eq!((got.samples, got.steps), (expected.samples, expected.steps), "{name}: every sample once");
            assert_eq!((got.tested, got.correct), (expected.tested, expected.correct), "{name}: test-then-train");
            // Three boundaries, each crossed by every micro-batch once each way.
            assert_eq!(got.figures.pipeline().map(|p| p.links_per_step.len()), Some(3), "{name}");
        }
    }
}

/// A vanilla step policy whose device `slow` sleeps through step `at` (a stage stuck in its work).
struct Stalls {
    slow: bool,
    at: usize,
    steps: usize,
}

impl tandem_parallel::StepPolicy<B> for Stalls {
    fn begin_step(
        &mut self,
        _: &mut [&mut tandem_parallel::Stage<B>],
        _: &tandem_parallel::StepInput,
        _: &tandem_parallel::Peers,
    ) -> Result<tandem_parallel::StepPlan, tandem_parallel::StepError> {
        self.steps += 1;
        if self.slow && self.steps == self.at {
            std::thread::sleep(Duration::from_millis(1500));
        }
        Ok(tandem_parallel::StepPlan::Train { replayed: Vec::new() })
    }
    fn before_update(&mut self, _: &[&mut tandem_parallel::Stage<B>]) {}
    fn after_update(
        &mut self,
        _: &[&mut tandem_parallel::Stage<B>],
        _: Option<f64>,
        _: &tandem_parallel::Peers,
    ) -> Result<(), tandem_parallel::StepError> {
        Ok(())
    }
    fn control_bytes(&self) -> u64 {
        0
    }
    fn state(&self) -> Result<Vec<u8>, tandem_train::StateError> {
        Ok(Vec::new())
    }
    fn restore(&mut self, _: &[u8], _: &burn::backend::ndarray::NdArrayDevice) -> Result<(), tandem_train::StateError> {
        Ok(())
    }
    fn take_epoch_figures(&mut self) -> tandem_results::SyncFigures {
        Default::default()
    }
}

#[test]
fn a_stage_that_stops_making_progress_is_named_alone() {
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let config = ModelParallelConfig { timeout_seconds: 0.5, ..mp_config(vec![1], Schedule::GPIPE, 3) };
    for slow in [0, 1] {
        let policies: Vec<Box<dyn tandem_parallel::StepPolicy<B>>> =
            (0..2).map(|d| Box::new(Stalls { slow: d == slow, at: 3, steps: 0 }) as _).collect();
        let mut parallel = model_parallel(initial_model(&toy_model(Architecture::Gru), vocab_size), &config, &train)
            .with_policies(policies)
            .unwrap();
        let order: Vec<usize> = (0..data.len()).collect();
        let batches = tandem_data::batches(&order, train.batch_size).map(<[usize]>::to_vec).collect();
        let plan = epoch_plan(batches, &data, 14);
        let error = parallel.train_epoch(&plan).expect_err("a stage stalled").to_string();
        // Named by the watchdog, or by the other stage's receive that timed out first.
        let named = error.contains(&format!("stage(s) [{slow}] made no progress"))
            || error.starts_with(&format!("stage {slow} made no progress"));
        assert!(named, "stage {slow} slept: {error}");
    }
}
