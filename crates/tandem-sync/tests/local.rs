//! Local learning and compressed boundaries against vanilla model parallelism, and every
//! protocol's state through a checkpoint.

use burn::backend::{Autodiff, NdArray};
use tandem_data::Encoded;
use tandem_models::{Architecture, AuxHeadConfig, ModelConfig};
use tandem_parallel::compression::encoded_size;
use tandem_parallel::{
    shard_ranges, CompressionConfig, Ingredients, ModelParallel, ModelParallelConfig, Schedule, Scheme, StrategyKind,
    LABEL_BYTES,
};
use tandem_sync::{LaterStages, LocalLearningConfig, PredictiveSyncConfig, PredictorConfig, TriggerConfig};
use tandem_testing::{
    exact_train_config, initial_model, one_epoch, relative_difference, toy_data, toy_model, toy_models, TOY_MAX_LEN,
};
use tandem_train::{EpochPlan, Strategy, TrainConfig, TrainStats};

type B = Autodiff<NdArray>;

/// The backend's seeded RNG is process-global: tests that seed it must not interleave.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

fn mp(schedule: Schedule) -> ModelParallelConfig {
    ModelParallelConfig { stages: 2, cuts: Some(vec![1]), schedule, micro_batches: 3, ..Default::default() }
}

fn local(trigger: TriggerConfig, later_stages: LaterStages) -> LocalLearningConfig {
    LocalLearningConfig {
        model_parallel: mp(Schedule::GPIPE),
        trigger,
        aux_head: AuxHeadConfig::Linear,
        aux_weight: 0.0,
        local_every: 1,
        transfer_every: 0,
        later_stages,
    }
}

fn replay() -> LaterStages {
    LaterStages::Replay { buffer_batches: 2, every: 1 }
}

fn vanilla(config: &ModelConfig, mp: &ModelParallelConfig, data: &Encoded, vocab_size: usize) -> ModelParallel<B> {
    let devices = vec![Default::default(); mp.stages];
    ModelParallel::new(initial_model(config, vocab_size), &exact_train_config(), mp, devices, data).unwrap()
}

fn build(config: &ModelConfig, local: &LocalLearningConfig, data: &Encoded, vocab_size: usize) -> Box<dyn Strategy<B>> {
    let devices = vec![Default::default(); local.model_parallel.stages];
    let train = exact_train_config();
    let model = initial_model(config, vocab_size);
    local.build::<B>(Ingredients { model, train: &train, devices, data, ranks: None }).unwrap()
}

/// A toy model with two recurrent layers (four blocks: room for two stages on each of two devices).
fn two_layer_lstm() -> ModelConfig {
    match toy_model(Architecture::Lstm) {
        ModelConfig::Lstm(c) => ModelConfig::Lstm(tandem_models::RecurrentConfig { layers: 2, ..c }),
        _ => unreachable!(),
    }
}

#[test]
fn a_real_step_every_step_with_aux_weight_zero_is_vanilla_model_parallelism_on_every_schedule() {
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let interleaved = ModelParallelConfig {
        virtual_stages: 2,
        cuts: Some(vec![1, 2, 3]),
        schedule: Schedule::INTERLEAVED_1F1B,
        micro_batches: 4,
        ..mp(Schedule::GPIPE)
    };
    let mut cases: Vec<(ModelConfig, ModelParallelConfig)> = Vec::new();
    for config in toy_models() {
        for schedule in [Schedule::NAIVE, Schedule::GPIPE, Schedule::ONE_F_ONE_B] {
            cases.push((config.clone(), mp(schedule)));
        }
    }
    cases.push((two_layer_lstm(), interleaved));
    for (config, mp) in cases {
        let name = format!("{} {}", config.architecture().name(), mp.schedule.name());
        let mut reference = vanilla(&config, &mp, &data, vocab_size);
        let expected = one_epoch(&mut reference, &data, &train);
        let every_step =
            LocalLearningConfig { model_parallel: mp.clone(), ..local(TriggerConfig::Periodic { every: 1 }, replay()) };
        let mut strategy = build(&config, &every_step, &data, vocab_size);
        let got = one_epoch(strategy.as_mut(), &data, &train);
        let diff = relative_difference(&strategy.model().parameter_values(), &reference.model().parameter_values());
        assert!(diff <= 1e-5, "{name}: parameters differ by {diff:e}");
        assert!(
            (got.loss() - expected.loss()).abs() <= 1e-5 * expected.loss(),
            "{name}: loss {} vs {}",
            got.loss(),
            expected.loss()
        );
        assert_eq!(got.figures.bytes_per_step(), expected.figures.bytes_per_step(), "{name}: no label crosses");
        let sync = got.figures.sync().unwrap();
        assert_eq!(
            (sync.sync_steps, sync.local_steps, sync.protocol),
            (14, 0, tandem_results::Protocol::Local),
            "{name}"
        );
        assert_eq!(
            sync.aux_parameters.iter().filter(|&&p| p > 0).count(),
            mp.pieces() - 1,
            "{name}: a head per stage but the last"
        );
    }
}

/// The bytes one boundary direction carries over an epoch of `batches` at `bits` bits, for a
/// boundary activation of `features` per token.
fn expected_bytes(batches: &[Vec<usize>], micro_batches: usize, features: usize, bits: u8) -> u64 {
    batches
        .iter()
        .flat_map(|b| shard_ranges(b.len(), micro_batches.min(b.len())))
        .map(|r| encoded_size(r.len() * TOY_MAX_LEN, features, bits) as u64)
        .sum()
}

fn epoch_batches(data: &Encoded, train: &TrainConfig) -> Vec<Vec<usize>> {
    let order: Vec<usize> = tandem_data::epoch_order(data.len(), 5, 0);
    tandem_data::batches(&order, train.batch_size).map(<[usize]>::to_vec).collect()
}

/// Bytes per epoch on the first boundary: forward, backward.
fn link_bytes(stats: &TrainStats) -> (f64, f64) {
    let link = &stats.figures.pipeline().unwrap().links_per_step[0];
    (link.forward.bytes * stats.steps as f64, link.backward.bytes * stats.steps as f64)
}

#[test]
fn compressed_boundaries_are_lossless_at_32_bits_close_at_8_and_counted_at_their_encoded_size() {
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let config = toy_model(Architecture::Gru);
    let mut reference = vanilla(&config, &mp(Schedule::GPIPE), &data, vocab_size);
    let expected = one_epoch(&mut reference, &data, &train);
    let reference = reference.model().parameter_values();
    let run = |compression: CompressionConfig| {
        let mut strategy =
            vanilla(&config, &ModelParallelConfig { compression, ..mp(Schedule::GPIPE) }, &data, vocab_size);
        let stats = one_epoch(&mut strategy, &data, &train);
        (stats, relative_difference(&strategy.model().parameter_values(), &reference))
    };
    let lossless = CompressionConfig { scheme: Scheme::Delta, ..Default::default() };
    let (stats, diff) = run(lossless);
    assert_eq!(diff, 0.0, "32 bits carry the values as they are");
    assert_eq!(stats.figures.bytes_per_step(), expected.figures.bytes_per_step());
    let batches = epoch_batches(&data, &train);
    for (activation_bits, gradient_bits, scheme, bound) in
        [(8, 8, Scheme::Plain, 0.01), (4, 8, Scheme::Delta, 0.1), (2, 4, Scheme::ErrorFeedback, 0.2)]
    {
        let compression = CompressionConfig { activation_bits, gradient_bits, scheme };
        let (stats, diff) = run(compression);
        assert!(diff > 0.0 && diff <= bound, "{compression:?}: parameters {diff:e} from vanilla's (bound {bound})");
        // The toy embedding has 16 features per token; 3 micro-batches per batch.
        let forward = expected_bytes(&batches, 3, 16, activation_bits);
        let backward = expected_bytes(&batches, 3, 16, gradient_bits);
        let (f, b) = link_bytes(&stats);
        assert_eq!((f.round() as u64, b.round() as u64), (forward, backward), "{compression:?}");
        let pipeline = stats.figures.pipeline().unwrap();
        assert_eq!(pipeline.compression.as_deref(), Some(&compression.label()[1..]));
        // AQ-SGD keeps a copy of every sample's activation at both ends, error feedback a carried
        // error at each sender (activations forward, gradients back); plain quantisation nothing.
        let per_copy = (data.len() * TOY_MAX_LEN * 16 * size_of::<f32>()) as f64;
        let held = if scheme == Scheme::Plain { 0.0 } else { 2.0 * per_copy };
        assert_eq!(pipeline.state_bytes, Some(held), "{compression:?}");
    }
    assert_eq!(expected.figures.pipeline().unwrap().state_bytes, Some(0.0), "vanilla keeps nothing between steps");
}

#[test]
fn between_real_steps_replay_moves_no_byte_transfers_go_forward_only_and_labels_are_counted() {
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let batches = epoch_batches(&data, &train);
    let cnn = toy_model(Architecture::Cnn);
    let mut reference = vanilla(&cnn, &mp(Schedule::GPIPE), &data, vocab_size);
    let full = one_epoch(&mut reference, &data, &train);
    let (full_forward, full_backward) = link_bytes(&full);
    // Real steps at 0, 4, 8, 12 (periodic 4): 48 samples cross each way, of the epoch's 160.
    let synced = 48.0 / data.len() as f64;
    let mut replaying = build(&cnn, &local(TriggerConfig::Periodic { every: 4 }, replay()), &data, vocab_size);
    let stats = one_epoch(replaying.as_mut(), &data, &train);
    let (forward, backward) = link_bytes(&stats);
    assert!((forward - synced * full_forward).abs() < 1e-6 && (backward - synced * full_backward).abs() < 1e-6);
    let sync = stats.figures.sync().unwrap();
    assert_eq!((sync.sync_steps, sync.local_steps, sync.transfer_steps), (4, 10, 0));
    assert!(sync.replayed_samples > 0, "the last stage replays what it received at real steps");
    // What it keeps: the last 2 batches of 12 received (of 48 samples), 16 features per token.
    let kept = (2 * train.batch_size * TOY_MAX_LEN * 16 * size_of::<f32>()) as f64;
    assert_eq!(stats.figures.pipeline().unwrap().state_bytes, Some(kept));
    // The first stage learned locally on the 10 other batches (112 samples): their labels crossed.
    let local_samples: usize = batches.iter().enumerate().filter(|(i, _)| i % 4 != 0).map(|(_, b)| b.len()).sum();
    assert_eq!(sync.label_bytes_per_step * stats.steps as f64, (local_samples as u64 * LABEL_BYTES) as f64);
    assert_eq!(stats.samples, data.len(), "every batch of the stream is consumed once");

    // Activations forward every 2nd step between real steps, 4 bits (no gradient goes back).
    let compression = CompressionConfig { activation_bits: 4, gradient_bits: 8, scheme: Scheme::Delta };
    let transferring = LocalLearningConfig {
        model_parallel: ModelParallelConfig { compression, ..mp(Schedule::GPIPE) },
        transfer_every: 2,
        aux_weight: 1.0,
        ..local(TriggerConfig::Periodic { every: 4 }, LaterStages::Predict { predictor: PredictorConfig::Static })
    };
    let stats = one_epoch(build(&cnn, &transferring, &data, vocab_size).as_mut(), &data, &train);
    let sync = stats.figures.sync().unwrap();
    // Steps 2, 6, 10 transfer (the 2nd after each real step); step 13 is the 1st after 12.
    assert_eq!((sync.sync_steps, sync.local_steps, sync.transfer_steps), (4, 10, 3));
    let real: Vec<Vec<usize>> = batches.iter().step_by(4).cloned().collect();
    let sent: Vec<Vec<usize>> = [2, 6, 10].iter().map(|&i| batches[i].clone()).collect();
    let (forward, backward) = link_bytes(&stats);
    let one_piece = |b: &[Vec<usize>]| b.iter().map(|b| encoded_size(b.len() * TOY_MAX_LEN, 16, 4) as u64).sum::<u64>();
    assert_eq!(forward.round() as u64, expected_bytes(&real, 3, 16, 4) + one_piece(&sent));
    assert_eq!(backward.round() as u64, expected_bytes(&real, 3, 16, 8), "gradients cross at real steps only");
    // With an auxiliary weight, real steps need the labels too: every sample's crossed once.
    assert_eq!(sync.label_bytes_per_step * stats.steps as f64, (data.len() as u64 * LABEL_BYTES) as f64);
    assert!(stats.tested > 48, "transferred batches are tested before the last stage trains on them");
}

/// Runs the first `split` batches of an epoch, checkpoints, and runs the rest on a second
/// strategy restored from it; the parameters must equal those of one uninterrupted run.
fn resumes_exactly(name: &str, make: &dyn Fn() -> Box<dyn Strategy<B>>, data: &Encoded, split: usize) {
    let train = exact_train_config();
    let batches = epoch_batches(data, &train);
    let plan = |range: std::ops::Range<usize>| EpochPlan {
        epoch: 0,
        batches: batches[range.clone()].to_vec(),
        data,
        first_step: range.start,
        total_steps: batches.len(),
        rng_seed: 5,
        on_batch: &|_| {},
        interrupt: &|| false,
    };
    let mut whole = make();
    whole.train_epoch(&plan(0..split)).unwrap();
    whole.train_epoch(&plan(split..batches.len())).unwrap();
    let mut first = make();
    first.train_epoch(&plan(0..split)).unwrap();
    let state = first.state().unwrap();
    let mut second = make();
    second.restore(&tandem_train::StateParts::from_bytes(&state.to_bytes()).unwrap()).unwrap();
    second.train_epoch(&plan(split..batches.len())).unwrap();
    assert_eq!(second.model().parameter_values(), whole.model().parameter_values(), "{name}: resumed run differs");
}

#[test]
fn every_protocol_resumes_from_a_checkpoint_to_the_same_parameters() {
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let lstm = toy_model(Architecture::Lstm);
    let compression = CompressionConfig { activation_bits: 4, gradient_bits: 8, scheme: Scheme::Delta };
    let locals = [
        ("local, replay", local(TriggerConfig::Periodic { every: 3 }, replay())),
        (
            "local, holt, compressed transfers, local-loss trigger",
            LocalLearningConfig {
                model_parallel: ModelParallelConfig { compression, ..mp(Schedule::ONE_F_ONE_B) },
                transfer_every: 2,
                aux_weight: 0.5,
                ..local(
                    TriggerConfig::LocalLoss { threshold: 0.01, min_horizon: 2, max_horizon: 5 },
                    LaterStages::Predict { predictor: PredictorConfig::default() },
                )
            },
        ),
    ];
    for (name, config) in &locals {
        resumes_exactly(name, &|| build(&lstm, config, &data, vocab_size), &data, 6);
    }
    let predictive = [
        (PredictorConfig::default(), TriggerConfig::default()),
        (
            PredictorConfig::Kalman { level_noise: 0.1, trend_noise: 0.01 },
            TriggerConfig::SafeZone { threshold: None, auto_factor: 2.0, max_horizon: 4 },
        ),
        (PredictorConfig::LeastSquares { window: 3 }, TriggerConfig::Periodic { every: 3 }),
    ];
    for (predictor, trigger) in predictive {
        let config =
            PredictiveSyncConfig { model_parallel: mp(Schedule::GPIPE), predictor, trigger, replay_batches: 2 };
        let make = || {
            let model = initial_model(&lstm, vocab_size);
            let devices = vec![Default::default(); 2];
            config.build::<B>(Ingredients { model, train: &train, devices, data: &data, ranks: None }).unwrap()
        };
        resumes_exactly(&config.label(), &make, &data, 7);
    }
}
