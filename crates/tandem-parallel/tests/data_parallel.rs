//! Data parallelism must compute what one device computes on the whole global batch.

use std::time::{Duration, Instant};

use burn::backend::{Autodiff, NdArray};
use tandem_models::{Architecture, Classifier, ModelConfig};
use tandem_parallel::{AllReduceKind, BatchSemantics, DataParallel, DataParallelConfig, LrScaling, StrategyKind};
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

/// `config.replicas` replicas, all on the CPU device.
fn data_parallel(model: Classifier<B>, config: DataParallelConfig, train: &TrainConfig) -> DataParallel<B> {
    DataParallel::new(model, train, &config, vec![Default::default(); config.replicas]).unwrap()
}

fn dp_config(replicas: usize, all_reduce: AllReduceKind, sparse_embedding: bool) -> DataParallelConfig {
    DataParallelConfig { replicas, all_reduce, sparse_embedding, ..Default::default() }
}

fn assert_same_training(config: &ModelConfig, replicas: usize, all_reduce: AllReduceKind, sparse_embedding: bool) {
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let mut sequential = Sequential::new(initial_model::<B>(config, vocab_size), &train, Default::default());
    let expected = one_epoch(&mut sequential, &data, &train);
    let mut parallel = data_parallel(
        initial_model(config, vocab_size),
        dp_config(replicas, all_reduce, sparse_embedding),
        &exact_train_config(),
    );
    let got = one_epoch(&mut parallel, &data, &train);

    let name = config.architecture().name();
    let diff = relative_difference(&parallel.model().parameter_values(), &sequential.model().parameter_values());
    assert!(diff <= 1e-5, "{name}, {replicas} replicas, {all_reduce:?}: parameters differ by {diff:e} (relative)");
    assert!(
        (got.loss() - expected.loss()).abs() <= 1e-5 * expected.loss().abs(),
        "{name}: loss {} vs {}",
        got.loss(),
        expected.loss()
    );
    assert_eq!((got.samples, got.steps), (expected.samples, expected.steps), "{name}: every sample once per epoch");
    assert_eq!((got.tested, got.correct), (expected.tested, expected.correct), "{name}: test-then-train counts");
    assert_eq!(parallel.max_replica_difference(), 0.0, "{name}: replicas must hold identical parameters");
}

#[test]
fn two_replicas_match_sequential_for_every_architecture_and_all_reduce() {
    let _serial = serial();
    for config in toy_models() {
        for kind in [AllReduceKind::Tree, AllReduceKind::Ring, AllReduceKind::Centralized] {
            assert_same_training(&config, 2, kind, true);
        }
    }
}

#[test]
fn uneven_shards_and_dense_exchange_match_sequential() {
    let _serial = serial();
    let gru = &toy_model(Architecture::Gru);
    // 12 / 3 = 4 per replica, but the last batch of 4 splits 2 / 1 / 1.
    assert_same_training(gru, 3, AllReduceKind::Tree, true);
    // Batch 4 over 5 replicas leaves one replica without samples; it still joins every all-reduce.
    let (data, _, vocab_size) = toy_data();
    let train = TrainConfig { batch_size: 4, ..exact_train_config() };
    let mut sequential = Sequential::new(initial_model::<B>(gru, vocab_size), &train, Default::default());
    one_epoch(&mut sequential, &data, &train);
    let mut parallel =
        data_parallel(initial_model(gru, vocab_size), DataParallelConfig { replicas: 5, ..Default::default() }, &train);
    one_epoch(&mut parallel, &data, &train);
    let diff = relative_difference(&parallel.model().parameter_values(), &sequential.model().parameter_values());
    assert!(diff <= 1e-5, "5 replicas, batch 4: parameters differ by {diff:e}");
    // The whole embedding table instead of its touched rows: same result.
    assert_same_training(gru, 2, AllReduceKind::Ring, false);
}

/// With a batch per replica each replica takes `batch_size` rows: the replicas train as
/// sequential training does on their rows together, at the learning rate the rule scales, in
/// 1/replicas of the steps; one replica is sequential training at `batch_size`.
#[test]
fn a_batch_per_replica_is_sequential_training_on_the_replicas_rows_together() {
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let base = TrainConfig { batch_size: 2, ..exact_train_config() };
    let gru = &toy_model(Architecture::Gru);
    for (replicas, lr_scaling) in [(1, LrScaling::Linear), (2, LrScaling::Linear), (3, LrScaling::Sqrt)] {
        let config =
            DataParallelConfig { replicas, batch: BatchSemantics::PerReplica, lr_scaling, ..Default::default() };
        let train = config.train_for(&base, 1);
        assert_eq!(train.batch_size, 2 * replicas);
        assert!((train.learning_rate - base.learning_rate * lr_scaling.factor(replicas)).abs() < 1e-12);
        let mut sequential = Sequential::new(initial_model::<B>(gru, vocab_size), &train, Default::default());
        let expected = one_epoch(&mut sequential, &data, &train);
        let mut parallel = data_parallel(initial_model(gru, vocab_size), config, &train);
        let got = one_epoch(&mut parallel, &data, &train);
        let diff = relative_difference(&parallel.model().parameter_values(), &sequential.model().parameter_values());
        assert!(diff <= 1e-5, "{replicas} replicas: parameters differ by {diff:e} (relative)");
        let steps = data.len().div_ceil(2 * replicas);
        assert_eq!((got.steps, expected.steps), (steps, steps), "{replicas} replicas: 1/replicas of the steps");
    }
    // Across two processes of two replicas each: a global batch of four replicas' rows.
    let config = DataParallelConfig { replicas: 2, batch: BatchSemantics::PerReplica, ..Default::default() };
    assert_eq!(config.train_for(&base, 2).batch_size, 8);
    assert_eq!(config.train_for(&base, 2).learning_rate, base.learning_rate, "no rule: the rate as set");
    // A rule for a batch that does not grow is refused, naming the key.
    let global = DataParallelConfig { lr_scaling: LrScaling::Sqrt, ..Default::default() };
    let err = global.validate().unwrap_err();
    assert!(err.to_string().contains("lr_scaling") && err.to_string().contains("per-replica"), "{err}");
}

/// On Flex, the CPU backend of runs and benchmarks, a replica writes the reduced embedding rows
/// over its own gradient's buffer: both batch semantics still train as sequential training does.
#[test]
fn on_flex_both_batch_semantics_match_sequential() {
    type F = Autodiff<burn::backend::Flex>;
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let gru = &toy_model(Architecture::Gru);
    for batch in [BatchSemantics::Global, BatchSemantics::PerReplica] {
        let config = DataParallelConfig { replicas: 2, batch, ..Default::default() };
        let train = config.train_for(&TrainConfig { batch_size: 4, ..exact_train_config() }, 1);
        let mut sequential = Sequential::new(initial_model::<F>(gru, vocab_size), &train, Default::default());
        one_epoch(&mut sequential, &data, &train);
        let mut parallel =
            DataParallel::new(initial_model::<F>(gru, vocab_size), &train, &config, vec![Default::default(); 2])
                .unwrap();
        one_epoch(&mut parallel, &data, &train);
        let diff = relative_difference(&parallel.model().parameter_values(), &sequential.model().parameter_values());
        assert!(diff <= 1e-5, "{batch:?}: parameters differ by {diff:e} (relative)");
        assert_eq!(parallel.max_replica_difference(), 0.0, "{batch:?}: replicas must hold identical parameters");
    }
}

#[test]
fn communication_is_accounted_and_the_embedding_travels_as_rows() {
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let cnn = &toy_model(Architecture::Cnn);
    let stats = |sparse| {
        let mut parallel = data_parallel(
            initial_model(cnn, vocab_size),
            dp_config(2, AllReduceKind::Tree, sparse),
            &exact_train_config(),
        );
        one_epoch(&mut parallel, &data, &train).figures.data_parallel().unwrap().clone()
    };
    let (sparse, dense) = (stats(true), stats(false));
    let parameters = initial_model::<B>(cnn, vocab_size).parameter_count() as f64;
    // Two peers, tree: each sends (and receives) every reduced value once, 4 bytes each.
    assert_eq!(dense.bytes_sent_per_replica_per_step, 4.0 * parameters);
    assert_eq!(dense.dense_bytes_per_replica_per_step, 4.0 * parameters);
    assert!(sparse.bytes_sent_per_replica_per_step < 4.0 * parameters);
    assert_eq!(sparse.bytes_received_per_replica_per_step, sparse.bytes_sent_per_replica_per_step);
    // One bucket for the dense gradients, the embedding rows with them: one call.
    assert_eq!(sparse.all_reduce_calls_per_step, 1.0);
    assert_eq!(dense.all_reduce_calls_per_step, 1.0);
    assert!((0.0..=1.0).contains(&sparse.all_reduce_share));
}

#[test]
fn small_buckets_split_the_exchange_but_not_the_result() {
    let _serial = serial();
    let (data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    let transformer = &toy_model(Architecture::Transformer);
    let run = |bucket_mb| {
        let mut parallel = data_parallel(
            initial_model(transformer, vocab_size),
            DataParallelConfig { bucket_mb, ..Default::default() },
            &train,
        );
        let stats = one_epoch(&mut parallel, &data, &train);
        (stats.figures.data_parallel().unwrap().buckets_per_step, parallel.model().parameter_values())
    };
    let (one, a) = run(25.0);
    let (many, b) = run(0.001); // 1 KiB buckets
    assert_eq!(one, 1);
    assert!(many > 3, "{many} buckets");
    assert!(relative_difference(&a, &b) <= 1e-6);
}

#[test]
fn epochs_reshuffle_and_replicas_stay_in_sync_through_the_trainer() {
    let _serial = serial();
    let (data, holdout, vocab_size) = toy_data();
    let train_cfg = TrainConfig { epochs: 2, ..exact_train_config() };
    let mut parallel = data_parallel(
        initial_model(&toy_model(Architecture::Lstm), vocab_size),
        dp_config(2, AllReduceKind::Tree, true),
        &exact_train_config(),
    );
    let records = train_toy(&mut parallel, &train_cfg, &data, &holdout);
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r.figures.data_parallel().map(|d| d.replica_max_abs_difference), Some(0.0));
        assert_eq!(r.holdout.confusion.total(), holdout.len() as u64, "every holdout sample evaluated once");
    }
    assert_ne!(tandem_data::epoch_order(data.len(), 9, 0), tandem_data::epoch_order(data.len(), 9, 1));
}

#[test]
fn a_failing_replica_stops_the_run_with_its_name_instead_of_hanging() {
    let _serial = serial();
    let (mut data, _, vocab_size) = toy_data();
    let train = exact_train_config();
    // Dense exchange, so replica 0 never looks the bad token up and waits in the all-reduce.
    let mut parallel = data_parallel(
        initial_model(&toy_model(Architecture::Gru), vocab_size),
        dp_config(2, AllReduceKind::Tree, false),
        &exact_train_config(),
    );
    // A token id outside the vocabulary in a sample of replica 1's shard of the third batch.
    let order: Vec<usize> = (0..data.len()).collect();
    let bad_sample = 2 * 12 + 7;
    data.tokens[bad_sample * data.max_len] = (vocab_size + 1000) as u32;
    let batches = tandem_data::batches(&order, train.batch_size).map(<[usize]>::to_vec).collect();
    let plan = epoch_plan(batches, &data, 14);
    let started = Instant::now();
    let error = parallel.train_epoch(&plan).expect_err("a replica failed").to_string();
    assert!(error.contains("replica 1"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(60));
    // The parameters of before the failed epoch are still there, and a new group can run.
    assert!(parallel.model().parameter_values().iter().all(|v| v.is_finite()));
    let (good, _, _) = toy_data();
    let mut fresh = data_parallel(
        initial_model(&toy_model(Architecture::Gru), vocab_size),
        dp_config(2, AllReduceKind::Tree, true),
        &exact_train_config(),
    );
    one_epoch(&mut fresh, &good, &train);
}
