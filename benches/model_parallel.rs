//! Model-parallel speedup on the CPU build: 2 stages × 1 core against sequential on 1 core,
//! per architecture and schedule, at the reference shape (batch 64, sequence 64, vocabulary
//! 20,000, embedding 128), on AG News text (the test split's training part). Stages are
//! balanced by time (a short profiling pass); the pipelined schedules use 8 micro-batches
//! unless `TANDEM_BENCH_MICRO` says otherwise.
//!
//!     TANDEM_DATA_DIR=../shared/datasets/ag_news cargo bench -p tandem-parallel --bench model_parallel
//!
//! The last column runs GPipe over a simulated 1 Gigabit Ethernet link between the stages.
//! Environment: `TANDEM_BENCH_STEPS` (timed optimizer steps per cell, default 20),
//! `TANDEM_BENCH_ARCHS` (e.g. `cnn,gru`), `TANDEM_BENCH_MICRO` (micro-batches, default 8).
//! Every cell runs in the same process, one after the other, so the ratios compare like with
//! like on a noisy machine.

mod common;

use common::{data, measure, model, sequential, settings, train, BATCH, SEQ, VOCAB};
use tandem_parallel::{Interconnect, ModelParallel, ModelParallelConfig, Preset, Schedule};
use tandem_train::TrainStats;

fn main() {
    tandem_train::keep_freed_memory();
    let (steps, archs) = settings();
    let micro: usize = std::env::var("TANDEM_BENCH_MICRO").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let data = data();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("model-parallel training throughput, Flex, samples/s (batch {BATCH}, sequence {SEQ}, vocabulary {VOCAB}, {steps} steps, 2 stages × 1 core, {micro} micro-batches; {cores} cores here)\n");
    println!("| architecture | cut (blocks) | sequential 1 core at batch {BATCH} | at batch {} | naive | GPipe | 1F1B | speedup naive / GPipe / 1F1B vs sequential | idle per stage, naive / GPipe / 1F1B (theory, mean {:.0} % / {:.0} %) | GPipe over 1 GbE | bytes per step |", BATCH / micro, 50.0, 100.0 * tandem_parallel::theoretical_bubble(2, micro));
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for arch in archs {
        let parallel = |schedule, interconnect| {
            let config =
                ModelParallelConfig { stages: 2, schedule, micro_batches: micro, interconnect, ..Default::default() };
            let mut mp = ModelParallel::new(model(arch), &train(1), &config, vec![Default::default(); 2], &data)
                .expect("stages");
            let (rate, stats) = measure(&mut mp, &data, BATCH, steps);
            (rate, stats, mp.cuts().to_vec())
        };
        let seq = sequential(arch, &data, 1, BATCH, steps);
        let micro_seq = sequential(arch, &data, 1, BATCH / micro, steps);
        let none = Interconnect::Preset(Preset::Instant);
        let (naive, naive_stats, cuts) = parallel(Schedule::NAIVE, none);
        let (gpipe, gpipe_stats, _) = parallel(Schedule::GPIPE, none);
        let (one_f_one_b, one_f_one_b_stats, _) = parallel(Schedule::ONE_F_ONE_B, none);
        let (slow, _, _) = parallel(Schedule::GPIPE, Interconnect::Preset(Preset::OneGbE));
        // Per stage: in the naive schedule the stages' idle shares show the balance of the cut.
        let bubble = |s: &TrainStats| {
            let stages = s.figures.pipeline().map(|p| p.bubble_fraction.clone()).unwrap_or_default();
            stages.iter().map(|b| format!("{:.0}", 100.0 * b)).collect::<Vec<_>>().join("/")
        };
        println!(
            "| {} | {cuts:?} | {seq:.0} | {micro_seq:.0} | {naive:.0} | {gpipe:.0} | {one_f_one_b:.0} | {:.2}× / **{:.2}×** / **{:.2}×** | {} / {} / {} % | {slow:.0} ({:.2}×) | {:.2} MB |",
            arch.name(),
            naive / seq,
            gpipe / seq,
            one_f_one_b / seq,
            bubble(&naive_stats),
            bubble(&gpipe_stats),
            bubble(&one_f_one_b_stats),
            slow / seq,
            gpipe_stats.figures.bytes_per_step().unwrap_or(f64::NAN) / 1e6,
        );
    }
}
