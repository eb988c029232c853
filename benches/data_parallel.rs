//! Data-parallel speedup on the CPU build: 2 replicas × 1 core against sequential on 1 core
//! (and on 2 cores), per architecture, at the reference shape: batch 64, sequence 64,
//! vocabulary 20,000, embedding 128, on AG News text (the test split's training part). Replicas
//! run as threads of this process and, built with `--features mpi`, as two MPI processes
//! (`mpirun -np 2`, or `$TANDEM_MPIRUN`), under both batch semantics:
//!
//!     TANDEM_DATA_DIR=../shared/datasets/ag_news cargo bench -p tandem-parallel --features mpi --bench data_parallel
//!
//! With `batch = "global"` a replica computes a shard of half the batch, so 2 replicas reach at
//! most twice the 1-core rate at that half batch (the last columns of the first table). With
//! `batch = "per-replica"` each replica trains on a whole batch, as PyTorch's DDP runs it; its
//! ceiling is two sequential trainings in two processes at once, with no exchange at all, and
//! its synchronous ceiling the same two trainings waiting for each other after every step
//! (measured, so a noisy run may exceed either).
//!
//! Environment: `TANDEM_BENCH_STEPS` (timed optimizer steps per cell, default 20),
//! `TANDEM_BENCH_ARCHS` (e.g. `cnn,gru`). Every cell of an architecture runs one after the other
//! (the processes' cells in child processes), and the sequential 1-core rate is the mean of a run
//! before and a run after them, so the ratios compare like with like on a noisy machine.

mod common;

#[cfg(feature = "mpi")]
use common::sequential_with;
use common::{data, measure, model, sequential, settings, train, BATCH, SEQ, VOCAB};
use tandem_data::Encoded;
use tandem_models::Architecture;
use tandem_parallel::{AllReduceKind, BatchSemantics, DataParallel, DataParallelConfig, StrategyKind};
use tandem_train::TrainStats;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// The semantics the child job measures, in order; it reports
/// `process-rate <semantics> <samples/s> <all-reduce share>`.
#[cfg(feature = "mpi")]
const SEMANTICS: [BatchSemantics; 2] = [BatchSemantics::Global, BatchSemantics::PerReplica];
#[cfg(feature = "mpi")]
const PROCESS_RATE: &str = "process-rate";
/// The child job's report of [`lockstep`]: `lockstep-rate <samples/s>`.
#[cfg(feature = "mpi")]
const LOCKSTEP_RATE: &str = "lockstep-rate";

/// What the child job of 2 MPI processes measured for one architecture (`None` where this build
/// has no MPI or the job failed, as reported on standard error).
#[derive(Default)]
struct Processes {
    /// Samples/s and all-reduce share of data parallelism, under each of [`SEMANTICS`].
    data_parallel: [Option<(f64, f64)>; 2],
    /// Samples/s of [`lockstep`].
    lockstep: Option<f64>,
}

/// Set in the children of [`two_processes_at_once`] to the batch they train at; each reports
/// `sequential-rate <samples/s>`.
const SEQUENTIAL_PROCESS: &str = "TANDEM_BENCH_SEQUENTIAL_PROCESS";
const SEQUENTIAL_RATE: &str = "sequential-rate";

fn main() {
    tandem_train::keep_freed_memory();
    let (steps, archs) = settings();
    let data = data();
    if run_as_sequential_process(&archs, &data, steps) || run_as_rank(&archs, &data, steps) {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (mut global, mut per_replica) = (Vec::new(), Vec::new());
    for arch in archs {
        let sequential = |threads: usize, batch: usize| sequential(arch, &data, threads, batch, steps);
        eprintln!("{}…", arch.name());
        let (before, seq2, half) = (sequential(1, BATCH), sequential(2, BATCH), sequential(1, BATCH / 2));
        // Two unrelated trainings on two threads, no communication at all: what the process
        // (Burn's shared autodiff bookkeeping, the allocator, the memory bus) lets 2 cores do.
        let independent: f64 = std::thread::scope(|scope| {
            let runs: Vec<_> = (0..2).map(|_| scope.spawn(|| sequential(1, BATCH / 2))).collect();
            runs.into_iter().map(|r| r.join().expect("independent run")).sum()
        });
        let threads = |batch, sparse_embedding| {
            let config = DataParallelConfig {
                replicas: 2,
                all_reduce: AllReduceKind::Tree,
                sparse_embedding,
                batch,
                ..Default::default()
            };
            let train = config.train_for(&train(1), 1);
            let mut dp =
                DataParallel::new(model(arch), &train, &config, vec![Default::default(); 2]).expect("replicas");
            measure(&mut dp, &data, train.batch_size, steps)
        };
        let (dense, dense_stats) = threads(BatchSemantics::Global, false);
        let (sparse, stats) = threads(BatchSemantics::Global, true);
        let (own_batches, own_stats) = threads(BatchSemantics::PerReplica, true);
        let processes = processes(arch);
        let ceiling = two_processes_at_once(arch, BATCH);
        let seq1 = (before + sequential(1, BATCH)) / 2.0;
        let figures = |s: &TrainStats| s.figures.data_parallel().cloned().expect("data-parallel figures");
        let (own_figures, figures, dense_figures) = (figures(&own_stats), figures(&stats), figures(&dense_stats));
        // A process cell's samples/s, speedup and all-reduce share, or dashes without one.
        let cells = |cell: Option<(f64, f64)>| match cell {
            Some((rate, share)) => {
                [format!("{rate:.0}"), format!("{:.2}×", rate / seq1), format!("{:.1} %", 100.0 * share)]
            }
            None => ["–".to_string(), "–".to_string(), "–".to_string()],
        };
        let ([global_rate, global_speedup, _], [own_rate, own_speedup, own_share]) =
            (cells(processes.data_parallel[0]), cells(processes.data_parallel[1]));
        let name = arch.name();
        global.push(format!(
            "| {name} | {seq1:.0} | {seq2:.0} | {dense:.0} | {sparse:.0} | {global_rate} | **{:.2}×** / **{global_speedup}** | {:.1} % ({:.1} %) | {:.1} MB → {:.2} MB | {half:.0} | {:.0} ({:.2}×) | {independent:.0} ({:.2}×) |",
            sparse / seq1,
            100.0 * figures.all_reduce_share,
            100.0 * dense_figures.all_reduce_share,
            dense_figures.bytes_sent_per_replica_per_step / 1e6,
            figures.bytes_sent_per_replica_per_step / 1e6,
            2.0 * half,
            2.0 * half / seq1,
            independent / seq1,
        ));
        let target = if arch == Architecture::Cnn { 1.6 } else { 1.8 };
        let faster = processes.data_parallel[1].map_or(own_batches, |(rate, _)| rate.max(own_batches));
        // A ceiling's samples/s and speedup, and the faster data parallelism's share of it.
        let bound = |ceiling: Option<f64>| match ceiling {
            Some(rate) => [format!("{rate:.0} ({:.2}×)", rate / seq1), format!("{:.0} %", 100.0 * faster / rate)],
            None => ["–".to_string(), "–".to_string()],
        };
        let ([ceiling, of_ceiling], [lockstep, of_lockstep]) = (bound(ceiling), bound(processes.lockstep));
        per_replica.push(format!(
            "| {name} | {seq1:.0} | {ceiling} | {lockstep} | {own_batches:.0} | {own_rate} | **{:.2}×** | **{own_speedup}** | **{:.2}×** | {of_ceiling} / {of_lockstep} | {:.1} % / {own_share} | {target}× |",
            own_batches / seq1,
            faster / seq1,
            100.0 * own_figures.all_reduce_share,
        ));
    }
    if global.is_empty() {
        return;
    }
    println!("data-parallel training throughput, Flex, samples/s (sequence {SEQ}, vocabulary {VOCAB}, {steps} steps; {cores} cores here)\n");
    println!("`batch = \"global\"`: a batch of {BATCH}, a shard of {} per replica\n", BATCH / 2);
    println!("| architecture | sequential 1 core | sequential 2 cores | DP 2×1 threads, dense | DP 2×1 threads | DP 2×1 processes | speedup threads / processes | all-reduce share (dense) | bytes/replica/step dense → rows | sequential 1 core at batch {} | ideal DP (2× that) | 2 independent sequential runs at once, batch {}, summed |", BATCH / 2, BATCH / 2);
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    global.iter().for_each(|row| println!("{row}"));
    println!("\n`batch = \"per-replica\"`: a batch of {BATCH} per replica, a global batch of {}\n", 2 * BATCH);
    println!("| architecture | sequential 1 core, batch {BATCH} | 2 sequential processes at once (ceiling) | the same in lockstep (synchronous ceiling) | DP 2×1 threads | DP 2×1 processes | speedup threads | speedup processes | speedup, the faster | faster DP / ceiling / synchronous ceiling | all-reduce share threads / processes | target |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    per_replica.iter().for_each(|row| println!("{row}"));
}

/// What a child job of 2 MPI processes measures for `arch`.
fn processes(arch: Architecture) -> Processes {
    #[cfg(feature = "mpi")]
    {
        let exe = std::env::current_exe().expect("this benchmark's path");
        let job = tandem_parallel::local_ranks_command(2, &exe, []).and_then(|(mut job, launcher)| {
            job.env("TANDEM_BENCH_ARCHS", arch.name()).output().map_err(|e| format!("`{launcher}` did not start: {e}"))
        });
        match job {
            Ok(out) if out.status.success() => {
                let text = String::from_utf8_lossy(&out.stdout);
                return Processes {
                    data_parallel: SEMANTICS.map(|semantics| {
                        text.lines().find_map(|line| {
                            let rest =
                                line.strip_prefix(PROCESS_RATE)?.trim().strip_prefix(&format!("{semantics:?} "))?;
                            let mut numbers = rest.split_whitespace().map(|n| n.parse().ok());
                            Some((numbers.next()??, numbers.next()??))
                        })
                    }),
                    lockstep: text.lines().find_map(|line| reported_rate(line, LOCKSTEP_RATE)),
                };
            }
            Ok(out) => eprintln!("the 2-process job failed: {}", String::from_utf8_lossy(&out.stderr)),
            Err(e) => eprintln!("{e}"),
        }
    }
    let _ = arch;
    Processes::default()
}

/// The samples/s of a child's report line `<label> <samples/s>`, if `line` is one.
fn reported_rate(line: &str, label: &str) -> Option<f64> {
    line.strip_prefix(label)?.trim().parse().ok()
}

/// Two sequential 1-core trainings of `arch` at `batch`, in two processes at once with no exchange
/// at all: their summed samples/s, the most two replicas as processes can reach on this machine
/// (`None` if a child failed, which is said).
fn two_processes_at_once(arch: Architecture, batch: usize) -> Option<f64> {
    let run = || -> Result<f64, String> {
        let exe = std::env::current_exe().map_err(|e| format!("this benchmark's path: {e}"))?;
        let mut children = (0..2)
            .map(|_| {
                Command::new(&exe)
                    .env(SEQUENTIAL_PROCESS, batch.to_string())
                    .env("TANDEM_BENCH_ARCHS", arch.name())
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("a sequential process did not start: {e}"))?;
        let mut outputs: Vec<_> = children.iter_mut().filter_map(|c| c.stdout.take().map(BufReader::new)).collect();
        // Both have loaded the data before either starts training.
        for output in &mut outputs {
            let mut line = String::new();
            output.read_line(&mut line).map_err(|e| e.to_string())?;
            if line.trim() != "ready" {
                return Err(format!("a sequential process said {line:?} instead of \"ready\""));
            }
        }
        for child in &mut children {
            child.stdin.take().map(|mut input| input.write_all(b"go\n")).transpose().map_err(|e| e.to_string())?;
        }
        let mut total = 0.0;
        for output in outputs {
            let rate = output.lines().map_while(Result::ok).find_map(|line| reported_rate(&line, SEQUENTIAL_RATE));
            total += rate.ok_or("a sequential process reported no rate")?;
        }
        for mut child in children {
            child.wait().map_err(|e| e.to_string())?;
        }
        Ok(total)
    };
    run().map_err(|e| eprintln!("two sequential processes at once: {e}")).ok()
}

/// In a child that [`two_processes_at_once`] started: once told to go on standard input, trains
/// sequentially on 1 core and prints the rate. Returns whether it was one.
fn run_as_sequential_process(archs: &[Architecture], data: &Encoded, steps: usize) -> bool {
    let Some(batch) = std::env::var(SEQUENTIAL_PROCESS).ok().and_then(|b| b.parse().ok()) else {
        return false;
    };
    println!("ready");
    let mut go = String::new();
    if std::io::stdin().read_line(&mut go).is_ok() {
        for &arch in archs {
            println!("{SEQUENTIAL_RATE} {}", sequential(arch, data, 1, batch, steps));
        }
    }
    true
}

/// In a job `mpirun` started, this process is one rank: one replica each, both semantics, then
/// [`lockstep`], rank 0 printing the rates. Returns whether it was.
fn run_as_rank(archs: &[Architecture], data: &Encoded, steps: usize) -> bool {
    #[cfg(feature = "mpi")]
    if let Some(ranks) = tandem_parallel::MpiRanks::join().expect("joining the MPI job") {
        use tandem_parallel::Ranks;
        for &arch in archs {
            for semantics in SEMANTICS {
                let config = DataParallelConfig { replicas: 1, batch: semantics, ..Default::default() };
                let train = config.train_for(&train(1), ranks.size());
                let mut dp = DataParallel::new(model(arch), &train, &config, vec![Default::default()])
                    .and_then(|dp| dp.across_ranks(&ranks))
                    .expect("replicas across ranks");
                let (rate, stats) = measure(&mut dp, data, train.batch_size, steps);
                let share = stats.figures.data_parallel().map_or(f64::NAN, |f| f.all_reduce_share);
                if ranks.rank() == 0 {
                    println!("{PROCESS_RATE} {semantics:?} {rate} {share}");
                }
            }
            let rate = lockstep(arch, data, steps, &ranks);
            if ranks.rank() == 0 {
                println!("{LOCKSTEP_RATE} {rate}");
            }
        }
        return true;
    }
    let _ = (archs, data, steps);
    false
}

/// Sequential 1-core training of `arch` at batch [`BATCH`] in every rank at once, the ranks waiting
/// for each other after every step (an all-reduce of one number) and exchanging nothing else: the
/// most that synchronous data parallelism can reach on this machine, even with a free exchange.
/// Returns the ranks' summed samples/s.
#[cfg(feature = "mpi")]
fn lockstep(arch: Architecture, data: &Encoded, steps: usize, ranks: &dyn tandem_parallel::Ranks) -> f64 {
    use std::sync::Mutex;
    let timeout = std::time::Duration::from_secs(600);
    let link = Mutex::new(ranks.links(1).expect("a link between the ranks").remove(0));
    let wait_for_all = |_| {
        link.lock().expect("the link").all_reduce_sum(&mut [0.0], timeout).expect("waiting for the other ranks");
    };
    let rate = sequential_with(arch, data, 1, BATCH, steps, &wait_for_all);
    let mut total = [rate as f32];
    link.into_inner().expect("the link").all_reduce_sum(&mut total, timeout).expect("summing the rates");
    f64::from(total[0])
}
