//! The kernels one training step launches (forward, backward, clipping's norm and AdamW) at the
//! reference shape (batch 64 × 64 tokens, vocabulary 20,000; the throughput benchmark's models and
//! batch), one table per architecture, with an estimated time for each on an NVIDIA H100.
//!
//!     cargo bench -p tandem-experiment --bench kernel_table --features wgpu   # or cuda
//!
//! The launches are those the step makes on the first GPU backend compiled in whose device starts
//! (`TANDEM_BENCH_BACKENDS=cuda` or `wgpu` to choose; `TANDEM_BENCH_ARCHS` as in the throughput
//! benchmark): CubeCL's launch spans name every kernel, and each launch of a Tandem kernel writes
//! down what it asks of the device (`tandem_ops::ledger`). Burn's own kernels (matmuls,
//! reductions, element-wise operations, fills) record no shapes, so they are counted and given the
//! launch cost alone. The model, in `H100` below: a kernel takes a fixed launch cost, plus the
//! largest of its bytes over the memory bandwidth, its FLOPs over the f32 peak, and its longest
//! chain of dependent reads at L2 and shared-memory latency times the waves of cubes the SMs run;
//! a step takes the larger of the kernels' sum and the host's cost of queueing them.

use burn::tensor::backend::AutodiffBackend;
use tandem_experiment::backend::{compiled_backends, launches, with_backend, BackendKind, BackendTask, DeviceSpec};
use tandem_models::{Architecture, InputSpec};
use tandem_ops::ledger::{self, Work};
use tandem_testing::{reference_batch, reference_model, REFERENCE_SEQ, REFERENCE_VOCAB};
use tandem_train::optim::AnyOptimizer;
use tandem_train::{tested_gradients, TrainConfig};

const BATCH: usize = 64;

/// The GPU the estimates are for: an NVIDIA H100 SXM, its figures derated to what kernels reach.
mod h100 {
    /// Streaming multiprocessors, and the units and cubes one holds at once.
    pub const SMS: u64 = 132;
    pub const UNITS_PER_SM: u64 = 2_048;
    pub const CUBES_PER_SM: u64 = 32;
    /// HBM3 bandwidth, bytes/s (3.35 TB/s peak).
    pub const BANDWIDTH: f64 = 3.0e12;
    /// f32 arithmetic without tensor cores, FLOP/s (67 TFLOP/s peak).
    pub const FLOPS: f64 = 50e12;
    /// A read from L2 that the next step waits for (about 270 cycles at 1.7 GHz; loops are taken
    /// as compiled, without unrolling, so this is an upper estimate where the compiler unrolls).
    pub const L2_READ: f64 = 0.16e-6;
    /// A step of a loop over shared memory (about 10 cycles: its reads pipeline, two warps a
    /// scheduler issue its instructions).
    pub const SHARED_READ: f64 = 0.006e-6;
    /// A kernel's cost on the device however small: launch, the first wave's start, the drain.
    pub const KERNEL: f64 = 2e-6;
    /// The host's cost of queueing one launch through Burn and CubeCL.
    pub const HOST: f64 = 12e-6;
}

/// A launch's estimated time on the H100, seconds.
fn estimate(work: &Work) -> f64 {
    let resident = (h100::UNITS_PER_SM / work.units.max(1)).clamp(1, h100::CUBES_PER_SM);
    let waves = work.cubes.div_ceil(h100::SMS * resident).max(1) as f64;
    let latency = waves * (work.dependent_reads as f64 * h100::L2_READ + work.shared_reads as f64 * h100::SHARED_READ);
    let memory = work.bytes as f64 / h100::BANDWIDTH;
    let arithmetic = work.flops as f64 / h100::FLOPS;
    h100::KERNEL + latency.max(memory).max(arithmetic)
}

/// The kind of one of Burn's kernels, from CubeCL's name for it.
fn kind_of_burn(name: &str) -> &'static str {
    const KINDS: [(&str, &str); 8] = [
        ("matmul", "Burn: matmul"),
        ("reduce", "Burn: reduction"),
        ("full", "Burn: fill"),
        ("copy", "Burn: copy, slice"),
        ("slice", "Burn: copy, slice"),
        ("into_contiguous", "Burn: copy, slice"),
        ("gather", "Burn: gather, scatter"),
        ("scatter", "Burn: gather, scatter"),
    ];
    let name = name.to_ascii_lowercase();
    KINDS.iter().find(|(key, _)| name.contains(key)).map_or("Burn: element-wise", |(_, kind)| kind)
}

/// A row of the table: one Tandem kernel's launches, or one kind of Burn's.
#[derive(Default)]
struct Row {
    launches: u64,
    /// Summed over the launches; the geometry and chains of the largest launch.
    largest: Option<Work>,
    bytes: u64,
    flops: u64,
    seconds: f64,
}

impl Row {
    fn add(&mut self, work: Option<Work>) {
        self.launches += 1;
        match work {
            Some(work) => {
                self.bytes += work.bytes;
                self.flops += work.flops;
                let seconds = estimate(&work);
                if self.largest.as_ref().is_none_or(|l| estimate(l) < seconds) {
                    self.largest = Some(work);
                }
                self.seconds += seconds;
            }
            None => self.seconds += h100::KERNEL,
        }
    }
}

/// One step's launches as rows: Tandem's kernels by name, Burn's by kind.
fn table(launches: Vec<(String, Option<Work>)>) -> Vec<(String, Row)> {
    let mut rows: Vec<(String, Row)> = Vec::new();
    for (name, work) in launches {
        let label = if work.is_some() { name } else { kind_of_burn(&name).to_string() };
        match rows.iter_mut().find(|(l, _)| *l == label) {
            Some((_, row)) => row.add(work),
            None => {
                let mut row = Row::default();
                row.add(work);
                rows.push((label, row));
            }
        }
    }
    rows
}

/// One training step of `arch` at the reference shape, after two to compile its kernels: the
/// launches' names and the ledger.
struct OneStep(Architecture);

impl BackendTask for OneStep {
    type Output = (Vec<String>, Vec<Work>);

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        let device = &devices[0];
        B::seed(device, 1);
        let input = InputSpec { vocab_size: REFERENCE_VOCAB, max_len: REFERENCE_SEQ, num_classes: 4 };
        let mut model = reference_model(self.0).init::<B>(&input, device);
        let mut optimizer = AnyOptimizer::for_model(&TrainConfig::default(), &model);
        let batch = reference_batch::<B>(BATCH, device);
        let mut step = |model| {
            let (_, grads) = tested_gradients(&model, batch.clone());
            optimizer.step(1e-3, model, grads)
        };
        for _ in 0..2 {
            model = step(model);
        }
        B::sync(device).expect("the device finishes its queued work");
        launches::name_launches();
        ledger::open();
        model = step(model);
        B::sync(device).expect("the device finishes its queued work");
        let works = ledger::close();
        drop(model);
        (launches::named_launches(), works)
    }
}

fn microseconds(seconds: f64) -> String {
    format!("{:.1}", seconds * 1e6)
}

fn print(arch: Architecture, backend: BackendKind, rows: &[(String, Row)]) {
    let launched: u64 = rows.iter().map(|(_, r)| r.launches).sum();
    let gpu: f64 = rows.iter().map(|(_, r)| r.seconds).sum();
    let host = launched as f64 * h100::HOST;
    println!("\n## {} ({launched} launches on {backend})\n", arch.name());
    println!("| kernel | launches | cubes × units | dependent reads (L2 / shared) | MB | MFLOP | H100 µs | share |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows: Vec<&(String, Row)> = rows.iter().collect();
    rows.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
    for (label, row) in rows {
        let (geometry, chains, bytes, flops) = match &row.largest {
            Some(w) => (
                format!("{} × {}", w.cubes, w.units),
                format!("{} / {}", w.dependent_reads, w.shared_reads),
                format!("{:.2}", row.bytes as f64 / 1e6),
                format!("{:.1}", row.flops as f64 / 1e6),
            ),
            None => ("—".into(), "—".into(), "—".into(), "—".into()),
        };
        let share = 100.0 * row.seconds / gpu;
        println!(
            "| {label} | {} | {geometry} | {chains} | {bytes} | {flops} | {} | {share:.1} % |",
            row.launches,
            microseconds(row.seconds)
        );
    }
    let slowest = gpu.max(host);
    println!(
        "\nestimated step: {} µs on the device, {} µs to queue ({launched} × {} µs): {} µs, {:.0} samples/s",
        microseconds(gpu),
        microseconds(host),
        microseconds(h100::HOST),
        microseconds(slowest),
        BATCH as f64 / slowest
    );
}

fn main() {
    let wanted =
        |kind: &str, list: &str| std::env::var(list).ok().is_none_or(|l| l.split(',').any(|n| n.trim() == kind));
    if !launches::install() {
        eprintln!("the kernel table needs a GPU backend: --features wgpu or cuda");
        return;
    }
    let mut gpus = compiled_backends().into_iter().filter(|b| !b.is_cpu() && wanted(b.name(), "TANDEM_BENCH_BACKENDS"));
    let Some(backend) =
        gpus.find(|b| with_backend(*b, &[DeviceSpec::first_of(*b)], OneStep(Architecture::Cnn)).is_ok())
    else {
        eprintln!("no GPU backend's device 0 starts here");
        return;
    };
    println!("# Kernels of one training step, batch {BATCH} × {REFERENCE_SEQ} tokens, estimated for an H100");
    for arch in Architecture::ALL.into_iter().filter(|a| wanted(a.name(), "TANDEM_BENCH_ARCHS")) {
        let (names, works) = with_backend(backend, &[DeviceSpec::first_of(backend)], OneStep(arch))
            .unwrap_or_else(|e| panic!("{arch:?} on {backend}: {e}"));
        let launches = ledger::pair(names, works).unwrap_or_else(|e| panic!("{arch:?}: {e}"));
        print(arch, backend, &table(launches));
    }
}
