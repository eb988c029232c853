//! Data-parallel speedup on the CPU build: 2 replicas × 1 core against sequential on 1 core
//! (and on 2 cores), per architecture, at the reference shape: batch 64, sequence 64,
//! vocabulary 20,000, embedding 128, on AG News text (the test split's training part).
//!
//!     TANDEM_DATA_DIR=../shared/datasets/ag_news cargo bench -p tandem-parallel --bench data_parallel
//!
//! The last columns bound what data parallelism can reach: a replica computes a shard of half
//! the batch, so 2 replicas reach at most twice the 1-core rate at that half batch.
//!
//! Environment: `TANDEM_BENCH_STEPS` (timed optimizer steps per cell, default 20),
//! `TANDEM_BENCH_HALF_ONLY=1` (only the 1-core half-batch rate, to run two processes at once),
//! `TANDEM_BENCH_ARCHS` (e.g. `cnn,gru`). Every cell runs in the same process, one after the
//! other, so the ratios compare like with like on a noisy machine.

mod common;

use common::{data, measure, model, sequential, settings, train, BATCH, SEQ, VOCAB};
use tandem_parallel::{AllReduceKind, DataParallel, DataParallelConfig};
use tandem_train::TrainStats;

fn main() {
    tandem_train::keep_freed_memory();
    let (steps, archs) = settings();
    let data = data();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("data-parallel training throughput, Flex, samples/s (batch {BATCH}, sequence {SEQ}, vocabulary {VOCAB}, {steps} steps; {cores} cores here)\n");
    println!("| architecture | sequential 1 core | sequential 2 cores | DP 2×1 dense | DP 2×1 | speedup DP / seq 1 core | all-reduce share (dense) | bytes/replica/step dense → rows | sequential 1 core at batch {} | ideal DP (2× that) | 2 independent sequential runs at once, batch {}, summed |", BATCH / 2, BATCH / 2);
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for arch in archs {
        let sequential = |threads: usize, batch: usize| sequential(arch, &data, threads, batch, steps);
        let parallel = |sparse_embedding| {
            let config = DataParallelConfig {
                replicas: 2,
                all_reduce: AllReduceKind::Tree,
                sparse_embedding,
                ..Default::default()
            };
            let mut dp =
                DataParallel::new(model(arch), &train(1), &config, vec![Default::default(); 2]).expect("replicas");
            measure(&mut dp, &data, BATCH, steps)
        };
        if std::env::var("TANDEM_BENCH_HALF_ONLY").is_ok() {
            // For running two bench processes at once: the process-per-replica control.
            println!(
                "{} sequential 1 core batch {}: {:.0} samples/s",
                arch.name(),
                BATCH / 2,
                sequential(1, BATCH / 2)
            );
            continue;
        }
        let (seq1, seq2, half) = (sequential(1, BATCH), sequential(2, BATCH), sequential(1, BATCH / 2));
        // Two unrelated trainings on two threads, no communication at all: what the process
        // (Burn's shared autodiff bookkeeping, the allocator, the memory bus) lets 2 cores do.
        let independent: f64 = std::thread::scope(|scope| {
            let runs: Vec<_> = (0..2).map(|_| scope.spawn(|| sequential(1, BATCH / 2))).collect();
            runs.into_iter().map(|r| r.join().expect("independent run")).sum()
        });
        let (dense, dense_stats) = parallel(false);
        let (sparse, stats) = parallel(true);
        let figures = |s: &TrainStats| s.figures.data_parallel().cloned().expect("data-parallel figures");
        let (figures, dense_figures) = (figures(&stats), figures(&dense_stats));
        println!(
            "| {} | {seq1:.0} | {seq2:.0} | {dense:.0} | {sparse:.0} | **{:.2}×** | {:.1} % ({:.1} %) | {:.1} MB → {:.2} MB | {half:.0} | {:.0} ({:.2}×) | {independent:.0} ({:.2}×) |",
            arch.name(),
            sparse / seq1,
            100.0 * figures.all_reduce_share,
            100.0 * dense_figures.all_reduce_share,
            dense_figures.bytes_sent_per_replica_per_step / 1e6,
            figures.bytes_sent_per_replica_per_step / 1e6,
            2.0 * half,
            2.0 * half / seq1,
            independent / seq1,
        );
    }
}
