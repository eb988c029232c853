//! Training throughput (forward + backward + AdamW step) per architecture, backend and (on
//! CPU backends) thread count, at the reference shape: batch 64, sequence 64, vocabulary 20,000,
//! embedding 128; CNN 100 filters × widths 3/4/5; LSTM/GRU hidden 128; Transformer 2 layers,
//! 4 heads, feed-forward 256.
//!
//!     cargo bench -p tandem-experiment --bench throughput [--features wgpu,cuda]
//!
//! Every backend compiled in is measured; a GPU backend whose device 0 does not start is
//! skipped with a message. GPU rows fill only the first thread-count column.
//!
//! Environment: `TANDEM_BENCH_SECONDS` (time budget per cell, default 8),
//! `TANDEM_BENCH_ARCHS` (e.g. `cnn,gru`), `TANDEM_BENCH_BACKENDS` (e.g. `flex`),
//! `TANDEM_BENCH_THREADS` (e.g. `1,2`; default 1 and all cores).

use std::time::{Duration, Instant};

use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use tandem_models::{Architecture, InputSpec, ModelConfig};
use tandem_train::testing::reference_model;
use tandem_train::optim::AnyOptimizer;
use tandem_train::{gradients, EmbeddingUpdate, TrainConfig};

const BATCH: usize = 64;
const SEQ: usize = 64;
const VOCAB: usize = 20_000;

/// Full training steps timed within a budget.
struct Measured {
    samples_per_second: f64,
    /// Fraction of the time spent in the optimizer step (the rest: forward + backward). On a
    /// GPU it times only the queueing of the step's work, so the table leaves it out there.
    optimizer_share: f64,
}

/// Full training steps within `budget` (at least 3 timed steps).
fn measure<B: AutodiffBackend>(config: &ModelConfig, embedding_update: EmbeddingUpdate, budget: Duration) -> Measured {
    let device = B::Device::default();
    B::seed(&device, 1);
    let input = InputSpec { vocab_size: VOCAB, max_len: SEQ, num_classes: 4 };
    let mut model = config.init::<B>(&input, &device);
    let train = TrainConfig { embedding_update, ..Default::default() };
    let mut optimizer = AnyOptimizer::for_model(&train, &model);
    let ids: Vec<i64> = (0..BATCH * SEQ).map(|i| ((i * 7919) % (VOCAB - 2) + 2) as i64).collect();
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [BATCH, SEQ]), &device);
    let mask = Tensor::<B, 2, Int>::zeros([BATCH, SEQ], &device).equal_elem(1);
    let labels = Tensor::<B, 1, Int>::from_data(TensorData::new((0..BATCH as i64).map(|i| i % 4).collect(), [BATCH]), &device);
    let batch = || tandem_data::Batch {
        tokens: tokens.clone(),
        mask_pad: mask.clone(),
        lengths: Tensor::full([BATCH], SEQ as i64, &device),
        labels: labels.clone(),
    };
    let optimizer_time = std::cell::Cell::new(Duration::ZERO);
    let mut step = |model: tandem_models::Classifier<B>| {
        let (_, grads) = gradients(&model, batch());
        let started = Instant::now();
        let model = optimizer.step(1e-3, model, grads);
        optimizer_time.set(optimizer_time.get() + started.elapsed());
        model
    };
    model = step(model); // warm-up (and, on a GPU, kernel compilation)
    B::sync(&device).expect("the device finishes its queued work");
    optimizer_time.set(Duration::ZERO);
    let started = Instant::now();
    let mut steps = 0;
    while steps < 3 || started.elapsed() < budget {
        model = step(model);
        steps += 1;
    }
    // GPU backends queue work asynchronously: count it only once it has run.
    B::sync(&device).expect("the device finishes its queued work");
    let elapsed = started.elapsed();
    drop(model);
    Measured {
        samples_per_second: (steps * BATCH) as f64 / elapsed.as_secs_f64(),
        optimizer_share: optimizer_time.get().as_secs_f64() / (elapsed.as_secs_f64() + 1e-12),
    }
}

/// Whether the backend's default device starts here (skipped with a message if not).
#[allow(dead_code)]
fn gpu_starts<B: burn::tensor::backend::Backend>(name: &str) -> bool {
    let started = tandem_experiment::backend::probe_device::<B>(&format!("{name}:0"), &Default::default());
    if let Err(e) = &started {
        eprintln!("skipped {name}: {e}");
    }
    started.is_ok()
}

fn env_list(name: &str) -> Option<Vec<String>> {
    std::env::var(name).ok().map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
}

fn main() {
    let budget = Duration::from_secs_f64(std::env::var("TANDEM_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8.0));
    let archs: Vec<Architecture> = Architecture::ALL
        .into_iter()
        .filter(|a| env_list("TANDEM_BENCH_ARCHS").is_none_or(|l| l.iter().any(|n| n == a.name())))
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: Vec<usize> = env_list("TANDEM_BENCH_THREADS")
        .map(|l| l.iter().filter_map(|t| t.parse().ok()).collect())
        .unwrap_or_else(|| if cores > 1 { vec![1, cores] } else { vec![1] });
    let wanted = |name: &str| env_list("TANDEM_BENCH_BACKENDS").is_none_or(|l| l.iter().any(|n| n == name));
    // (name, computes on the CPU, measure)
    let mut backends: Vec<(&str, bool, fn(&ModelConfig, EmbeddingUpdate, Duration) -> Measured)> = Vec::new();
    #[cfg(feature = "flex")]
    backends.push(("flex", true, measure::<Autodiff<burn::backend::Flex>>));
    #[cfg(feature = "ndarray")]
    backends.push(("ndarray", true, measure::<Autodiff<burn::backend::NdArray>>));
    #[cfg(feature = "wgpu")]
    if wanted("wgpu") && gpu_starts::<burn::backend::Wgpu>("wgpu") {
        backends.push(("wgpu", false, measure::<Autodiff<burn::backend::Wgpu>>));
    }
    #[cfg(feature = "cuda")]
    if wanted("cuda") && gpu_starts::<burn::backend::Cuda>("cuda") {
        backends.push(("cuda", false, measure::<Autodiff<burn::backend::Cuda>>));
    }
    backends.retain(|(name, _, _)| wanted(name));

    // Phase 1, with glibc's default (adaptive) allocation thresholds: stock Burn, the baseline of
    // every ratio. Phase 2, after `keep_freed_memory`, row by row: stock again, then Tandem's modules.
    let mut cells: Vec<(Architecture, usize, usize)> = Vec::new(); // (architecture, backend, thread column)
    for &arch in &archs {
        for (b, (_, cpu, _)) in backends.iter().enumerate() {
            cells.extend((0..threads.len()).filter(|&column| *cpu || column == 0).map(|column| (arch, b, column)));
        }
    }
    let on = |(arch, b, column): (Architecture, usize, usize), config: &ModelConfig, update: EmbeddingUpdate| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads[column]).build().expect("thread pool");
        eprintln!("measuring {} on {} ({} threads)…", arch.name(), backends[b].0, threads[column]);
        pool.install(|| (backends[b].2)(config, update, budget))
    };
    let stock = |arch: Architecture| reference_model(arch).with_fused(false);
    let baseline: Vec<Measured> = cells.iter().map(|&cell| on(cell, &stock(cell.0), EmbeddingUpdate::Dense)).collect();
    tandem_train::keep_freed_memory();

    println!("training throughput, samples/s (batch {BATCH}, sequence {SEQ}, vocabulary {VOCAB}; {cores} cores here)");
    println!("stock: Burn's own Conv1d / LSTM / GRU forward and dense AdamW, with glibc's default allocation");
    println!("thresholds; kept memory: the same after `tandem_train::keep_freed_memory`; Tandem: its fused modules");
    println!("(same parameters; the recurrent time loop as one autodiff node), with kept memory; lazy embedding:");
    println!("AdamW only on the embedding rows of the batch. Ratios are to stock; in brackets (CPU backends):");
    println!("the share of the step spent in AdamW (the rest is forward + backward)\n");
    print!("| architecture | backend |");
    for t in &threads {
        let s = if *t == 1 { "" } else { "s" };
        print!(" stock, {t} thread{s} | kept memory | ratio | Tandem | ratio | Tandem + lazy embedding | ratio |");
    }
    println!();
    println!("|---|---|{}", "---:|".repeat(7 * threads.len()));
    let mut at = 0;
    for arch in &archs {
        let tandem = reference_model(*arch);
        for (b, (name, cpu, _)) in backends.iter().enumerate() {
            print!("| {} | {name} |", arch.name());
            for column in 0..threads.len() {
                if !cpu && column > 0 {
                    print!("{}", " — |".repeat(7));
                    continue;
                }
                let cell = (*arch, b, column);
                assert_eq!(cells[at], cell, "cells are measured in table order");
                let share = |run: &Measured| if *cpu { format!(" ({:.0} %)", 100.0 * run.optimizer_share) } else { String::new() };
                let s = baseline[at].samples_per_second;
                print!(" {s:.0}{} |", share(&baseline[at]));
                for run in [
                    on(cell, &stock(*arch), EmbeddingUpdate::Dense),
                    on(cell, &tandem, EmbeddingUpdate::Dense),
                    on(cell, &tandem, EmbeddingUpdate::Lazy),
                ] {
                    let r = run.samples_per_second;
                    print!(" {r:.0}{} | {:.2}× |", share(&run), r / s);
                }
                use std::io::Write;
                let _ = std::io::stdout().flush();
                at += 1;
            }
            println!();
        }
    }
}
