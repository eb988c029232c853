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
//! Stock is Burn's modules and Burn's AdamW; Tandem is Tandem's fused modules and its optimizer
//! (one-pass AdamW on CPU backends). Machines here are noisy (±25 % from one minute to the next),
//! so each cell is measured in rounds: every round runs the four variants back to back (stock in
//! a child process with glibc's
//! default allocator (on a GPU backend, here), then stock, Tandem and Tandem + lazy embedding
//! here, after `keep_freed_memory`), and the table gives the median over rounds of samples/s and of each
//! round's ratio to its own stock baseline.
//!
//! Environment: `TANDEM_BENCH_SECONDS` (time budget per variant and cell, default 8, split over
//! the rounds), `TANDEM_BENCH_ROUNDS` (default 3), `TANDEM_BENCH_ARCHS` (e.g. `cnn,gru`),
//! `TANDEM_BENCH_BACKENDS` (e.g. `flex`), `TANDEM_BENCH_THREADS` (e.g. `1,2`; default 1 and all
//! cores).

use std::time::{Duration, Instant};

use burn::backend::Autodiff;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use tandem_models::{Architecture, InputSpec, ModelConfig};
use tandem_testing::reference_model;
use tandem_train::optim::{adamw_config, AnyOptimizer};
use tandem_train::{gradients, EmbeddingUpdate, TrainConfig};

/// Measures one model's training throughput on one backend.
type Measure = fn(&ModelConfig, Optim, Duration) -> Measured;

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

/// The optimizer of a variant.
#[derive(Clone, Copy)]
enum Optim {
    /// Burn's own AdamW (tensor operations), for the stock baselines.
    Burn,
    /// Tandem's (one-pass AdamW on CPU backends), dense or lazy on the embedding.
    Tandem(EmbeddingUpdate),
}

/// Full training steps within `budget` (at least 3 timed steps).
fn measure<B: AutodiffBackend>(config: &ModelConfig, optim: Optim, budget: Duration) -> Measured {
    let device = B::Device::default();
    B::seed(&device, 1);
    let input = InputSpec { vocab_size: VOCAB, max_len: SEQ, num_classes: 4 };
    let mut model = config.init::<B>(&input, &device);
    let train = TrainConfig {
        embedding_update: if let Optim::Tandem(update) = optim { update } else { EmbeddingUpdate::Dense },
        ..Default::default()
    };
    let mut tandem = AnyOptimizer::for_model(&train, &model);
    let mut burn = adamw_config(&train).init::<B, tandem_models::Classifier<B>>();
    let ids: Vec<i64> = (0..BATCH * SEQ).map(|i| ((i * 7919) % (VOCAB - 2) + 2) as i64).collect();
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [BATCH, SEQ]), &device);
    let mask = Tensor::<B, 2, Int>::zeros([BATCH, SEQ], &device).equal_elem(1);
    let labels =
        Tensor::<B, 1, Int>::from_data(TensorData::new((0..BATCH as i64).map(|i| i % 4).collect(), [BATCH]), &device);
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
        let model = match optim {
            Optim::Burn => burn.step(1e-3, model, grads),
            Optim::Tandem(_) => tandem.step(1e-3, model, grads),
        };
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

/// Set in the child process that measures one stock baseline: `architecture,backend,threads`.
const BASELINE_CHILD: &str = "TANDEM_BENCH_BASELINE_CELL";

/// The median of `values` (not empty).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

fn main() {
    let budget =
        Duration::from_secs_f64(std::env::var("TANDEM_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8.0));
    let rounds: usize =
        std::env::var("TANDEM_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).filter(|&r| r > 0).unwrap_or(3);
    let child = std::env::var(BASELINE_CHILD).ok();
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
    let mut backends: Vec<(&str, bool, Measure)> = Vec::new();
    #[cfg(feature = "flex")]
    backends.push(("flex", true, measure::<Autodiff<burn::backend::Flex>>));
    #[cfg(feature = "ndarray")]
    backends.push(("ndarray", true, measure::<Autodiff<burn::backend::NdArray>>));
    #[cfg(feature = "wgpu")]
    if wanted("wgpu") && (child.is_some() || gpu_starts::<burn::backend::Wgpu>("wgpu")) {
        backends.push(("wgpu", false, measure::<Autodiff<burn::backend::Wgpu>>));
    }
    #[cfg(feature = "cuda")]
    if wanted("cuda") && (child.is_some() || gpu_starts::<burn::backend::Cuda>("cuda")) {
        backends.push(("cuda", false, measure::<Autodiff<burn::backend::Cuda>>));
    }
    backends.retain(|(name, _, _)| wanted(name));
    let stock = |arch: Architecture| reference_model(arch).with_fused(false);
    let run = |b: usize, threads: usize, config: &ModelConfig, optim: Optim, budget: Duration| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool");
        pool.install(|| (backends[b].2)(config, optim, budget))
    };

    if let Some(cell) = child {
        // The child: one stock measurement with the allocator as the process started, printed
        // as `samples_per_second optimizer_share`.
        let fields: Vec<&str> = cell.split(',').collect();
        let arch = *Architecture::ALL.iter().find(|a| a.name() == fields[0]).expect("a known architecture");
        let b = backends.iter().position(|(name, _, _)| *name == fields[1]).expect("a compiled backend");
        let m = run(b, fields[2].parse().expect("a thread count"), &stock(arch), Optim::Burn, budget);
        println!("{} {}", m.samples_per_second, m.optimizer_share);
        return;
    }
    tandem_train::keep_freed_memory();
    let baseline_in_child = |arch: Architecture, b: usize, threads: usize, budget: Duration| -> Measured {
        let exe = std::env::current_exe().expect("the benchmark's own path");
        let out = std::process::Command::new(exe)
            .args(std::env::args().skip(1))
            .env(BASELINE_CHILD, format!("{},{},{threads}", arch.name(), backends[b].0))
            .env("TANDEM_BENCH_SECONDS", budget.as_secs_f64().to_string())
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("the baseline child runs");
        assert!(out.status.success(), "the baseline child failed: {}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        let last = text.lines().last().unwrap_or_default();
        let values: Vec<f64> = last.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        assert_eq!(values.len(), 2, "the baseline child's last line is `{last}`");
        Measured { samples_per_second: values[0], optimizer_share: values[1] }
    };

    println!("training throughput, samples/s (batch {BATCH}, sequence {SEQ}, vocabulary {VOCAB}; {cores} cores here)");
    println!("stock: Burn's own Conv1d / LSTM / GRU / encoder forward and Burn's AdamW, in a process with glibc's");
    println!("default allocation thresholds; kept memory: the same after `tandem_train::keep_freed_memory`;");
    println!("Tandem: its fused modules (same parameters) and one-pass AdamW, with kept memory; lazy embedding: AdamW only on the");
    println!("embedding rows of the batch. Medians of {rounds} interleaved rounds; ratios are medians of each round's");
    println!("ratio to its own stock run. In brackets (CPU backends): the share of the step spent in AdamW\n");
    print!("| architecture | backend |");
    for t in &threads {
        let s = if *t == 1 { "" } else { "s" };
        print!(" stock, {t} thread{s} | kept memory | ratio | Tandem | ratio | Tandem + lazy embedding | ratio |");
    }
    println!();
    println!("|---|---|{}", "---:|".repeat(7 * threads.len()));
    let round_budget = budget / rounds as u32;
    for arch in &archs {
        let tandem = reference_model(*arch);
        for (b, (name, cpu, _)) in backends.iter().enumerate() {
            print!("| {} | {name} |", arch.name());
            for (column, &threads) in threads.iter().enumerate() {
                if !cpu && column > 0 {
                    print!("{}", " — |".repeat(7));
                    continue;
                }
                eprintln!("measuring {} on {name} ({threads} threads), {rounds} rounds…", arch.name());
                // Per variant (stock baseline, kept memory, Tandem, Tandem + lazy): each round's result.
                let mut measured: [Vec<Measured>; 4] = Default::default();
                for _ in 0..rounds {
                    // A GPU's speed does not depend on the host allocator, and a second process
                    // may not get the device (exclusive compute mode): its baseline runs here.
                    measured[0].push(if *cpu {
                        baseline_in_child(*arch, b, threads, round_budget)
                    } else {
                        run(b, threads, &stock(*arch), Optim::Burn, round_budget)
                    });
                    measured[1].push(run(b, threads, &stock(*arch), Optim::Burn, round_budget));
                    measured[2].push(run(b, threads, &tandem, Optim::Tandem(EmbeddingUpdate::Dense), round_budget));
                    measured[3].push(run(b, threads, &tandem, Optim::Tandem(EmbeddingUpdate::Lazy), round_budget));
                }
                let cell = |runs: &[Measured]| {
                    let speed = median(runs.iter().map(|m| m.samples_per_second).collect());
                    let share = median(runs.iter().map(|m| m.optimizer_share).collect());
                    if *cpu {
                        format!(" {speed:.0} ({:.0} %) |", 100.0 * share)
                    } else {
                        format!(" {speed:.0} |")
                    }
                };
                print!("{}", cell(&measured[0]));
                for variant in &measured[1..] {
                    let ratio = median(
                        variant
                            .iter()
                            .zip(&measured[0])
                            .map(|(v, s)| v.samples_per_second / s.samples_per_second)
                            .collect(),
                    );
                    print!("{} {ratio:.2}× |", cell(variant));
                }
                use std::io::Write;
                let _ = std::io::stdout().flush();
            }
            println!();
        }
    }
}
