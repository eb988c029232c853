//! Training throughput (forward + backward + AdamW step) per architecture, backend and (on
//! CPU backends) thread count, at the reference shape: batch 64, sequence 64, vocabulary 20,000,
//! embedding 128; CNN 100 filters × widths 3/4/5; LSTM/GRU hidden 128; Transformer 2 layers,
//! 4 heads, feed-forward 256.
//!
//!     cargo bench -p tandem-experiment --bench throughput [--features wgpu,cuda]
//!
//! Every backend compiled in is measured; a GPU backend whose device 0 does not start is
//! skipped with a message. GPU rows fill only the first thread-count column, and give the GPU
//! kernels one training step launches (counted in the process, over the timed steps). The last
//! line gives the host reads of device values per training step (the steps' losses and correct
//! counts are kept on the device and read after them, as training reads them at its evaluation
//! points).
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
//! cores), `TANDEM_BENCH_BATCHES` (e.g. `64,256`; default 64), `TANDEM_BENCH_TANDEM_ONLY=1`
//! (only the Tandem variant: no ratios), `TANDEM_BENCH_JSON` (a file to append one JSON line per
//! cell and variant to, for scripts).

use std::time::{Duration, Instant};

use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use tandem_experiment::backend::{compiled_backends, launches, with_backend, BackendKind, BackendTask, DeviceSpec};
use tandem_models::{Architecture, InputSpec, ModelConfig};
use tandem_testing::{reference_batch, reference_model, REFERENCE_SEQ, REFERENCE_VOCAB};
use tandem_train::optim::{adamw_config, AnyOptimizer};
use tandem_train::{host_reads, tested_gradients, EmbeddingUpdate, Tally, TrainConfig};

/// Full training steps timed within a budget.
struct Measured {
    samples_per_second: f64,
    /// Fraction of the time spent in the optimizer step (the rest: forward + backward). On a
    /// GPU it times only the queueing of the step's work, so the table leaves it out there.
    optimizer_share: f64,
    /// GPU kernels launched per training step (none counted on a CPU backend).
    launches_per_step: f64,
    /// Reads of device values the timed steps made (the steps' loss and correct counts are read
    /// once, after them), per step.
    reads_per_step: f64,
}

/// The optimizer of a variant.
#[derive(Clone, Copy)]
enum Optim {
    /// Burn's own AdamW (tensor operations), for the stock baselines.
    Burn,
    /// Tandem's (one-pass AdamW on CPU backends), dense or lazy on the embedding.
    Tandem(EmbeddingUpdate),
}

/// Training steps of one model with one optimizer at one batch size, within a time budget.
#[derive(Clone, Copy)]
struct Cell<'a> {
    config: &'a ModelConfig,
    optim: Optim,
    batch: usize,
    budget: Duration,
}

impl BackendTask for Cell<'_> {
    type Output = Measured;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Measured {
        measure::<B>(self, &devices[0])
    }
}

/// Full training steps within the cell's budget (at least 3 timed steps).
fn measure<B: AutodiffBackend>(cell: Cell, device: &B::Device) -> Measured {
    let batch = cell.batch;
    B::seed(device, 1);
    let input = InputSpec { vocab_size: REFERENCE_VOCAB, max_len: REFERENCE_SEQ, num_classes: 4 };
    let mut model = cell.config.init::<B>(&input, device);
    let train = TrainConfig {
        embedding_update: if let Optim::Tandem(update) = cell.optim { update } else { EmbeddingUpdate::Dense },
        ..Default::default()
    };
    let mut tandem = AnyOptimizer::for_model(&train, &model);
    let mut burn = adamw_config(&train).init::<B, tandem_models::Classifier<B>>();
    let reference = reference_batch::<B>(batch, device);
    let batch_of = || reference.clone();
    let optimizer_time = std::cell::Cell::new(Duration::ZERO);
    let tally = std::cell::RefCell::new(Tally::default());
    let mut step = |model: tandem_models::Classifier<B>| {
        let (measured, grads) = tested_gradients(&model, batch_of());
        tally.borrow_mut().add(measured, batch);
        let started = Instant::now();
        let model = match cell.optim {
            Optim::Burn => burn.step(1e-3, model, grads),
            Optim::Tandem(_) => tandem.step(1e-3, model, grads),
        };
        optimizer_time.set(optimizer_time.get() + started.elapsed());
        model
    };
    // Warm-up: kernel compilation (and autotuning) on a GPU happen in the first steps.
    for _ in 0..2 {
        model = step(model);
    }
    B::sync(device).expect("the device finishes its queued work");
    optimizer_time.set(Duration::ZERO);
    let (launched, read) = (launches::count(), host_reads());
    let started = Instant::now();
    let mut steps = 0;
    while steps < 3 || started.elapsed() < cell.budget {
        model = step(model);
        steps += 1;
    }
    let reads_per_step = (host_reads() - read) as f64 / steps as f64;
    // The steps' measures, read as training reads them: once, after its steps.
    let _ = tally.take().read();
    // GPU backends queue work asynchronously: count it only once it has run.
    B::sync(device).expect("the device finishes its queued work");
    let elapsed = started.elapsed();
    let launches_per_step = (launches::count() - launched) as f64 / steps as f64;
    drop(model);
    Measured {
        samples_per_second: (steps * batch) as f64 / elapsed.as_secs_f64(),
        optimizer_share: optimizer_time.get().as_secs_f64() / (elapsed.as_secs_f64() + 1e-12),
        launches_per_step,
        reads_per_step,
    }
}

/// Measures `cell` on `backend`'s first device.
fn run_cell(backend: BackendKind, cell: Cell) -> Measured {
    with_backend(backend, &[DeviceSpec::first_of(backend)], cell).unwrap_or_else(|e| panic!("{e}"))
}

fn env_list(name: &str) -> Option<Vec<String>> {
    std::env::var(name).ok().map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
}

/// Set in the child process that measures one stock baseline: `architecture,backend,threads,batch`.
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

/// The variants of a cell, in the order the table shows them.
const VARIANTS: [&str; 4] = ["stock", "kept memory", "tandem", "tandem + lazy embedding"];

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
    let batches: Vec<usize> = env_list("TANDEM_BENCH_BATCHES")
        .map(|l| l.iter().filter_map(|b| b.parse().ok()).filter(|&b| b > 0).collect())
        .unwrap_or_else(|| vec![64]);
    let tandem_only = std::env::var("TANDEM_BENCH_TANDEM_ONLY").is_ok_and(|v| v == "1");
    let json = std::env::var("TANDEM_BENCH_JSON").ok();
    let wanted = |b: &BackendKind| env_list("TANDEM_BENCH_BACKENDS").is_none_or(|l| l.iter().any(|n| n == b.name()));
    // A GPU backend whose device does not start here is skipped with a message.
    let backends: Vec<BackendKind> = compiled_backends()
        .into_iter()
        .filter(wanted)
        .filter(|b| {
            let starts =
                b.is_cpu() || child.is_some() || with_backend(*b, &[DeviceSpec::first_of(*b)], Started).is_ok();
            if !starts {
                eprintln!("skipped {b}: its device 0 does not start here");
            }
            starts
        })
        .collect();
    let stock = |arch: Architecture| reference_model(arch).with_fused(false);
    let run = |backend: BackendKind, threads: usize, cell: Cell| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool");
        pool.install(|| run_cell(backend, cell))
    };

    if let Some(cell) = child {
        // The child: one stock measurement with the allocator as the process started, printed
        // as `samples_per_second optimizer_share`.
        let fields: Vec<&str> = cell.split(',').collect();
        let arch = *Architecture::ALL.iter().find(|a| a.name() == fields[0]).expect("a known architecture");
        let backend: BackendKind = fields[1].parse().expect("a compiled backend");
        let config = stock(arch);
        let batch = fields[3].parse().expect("a batch size");
        let m = run(
            backend,
            fields[2].parse().expect("a thread count"),
            Cell { config: &config, optim: Optim::Burn, batch, budget },
        );
        println!("{} {}", m.samples_per_second, m.optimizer_share);
        return;
    }
    tandem_train::keep_freed_memory();
    launches::install();
    let baseline_in_child =
        |arch: Architecture, backend: BackendKind, threads: usize, batch: usize, budget: Duration| {
            let exe = std::env::current_exe().expect("the benchmark's own path");
            let out = std::process::Command::new(exe)
                .args(std::env::args().skip(1))
                .env(BASELINE_CHILD, format!("{},{backend},{threads},{batch}", arch.name()))
                .env("TANDEM_BENCH_SECONDS", budget.as_secs_f64().to_string())
                .stderr(std::process::Stdio::inherit())
                .output()
                .expect("the baseline child runs");
            assert!(out.status.success(), "the baseline child failed: {}", out.status);
            let text = String::from_utf8_lossy(&out.stdout);
            let last = text.lines().last().unwrap_or_default();
            let values: Vec<f64> = last.split_whitespace().filter_map(|v| v.parse().ok()).collect();
            assert_eq!(values.len(), 2, "the baseline child's last line is `{last}`");
            Measured {
                samples_per_second: values[0],
                optimizer_share: values[1],
                launches_per_step: 0.0,
                reads_per_step: 0.0,
            }
        };

    println!(
        "training throughput, samples/s (sequence {REFERENCE_SEQ}, vocabulary {REFERENCE_VOCAB}; {cores} cores here)"
    );
    println!("stock: Burn's own Conv1d / LSTM / GRU / encoder forward and Burn's AdamW, in a process with glibc's");
    println!("default allocation thresholds; kept memory: the same after `tandem_train::keep_freed_memory`;");
    println!("Tandem: its fused modules (same parameters) and one-pass AdamW, with kept memory; lazy embedding: AdamW only on the");
    println!("embedding rows of the batch. Medians of {rounds} interleaved rounds; ratios are medians of each round's");
    println!("ratio to its own stock run. In brackets: on CPU backends the share of the step spent in AdamW, on GPU");
    println!("backends the kernels launched per training step\n");
    print!("| architecture | backend | batch |");
    for t in &threads {
        let s = if *t == 1 { "" } else { "s" };
        match tandem_only {
            true => print!(" Tandem, {t} thread{s} |"),
            false => print!(
                " stock, {t} thread{s} | kept memory | ratio | Tandem | ratio | Tandem + lazy embedding | ratio |"
            ),
        }
    }
    println!();
    let columns = if tandem_only { 1 } else { 7 };
    println!("|---|---|---:|{}", "---:|".repeat(columns * threads.len()));
    let round_budget = budget / rounds as u32;
    let mut most_reads = 0f64;
    for arch in &archs {
        let (tandem, stock) = (reference_model(*arch), stock(*arch));
        for &backend in &backends {
            for &batch in &batches {
                print!("| {} | {backend} | {batch} |", arch.name());
                for (column, &threads) in threads.iter().enumerate() {
                    if !backend.is_cpu() && column > 0 {
                        print!("{}", " — |".repeat(columns));
                        continue;
                    }
                    eprintln!(
                        "measuring {} on {backend} at batch {batch} ({threads} threads), {rounds} rounds…",
                        arch.name()
                    );
                    let cell = |config, optim| Cell { config, optim, batch, budget: round_budget };
                    // Per variant (stock baseline, kept memory, Tandem, Tandem + lazy): each round's result.
                    let mut measured: [Vec<Measured>; 4] = Default::default();
                    for _ in 0..rounds {
                        if !tandem_only {
                            // A GPU's speed does not depend on the host allocator, and a second process
                            // may not get the device (exclusive compute mode): its baseline runs here.
                            measured[0].push(if backend.is_cpu() {
                                baseline_in_child(*arch, backend, threads, batch, round_budget)
                            } else {
                                run(backend, threads, cell(&stock, Optim::Burn))
                            });
                            measured[1].push(run(backend, threads, cell(&stock, Optim::Burn)));
                        }
                        measured[2].push(run(backend, threads, cell(&tandem, Optim::Tandem(EmbeddingUpdate::Dense))));
                        if !tandem_only {
                            let lazy = Optim::Tandem(EmbeddingUpdate::Lazy);
                            measured[3].push(run(backend, threads, cell(&tandem, lazy)));
                        }
                    }
                    most_reads = measured.iter().flatten().map(|m| m.reads_per_step).fold(most_reads, f64::max);
                    let cell_text = |runs: &[Measured]| {
                        let speed = median(runs.iter().map(|m| m.samples_per_second).collect());
                        match backend.is_cpu() {
                            true => {
                                let share = median(runs.iter().map(|m| m.optimizer_share).collect());
                                format!(" {speed:.0} ({:.0} %) |", 100.0 * share)
                            }
                            false => {
                                let launches = median(runs.iter().map(|m| m.launches_per_step).collect());
                                format!(" {speed:.0} ({launches:.0}) |")
                            }
                        }
                    };
                    for (variant, runs) in VARIANTS.iter().zip(&measured).filter(|(_, runs)| !runs.is_empty()) {
                        if let Some(path) = &json {
                            append_json(path, arch.name(), backend, batch, threads, variant, runs);
                        }
                    }
                    if tandem_only {
                        print!("{}", cell_text(&measured[2]));
                    } else {
                        print!("{}", cell_text(&measured[0]));
                        for variant in &measured[1..] {
                            let ratio = median(
                                variant
                                    .iter()
                                    .zip(&measured[0])
                                    .map(|(v, s)| v.samples_per_second / s.samples_per_second)
                                    .collect(),
                            );
                            print!("{} {ratio:.2}× |", cell_text(variant));
                        }
                    }
                    use std::io::Write;
                    let _ = std::io::stdout().flush();
                }
                println!();
            }
        }
    }
    println!("\nhost reads per training step (the most of any cell and variant; the loss and correct counts are read after the steps): {most_reads}");
}

/// Starts a backend's device and does nothing else: [`with_backend`] fails if it does not start.
struct Started;

impl BackendTask for Started {
    type Output = ();

    fn run<B: AutodiffBackend>(self, _devices: Vec<B::Device>) {}
}

/// Appends one JSON line for a cell's variant (medians over its rounds) to `path`.
fn append_json(
    path: &str,
    arch: &str,
    backend: BackendKind,
    batch: usize,
    threads: usize,
    variant: &str,
    runs: &[Measured],
) {
    use std::io::Write;
    let line = serde_json::json!({
        "architecture": arch,
        "backend": backend.name(),
        "batch": batch,
        "threads": threads,
        "variant": variant,
        "samples_per_second": median(runs.iter().map(|m| m.samples_per_second).collect()),
        "kernels_per_step": (!backend.is_cpu()).then(|| median(runs.iter().map(|m| m.launches_per_step).collect())),
        "host_reads_per_step": runs.iter().map(|m| m.reads_per_step).fold(0.0, f64::max),
    });
    let mut file =
        std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    writeln!(file, "{line}").unwrap_or_else(|e| panic!("{path}: {e}"));
}
