//! What the strategy benchmarks share: AG News text at the reference shape (batch 64,
//! sequence 64, vocabulary 20,000, embedding 128), the reference models, and a timed run.

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use tandem_data::{Encoded, SplitConfig, Vocab, VocabConfig};
use tandem_models::{Architecture, Classifier, InputSpec};
use tandem_testing::reference_model;
use tandem_train::{EpochPlan, Sequential, Strategy, TrainConfig, TrainStats};

pub type B = Autodiff<Flex>;
pub const BATCH: usize = 64;
pub const SEQ: usize = 64;
pub const VOCAB: usize = 20_000;

/// The training part of the AG News test split, encoded at the reference shape.
pub fn data() -> Encoded {
    let dir = tandem_data::resolve_data_dir(None);
    let splits = tandem_data::load_splits_with(&dir, &SplitConfig::default()).unwrap_or_else(|e| panic!("{e}"));
    let vocab = Vocab::build(splits.train.iter().map(|s| s.text()), &VocabConfig { max_size: VOCAB, min_freq: 1 });
    Encoded::new(&splits.train, &vocab, SEQ)
}

/// The reference model of `arch`, with the same initial parameters every time.
pub fn model(arch: Architecture) -> Classifier<B> {
    let device = Default::default();
    B::seed(&device, 1);
    reference_model(arch).init(&InputSpec { vocab_size: VOCAB, max_len: SEQ, num_classes: 4 }, &device)
}

/// `TANDEM_BENCH_STEPS` (timed optimizer steps per cell, default 20) and the architectures
/// named in `TANDEM_BENCH_ARCHS` (e.g. `cnn,gru`; default all).
pub fn settings() -> (usize, Vec<Architecture>) {
    let steps = std::env::var("TANDEM_BENCH_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let archs = Architecture::ALL
        .into_iter()
        .filter(|a| std::env::var("TANDEM_BENCH_ARCHS").map_or(true, |l| l.split(',').any(|n| n.trim() == a.name())))
        .collect();
    (steps, archs)
}

/// Training settings at the reference shape with `threads` compute threads per device.
pub fn train(threads: usize) -> TrainConfig {
    TrainConfig { batch_size: BATCH, threads, ..Default::default() }
}

/// Samples/s over `steps` optimizer steps of `batch` samples, after 2 warm-up steps: whole batches
/// only, the data repeating where an epoch has fewer than 2 + `steps` of them.
pub fn measure(strategy: &mut dyn Strategy<B>, data: &Encoded, batch: usize, steps: usize) -> (f64, TrainStats) {
    measure_with(strategy, data, batch, steps, &|_| {})
}

/// [`measure`], calling `after_step` after every optimizer step (warm-up steps included).
pub fn measure_with(
    strategy: &mut dyn Strategy<B>,
    data: &Encoded,
    batch: usize,
    steps: usize,
    after_step: &(dyn Fn(usize) + Sync),
) -> (f64, TrainStats) {
    let order: Vec<usize> = tandem_data::epoch_order(data.len(), 1, 0);
    // Whole batches only, and as many passes over the data as `steps` needs.
    let epoch: Vec<Vec<usize>> =
        tandem_data::batches(&order, batch).filter(|b| b.len() == batch).map(<[usize]>::to_vec).collect();
    assert!(!epoch.is_empty(), "{} training rows do not make one batch of {batch}", data.len());
    let all: Vec<Vec<usize>> = epoch.iter().cycle().take(2 + steps).cloned().collect();
    let mut run = |batches: &[Vec<usize>]| {
        let plan = EpochPlan {
            epoch: 0,
            batches: batches.to_vec(),
            data,
            first_step: 0,
            total_steps: all.len(),
            rng_seed: 1,
            on_batch: after_step,
            interrupt: &|| false,
        };
        strategy.train_epoch(&plan).expect("training step")
    };
    run(&all[..2]);
    let started = Instant::now();
    let stats = run(&all[2..2 + steps]);
    ((steps * batch) as f64 / started.elapsed().as_secs_f64(), stats)
}

/// Sequential training of `arch` on `threads` cores: samples/s at `batch`.
pub fn sequential(arch: Architecture, data: &Encoded, threads: usize, batch: usize, steps: usize) -> f64 {
    sequential_with(arch, data, threads, batch, steps, &|_| {})
}

/// [`sequential`], calling `after_step` after every optimizer step.
pub fn sequential_with(
    arch: Architecture,
    data: &Encoded,
    threads: usize,
    batch: usize,
    steps: usize,
    after_step: &(dyn Fn(usize) + Sync),
) -> f64 {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool");
    pool.install(|| {
        let mut strategy = Sequential::new(model(arch), &train(threads), Default::default());
        measure_with(&mut strategy, data, batch, steps, after_step).0
    })
}
