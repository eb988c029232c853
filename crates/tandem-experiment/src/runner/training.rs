//! A run on a concrete backend: the devices started, the model and strategy built, the epochs
//! trained and written as they finish, the model saved.

use std::path::Path;

use burn::tensor::backend::AutodiffBackend;
use indicatif::ProgressBar;
use tandem_models::{Classifier, InputSpec};
use tandem_parallel::{DataParallel, ModelParallel};
use tandem_train::{EpochRecord, Hooks, Point, Sequential, Start, Strategy, TrainError};

use super::checkpoints::{reproducibility, Checkpoints};
use super::context::RunContext;
use super::devices::devices_for;
use super::signals::{agreed_stop, interrupt};
use crate::backend::launches::StepLaunches;
use crate::backend::{with_backend, BackendKind, BackendTask, DeviceSpec};
use crate::manifest::StrategyConfig;
use crate::results;

/// What a finished or failed run returns.
pub(super) struct Outcome {
    pub records: Vec<EpochRecord>,
    pub parameters: usize,
    /// The devices the strategy computed on, as the backend names them.
    pub devices: Vec<String>,
    /// Several replicas or stages on one GPU.
    pub shared_devices: bool,
    pub error: Option<String>,
    /// The signal that stopped the run at an epoch or evaluation point, or part-way through one.
    pub interrupted: Option<i32>,
    /// Steps done of the point the run stopped in (`None`: it stopped between two).
    pub stopped_within: Option<usize>,
    /// What keeps this run from being reproduced bit for bit, if anything.
    pub reproducibility: Option<String>,
    /// GPU kernels launched per training step (GPU backends).
    pub launches_per_step: Option<f64>,
}

impl Outcome {
    fn failed(error: String) -> Self {
        Self {
            records: Vec::new(),
            parameters: 0,
            devices: Vec::new(),
            shared_devices: false,
            error: Some(error),
            interrupted: None,
            stopped_within: None,
            reproducibility: None,
            launches_per_step: None,
        }
    }
}

/// Trains on `backend` with the devices the strategy uses (the first of `devices`, one per
/// replica or stage; on a CPU backend its one device, shared).
pub(super) fn dispatch(backend: BackendKind, devices: &[DeviceSpec], ctx: &RunContext) -> Outcome {
    // In a multi-process job each rank runs its share of the stages (replicas are per rank).
    let wanted = match (ctx.ranks, ctx.strategy.stages()) {
        (Some(ranks), Some(stages)) => stages / ranks.size(),
        _ => ctx.strategy.num_devices(),
    };
    let used = match devices_for(devices, wanted, backend.is_cpu()) {
        Ok(used) => used,
        Err(e) => return Outcome::failed(e),
    };
    let distinct = used.iter().enumerate().filter(|(i, d)| used.iter().position(|u| u == *d) == Some(*i)).count();
    let task = Training { ctx, cpu: backend.is_cpu(), distinct };
    with_backend(backend, &used, task).unwrap_or_else(Outcome::failed)
}

/// A run's training, on whichever backend it names.
struct Training<'a> {
    ctx: &'a RunContext<'a>,
    cpu: bool,
    /// Distinct devices among those used.
    distinct: usize,
}

impl BackendTask for Training<'_> {
    type Output = Outcome;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Outcome {
        train_on::<B>(devices, self.cpu, self.distinct, self.ctx)
    }
}

/// Builds the model and strategy on backend `B` and trains, writing `epochs.jsonl` as it goes.
/// `devices`: one per replica or stage, started, `distinct` of them different. `cpu`: the
/// backend has one device, which every replica or stage shares (one core each).
fn train_on<B: AutodiffBackend>(devices: Vec<B::Device>, cpu: bool, distinct: usize, ctx: &RunContext) -> Outcome {
    let shared_devices = !cpu && distinct < devices.len();
    if shared_devices {
        eprintln!(
            "note: {} replicas or stages share {distinct} GPU(s): a correctness check, not a speedup measurement",
            devices.len()
        );
    }
    let device = devices[0].clone();
    let train = &ctx.entry.train;
    let input = InputSpec {
        vocab_size: ctx.data.vocab.len(),
        max_len: ctx.data.train.max_len,
        num_classes: tandem_data::NUM_CLASSES,
    };
    if let Err(e) = crate::memory::check_fits_in_ram(cpu, &ctx.entry.config, &input, ctx.strategy.model_copies()) {
        return Outcome::failed(e);
    }
    tandem_train::seed_backend::<B>(&device, ctx.seed);
    let model: Classifier<B> = tandem_train::number_parameters(ctx.entry.config.init(&input, &device));
    let parameters = model.parameter_count();
    // A resumed run cuts its model where the interrupted one did.
    let mut config = ctx.strategy.clone();
    if let (Some(mp), Some(checkpoint)) = (config.model_parallel_mut(), ctx.resume) {
        match tandem_parallel::checkpoint_cuts(&checkpoint.strategy) {
            Ok(Some(cuts)) => mp.cuts = Some(cuts),
            Ok(None) => {}
            Err(e) => return Outcome { parameters, ..Outcome::failed(format!("cannot resume: {e}")) },
        }
    }
    let built: Result<Box<dyn Strategy<B>>, String> = match &config {
        StrategyConfig::Sequential(_) => Ok(Box::new(Sequential::new(model, train, device.clone()))),
        StrategyConfig::DataParallel(dp) => DataParallel::new(model, train, dp, devices)
            .and_then(|s| match ctx.ranks {
                Some(ranks) => s.across_ranks(ranks),
                None => Ok(s),
            })
            .map(|s| Box::new(s) as Box<dyn Strategy<B>>),
        StrategyConfig::ModelParallel(mp) => {
            ModelParallel::for_job(model, train, mp, devices, &ctx.data.train, ctx.ranks)
                .map(|s| Box::new(s) as Box<dyn Strategy<B>>)
        }
        StrategyConfig::PredictiveSync(sync) => {
            sync.build(model, train, devices, &ctx.data.train, ctx.ranks).map(|s| Box::new(s) as Box<dyn Strategy<B>>)
        }
        StrategyConfig::LocalLearning(local) => {
            local.build(model, train, devices, &ctx.data.train, ctx.ranks).map(|s| Box::new(s) as Box<dyn Strategy<B>>)
        }
    };
    let mut strategy = match built {
        Ok(strategy) => strategy,
        Err(e) => return Outcome { parameters, shared_devices, ..Outcome::failed(e) },
    };
    let mut written: Vec<EpochRecord> = Vec::new();
    let mut partial = None;
    if let Some(checkpoint) = ctx.resume {
        if let Err(e) = strategy.restore(&checkpoint.strategy) {
            return Outcome { parameters, shared_devices, ..Outcome::failed(format!("cannot resume: {e}")) };
        }
        written.clone_from(&checkpoint.records);
        partial.clone_from(&checkpoint.partial);
    }
    let progress = &ctx.progress;
    let steps_done = written.iter().map(|r| r.steps).chain(partial.iter().map(|p| p.stats.steps)).sum::<usize>();
    progress.inc((steps_done * train.batch_size) as u64);
    // Same initial parameters on every rank (checked), but each rank its own dropout masks.
    let rng_seed = ctx.seed.wrapping_add(ctx.ranks.map_or(0, |r| r.rank() as u64));
    let start = Start { points_done: written.len(), partial, rng_seed };
    let interrupt = interrupt();
    let mut checkpoints = Checkpoints::new(ctx);
    let epochs_path = ctx.dir.join("epochs.jsonl");
    let mut stopped_within = None;
    let step_launches = StepLaunches::new();
    let mut on_point = |point: Point, strategy: &dyn Strategy<B>| {
        step_launches.point();
        let record = match point {
            Point::Recorded(record) => record,
            Point::Paused { points_done, partial } => {
                stopped_within = Some(partial.stats.steps);
                return checkpoints.write(strategy, points_done, Some(partial));
            }
        };
        written.push(record.clone());
        let stop = agreed_stop(ctx.ranks, ctx.strategy.timeout())?;
        if ctx.writes_results {
            print_record(progress, &ctx.dir.file_name().unwrap_or_default().to_string_lossy(), record);
            results::write_epochs(&epochs_path, &written)
                .map_err(|e| format!("cannot write {}: {e}", epochs_path.display()))?;
        }
        checkpoints.write(strategy, written.len(), None)?;
        match stop {
            Some(signal) => Err(format!("interrupted by signal {signal}")),
            None => Ok(()),
        }
    };
    let hooks = Hooks {
        on_batch: &|n: usize| {
            progress.inc(n as u64);
            step_launches.step();
        },
        on_point: &mut on_point,
        interrupt: &|| interrupt.signal().is_some(),
    };
    let result = tandem_train::train(
        strategy.as_mut(),
        train,
        ctx.seed,
        &ctx.data.train,
        &ctx.data.holdout,
        &device,
        hooks,
        start,
    );
    let saved = if ctx.writes_results { save_model(&strategy.model(), &ctx.dir.join("model.bin")) } else { Ok(()) };
    let devices = strategy.devices();
    let interrupted = match &result {
        Err(TrainError::Stopped(_)) => interrupt.signal(),
        _ => None,
    };
    let reproducibility = reproducibility(ctx, cpu);
    let launches_per_step = step_launches.per_step();
    let outcome = Outcome {
        records: Vec::new(),
        parameters,
        devices,
        shared_devices,
        error: None,
        interrupted,
        stopped_within,
        reproducibility,
        launches_per_step,
    };
    match (result, saved) {
        (_, _) if interrupted.is_some() => Outcome { records: written, ..outcome },
        (Ok(_), Ok(())) => {
            checkpoints.remove();
            Outcome { records: written, ..outcome }
        }
        (Ok(_), Err(e)) => Outcome { records: written, error: Some(e), ..outcome },
        (Err(e), _) => Outcome { records: written, error: Some(e.to_string()), ..outcome },
    }
}

/// One line per record, above the progress bar (or on stderr without one).
/// One epoch line (or stream evaluation point), named after the run.
fn print_record(progress: &ProgressBar, run: &str, record: &EpochRecord) {
    let point = match &record.stream {
        Some(at) => format!("pass {:>2}, batch {:>5}", record.epoch, at.batches),
        None => format!("epoch {:>2}", record.epoch),
    };
    let line = format!(
        "  {run} {point}: train loss {:.4}, holdout loss {:.4}, accuracy {:.4}, macro F1 {:.4}, {} samples/s",
        record.train_loss,
        record.holdout_loss,
        record.holdout.accuracy,
        record.holdout.macro_f1,
        super::console::human_count(record.train_samples_per_second)
    );
    if progress.is_hidden() {
        eprintln!("{line}")
    } else {
        progress.println(line)
    }
}

/// Saves the trained parameters to `path` (Burn's binary record, full precision, sealed with its
/// checksum), atomically.
fn save_model<B: AutodiffBackend>(model: &Classifier<B>, path: &Path) -> Result<(), String> {
    let bytes = tandem_train::checkpoint::model_bytes(model)
        .map_err(|e| format!("cannot save the model to {}: {e}", path.display()))?;
    results::write_sealed(path, &bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
