//! Runs a manifest: data preparation once, then one training run per model × seed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tandem_data::{DataError, Encoded, SplitConfig, Splits, Vocab};
use tandem_models::{Classifier, InputSpec};
use tandem_parallel::{fingerprint, DataParallel, ModelParallel, Ranks};
use tandem_train::{EpochRecord, Sequential, Strategy};

use crate::backend::{compiled_backends, is_compiled, BackendKind, DeviceSpec};
use crate::manifest::{Manifest, ModelEntry, StrategyConfig};
use crate::results::{self, ClusterInfo, RankLog, RunStatus, RunSummary};

/// Command-line choices that override or complete the manifest.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Overrides `[experiment] backend`. Without `devices`, manifest devices of another backend
    /// are replaced by this backend's first device (`cpu`, `wgpu:0`, `cuda:0`).
    pub backend: Option<BackendKind>,
    /// Overrides `[experiment] devices`.
    pub devices: Option<Vec<String>>,
    /// Results root (runs go to `<out>/<experiment>/<run-id>/`).
    pub out: PathBuf,
    /// Draw progress bars (only shown on a terminal).
    pub progress: bool,
    /// This process's place in a multi-process job (`mpirun`); `None` or one rank: a
    /// single-process run.
    pub ranks: Option<Arc<dyn Ranks>>,
}

impl RunOptions {
    /// The ranks of a multi-process job; `None` for a single process (a job of one rank too).
    pub fn job(&self) -> Option<&dyn Ranks> {
        self.ranks.as_deref().filter(|r| r.size() > 1)
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        Self { backend: None, devices: None, out: PathBuf::from("results"), progress: true, ranks: None }
    }
}

/// Why a run could not start or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("{0}")]
    Config(String),
    /// The ranks of a multi-process job disagree (every rank gets this same error).
    #[error("{0}")]
    Job(String),
    #[error("cannot write results to {path}: {source}")]
    Results { path: PathBuf, source: std::io::Error },
    #[error("{failed} of {total} runs failed (see their summary.json); the others finished")]
    RunsFailed { failed: usize, total: usize },
}

impl RunError {
    /// Whether the error means "no dataset found" (the caller may offer `tandem data fetch`).
    pub fn is_missing_data(&self) -> bool {
        matches!(self, RunError::Data(DataError::NoData { .. }))
    }

    /// Whether every rank of a multi-process job failed with this same error (so they can all
    /// stop normally; otherwise the failing rank must end the job).
    pub fn is_on_every_rank(&self) -> bool {
        matches!(self, RunError::Job(_))
    }
}

/// The prepared data every run of an experiment shares.
pub struct PreparedData {
    pub splits_description: String,
    pub vocab: Vocab,
    pub train: Encoded,
    pub holdout: Encoded,
}

/// Loads the splits and builds the vocabulary from the training split only.
pub fn prepare_data(manifest: &Manifest) -> Result<PreparedData, RunError> {
    let d = &manifest.data;
    let split = SplitConfig {
        holdout_fraction: d.holdout_fraction,
        seed: d.split_seed,
        verify_md5: d.verify_md5,
        max_train: d.max_train_rows,
        max_holdout: d.max_holdout_rows,
    };
    let Splits { train, holdout, description } = tandem_data::load_splits_with(&manifest.data_dir(), &split)?;
    let vocab = Vocab::build(train.iter().map(|s| s.text()), &d.vocab);
    Ok(PreparedData {
        splits_description: description,
        train: Encoded::new(&train, &vocab, d.max_len),
        holdout: Encoded::new(&holdout, &vocab, d.max_len),
        vocab,
    })
}

/// Runs every model × seed of `manifest`; returns the summaries of all runs.
/// A failed run is recorded (with the epochs it finished) and the others still run.
pub fn run(manifest: &Manifest, options: &RunOptions) -> Result<Vec<RunSummary>, RunError> {
    let backend = options.backend.unwrap_or(manifest.experiment.backend);
    if !is_compiled(backend) {
        return Err(RunError::Config(format!(
            "backend `{backend}` is not compiled into this build (it has: {}); rebuild with `--features {backend}`",
            compiled_backends().iter().map(|b| b.name()).collect::<Vec<_>>().join(", ")
        )));
    }
    let devices = run_devices(manifest, options, backend)?;
    let ranks = options.job();
    match ranks {
        Some(ranks) => check_job(manifest, backend, ranks)?,
        None => check_job_size(manifest, 1)?,
    }
    let data = prepare_data(manifest)?;
    if let Some(ranks) = ranks {
        let split: Vec<u8> =
            data.train.tokens.iter().chain(&data.holdout.tokens).flat_map(|t| t.to_le_bytes()).collect();
        ranks.check_same("data (train and holdout tokens)", fingerprint(&split)).map_err(RunError::Job)?;
    }
    let mut summaries = Vec::new();
    for model in &manifest.models {
        for strategy in &manifest.strategies {
            for &seed in &manifest.experiment.seeds {
                summaries.push(run_one(manifest, model, strategy, seed, backend, &devices, &data, options)?);
            }
        }
    }
    let failed = summaries.iter().filter(|s| s.status == RunStatus::Failed).count();
    if failed > 0 {
        return Err(RunError::RunsFailed { failed, total: summaries.len() });
    }
    Ok(summaries)
}

/// Checks, on every rank of a multi-process job, that all ranks run the same Tandem version,
/// manifest and backend, and that every strategy can span ranks. Any mismatch fails every rank
/// with the same message.
fn check_job(manifest: &Manifest, backend: BackendKind, ranks: &dyn Ranks) -> Result<(), RunError> {
    let config = |m: String| RunError::Job(format!("{}: {m}", manifest.source.display()));
    ranks.check_same("Tandem version", fingerprint(crate::VERSION.as_bytes())).map_err(config)?;
    ranks.check_same("manifest", fingerprint(manifest.to_toml().as_bytes())).map_err(config)?;
    ranks.check_same("backend", fingerprint(backend.name().as_bytes())).map_err(config)?;
    check_job_size(manifest, ranks.size())?;
    for strategy in &manifest.strategies {
        match (strategy, strategy.stages()) {
            (StrategyConfig::DataParallel(_), _) => {}
            (_, Some(stages)) if stages % ranks.size() == 0 => {}
            (_, Some(stages)) => {
                return Err(config(format!(
                    "strategy `{}`: its {stages} stages cannot be spread evenly over the job's {} ranks (make `stages` a multiple of {})",
                    strategy.name(),
                    ranks.size(),
                    ranks.size()
                )))
            }
            (_, None) => {
                return Err(config(format!(
                    "strategy `{}` runs in one process; data-parallel, model-parallel and predictive-sync span ranks (run it without mpirun)",
                    strategy.name()
                )))
            }
        }
    }
    Ok(())
}

/// Fails when the job does not have the `[cluster] ranks` the manifest asks for.
fn check_job_size(manifest: &Manifest, size: usize) -> Result<(), RunError> {
    match manifest.cluster.ranks.filter(|&n| n != size) {
        Some(wanted) => Err(RunError::Job(format!(
            "{}: [cluster] ranks = {wanted}, but the job has {size} (start it with `mpirun -np {wanted} tandem run …`)",
            manifest.source.display()
        ))),
        None => Ok(()),
    }
}

/// The devices to run on: `--devices`, else the manifest's, else (when `--backend` chose a
/// backend the manifest's devices do not belong to) that backend's first device.
fn run_devices(manifest: &Manifest, options: &RunOptions, backend: BackendKind) -> Result<Vec<DeviceSpec>, RunError> {
    let parse = |names: &[String], origin: &str| {
        names
            .iter()
            .map(|d| d.parse::<DeviceSpec>().and_then(|s| s.check_backend(backend).map(|_| s)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|m| RunError::Config(format!("{origin}: {m}")))
    };
    if let Some(names) = &options.devices {
        return parse(names, "--devices");
    }
    let from_manifest =
        parse(&manifest.experiment.devices, &format!("{}: [experiment] devices", manifest.source.display()));
    match (from_manifest, options.backend) {
        (Err(_), Some(_)) => Ok(vec![DeviceSpec::first_of(backend)]),
        (result, _) => result,
    }
}

/// Everything a single run needs, independent of the backend type.
struct RunContext<'a> {
    entry: &'a ModelEntry,
    strategy: &'a StrategyConfig,
    seed: u64,
    data: &'a PreparedData,
    dir: &'a Path,
    progress: ProgressBar,
    /// The job's ranks, in a multi-process run.
    ranks: Option<&'a dyn Ranks>,
    /// Whether this process writes the run's results (rank 0 of a job; other ranks write a
    /// `rank-N.json` log only).
    writes_results: bool,
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    manifest: &Manifest,
    entry: &ModelEntry,
    strategy: &StrategyConfig,
    seed: u64,
    backend: BackendKind,
    devices: &[DeviceSpec],
    data: &PreparedData,
    options: &RunOptions,
) -> Result<RunSummary, RunError> {
    let run_id = format!("{}-{}-seed{seed}", entry.name, strategy.label());
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RunError::Results { path, source }
    };
    let ranks = options.job();
    let writes_results = ranks.is_none_or(|r| r.rank() == 0);
    let (dir, run_id) = match ranks {
        None => {
            results::create_run_dir(&options.out, &manifest.experiment.name, &run_id).map_err(io_err(&options.out))?
        }
        // Rank 0 picks the folder name; the others log into the same folder (theirs, on
        // machines that do not share rank 0's disk).
        Some(ranks) => {
            let picked = if writes_results {
                results::create_run_dir(&options.out, &manifest.experiment.name, &run_id)
                    .map_err(io_err(&options.out))?
                    .1
            } else {
                String::new()
            };
            let run_id = ranks.broadcast_text(&picked).map_err(RunError::Config)?;
            let dir = options.out.join(&manifest.experiment.name).join(&run_id);
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            (dir, run_id)
        }
    };
    let mut resolved = manifest.for_run(entry, strategy, seed);
    resolved.experiment.backend = backend;
    resolved.experiment.devices = devices.iter().map(ToString::to_string).collect();
    if writes_results {
        results::write_atomic(&dir.join("manifest.toml"), resolved.to_toml().as_bytes()).map_err(io_err(&dir))?;
        data.vocab.save(&dir.join("vocab.json"))?;
    }

    let threads = strategy.threads(&entry.train);
    let total = (entry.train.epochs * data.train.len()) as u64;
    let progress = progress_bar(options.progress && writes_results, total, &run_id);
    let started_at = results::now_utc();
    let ctx = RunContext { entry, strategy, seed, data, dir: &dir, progress, ranks, writes_results };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("tandem-compute-{i}"))
        .build()
        .map_err(|e| RunError::Config(format!("cannot start {threads} compute threads: {e}")))?;
    let outcome = pool.install(|| dispatch(backend, devices, &ctx));
    let error = outcome.error;
    let (records, parameters) = (outcome.records, outcome.parameters);
    ctx.progress.finish_and_clear();
    let mut summary = RunSummary {
        format_version: tandem_results::FORMAT_VERSION,
        status: if error.is_some() { RunStatus::Failed } else { RunStatus::Finished },
        error,
        experiment: manifest.experiment.name.clone(),
        run_id: run_id.clone(),
        model: entry.name.clone(),
        architecture: entry.config.architecture().name().into(),
        strategy: strategy.label(),
        backend: backend.name().into(),
        devices: outcome.devices,
        shared_devices: outcome.shared_devices,
        machine: results::machine_description(),
        threads_per_device: threads,
        seed,
        data: match &entry.train.stream {
            Some(stream) => format!(
                "{}, as a stream ({} passes in one fixed order, holdout every {} batches)",
                data.splits_description, entry.train.epochs, stream.eval_every
            ),
            None => data.splits_description.clone(),
        },
        train_samples: data.train.len(),
        holdout_samples: data.holdout.len(),
        vocab_size: data.vocab.len(),
        max_len: manifest.data.max_len,
        parameters,
        epochs_completed: 0,
        train_seconds: 0.0,
        eval_seconds: 0.0,
        train_samples_per_second: 0.0,
        final_metrics: None,
        final_holdout_loss: None,
        best_epoch: None,
        best_accuracy: None,
        prequential_accuracy: None,
        prequential_samples: 0,
        tandem_version: crate::VERSION.into(),
        started_at,
        finished_at: results::now_utc(),
        figures: Default::default(),
        cluster: None,
    };
    summary.set_epochs(&records);
    if let Some(ranks) = ranks {
        summary.cluster = Some(match strategy.stages() {
            Some(stages) => ClusterInfo::model_parallel(ranks.size(), stages / ranks.size(), &records),
            None => ClusterInfo::data_parallel(ranks.size(), strategy.num_devices(), &records),
        });
    }
    if !writes_results {
        let ranks = ranks.expect("only a rank other than 0 does not write results");
        let log = dir.join(format!("rank-{}.json", ranks.rank()));
        results::write_json(&log, &RankLog::new(ranks.rank(), ranks.host(), &summary)).map_err(io_err(&dir))?;
    } else {
        results::write_json(&dir.join("summary.json"), &summary).map_err(io_err(&dir))?;
    }
    match (&summary.error, ranks) {
        // The other ranks may be waiting for this one in a collective: end the job, now that
        // this rank's results are written. A rank other than 0 first leaves rank 0 a moment to
        // write its own, in case the failure struck every rank.
        (Some(e), Some(ranks)) => {
            if ranks.rank() != 0 {
                std::thread::sleep(std::time::Duration::from_secs(2));
            }
            ranks.abort(&format!("{run_id} failed on rank {} after {} epochs: {e}", ranks.rank(), records.len()))
        }
        (Some(e), None) => eprintln!("{run_id}: FAILED after {} epochs: {e}", records.len()),
        (None, _) if !writes_results => {}
        (None, _) => eprintln!(
            "{run_id}: accuracy {:.4}, macro F1 {:.4}, {:.1} s training, {:.0} samples/s → {}",
            summary.final_metrics.as_ref().map_or(0.0, |m| m.accuracy),
            summary.final_metrics.as_ref().map_or(0.0, |m| m.macro_f1),
            summary.train_seconds,
            summary.train_samples_per_second,
            dir.display()
        ),
    }
    Ok(summary)
}

fn progress_bar(enabled: bool, total: u64, label: &str) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    // stderr target: drawn only when stderr is a terminal.
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} samples, {per_sec}, eta {eta} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label.to_string());
    bar
}

/// What a finished or failed run returns.
struct Outcome {
    records: Vec<EpochRecord>,
    parameters: usize,
    /// The devices the strategy computed on, as the backend names them.
    devices: Vec<String>,
    /// Several replicas or stages on one GPU.
    shared_devices: bool,
    error: Option<String>,
}

impl Outcome {
    fn failed(error: String) -> Self {
        Self { records: Vec::new(), parameters: 0, devices: Vec::new(), shared_devices: false, error: Some(error) }
    }
}

/// Picks the concrete backend type and the devices for a run.
#[allow(unused_variables)] // `devices`: only GPU backends read it
fn dispatch(backend: BackendKind, devices: &[DeviceSpec], ctx: &RunContext) -> Outcome {
    use burn::backend::Autodiff;
    // CPU backends have one device (a device is `threads` cores); GPU backends pick by index.
    // (Each helper is unused in builds without its kind of backend.)
    #[allow(dead_code)]
    fn cpu<D: Default>() -> Vec<(String, D)> {
        vec![("cpu".to_string(), D::default())]
    }
    #[allow(dead_code)]
    fn gpus<D>(devices: &[DeviceSpec], device: impl Fn(usize) -> D) -> Vec<(String, D)> {
        devices.iter().map(|d| (d.to_string(), device(d.index))).collect()
    }
    match backend {
        #[cfg(feature = "flex")]
        BackendKind::Flex => train_on::<Autodiff<burn::backend::Flex>>(cpu(), true, ctx),
        #[cfg(feature = "ndarray")]
        BackendKind::Ndarray => train_on::<Autodiff<burn::backend::NdArray>>(cpu(), true, ctx),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => {
            train_on::<Autodiff<burn::backend::Wgpu>>(gpus(devices, crate::backend::wgpu_device), false, ctx)
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            train_on::<Autodiff<burn::backend::Cuda>>(gpus(devices, burn::backend::cuda::CudaDevice::new), false, ctx)
        }
        #[allow(unreachable_patterns)]
        other => Outcome::failed(format!("backend `{other}` is not compiled into this build")),
    }
}

/// The devices of `n` replicas or stages: on a CPU backend (one device) the same device `n`
/// times; on a GPU backend the first `n` devices listed in `[experiment] devices`.
fn devices_for<D: Clone>(available: &[D], n: usize, cpu: bool) -> Result<Vec<D>, String> {
    match (cpu, available.len() >= n) {
        (true, _) => Ok(vec![available[0].clone(); n]),
        (false, true) => Ok(available[..n].to_vec()),
        (false, false) => Err(format!(
            "the strategy needs {n} devices but the run has {} ([experiment] devices, or --devices): list one per replica or stage, e.g. `--devices cuda:0,cuda:1`, or one GPU twice to share it",
            available.len()
        )),
    }
}

/// Builds the model and strategy on backend `B` and trains, writing `epochs.jsonl` as it goes.
/// `devices`: the manifest's devices with their names. `cpu`: the backend has one device, which
/// every replica or stage shares (one core each); a GPU device is probed before use.
fn train_on<B: AutodiffBackend>(devices: Vec<(String, B::Device)>, cpu: bool, ctx: &RunContext) -> Outcome {
    // In a multi-process job each rank runs its share of the stages (replicas are per rank).
    let wanted = match (ctx.ranks, ctx.strategy.stages()) {
        (Some(ranks), Some(stages)) => stages / ranks.size(),
        _ => ctx.strategy.num_devices(),
    };
    let used = match devices_for(&devices, wanted, cpu) {
        Ok(used) => used,
        Err(e) => return Outcome::failed(e),
    };
    let mut distinct: Vec<&(String, B::Device)> = Vec::new();
    for pair in &used {
        if !distinct.iter().any(|(name, _)| *name == pair.0) {
            distinct.push(pair);
        }
    }
    if !cpu {
        for (name, device) in &distinct {
            if let Err(e) = crate::backend::probe_device::<B>(name, device) {
                return Outcome::failed(e);
            }
        }
    }
    let shared_devices = !cpu && distinct.len() < used.len();
    if shared_devices {
        eprintln!(
            "note: {} replicas or stages share {} GPU(s): a correctness check, not a speedup measurement",
            used.len(),
            distinct.len()
        );
    }
    let devices: Vec<B::Device> = used.into_iter().map(|(_, device)| device).collect();
    let device = devices[0].clone();
    let train = &ctx.entry.train;
    let input = InputSpec {
        vocab_size: ctx.data.vocab.len(),
        max_len: ctx.data.train.max_len,
        num_classes: tandem_data::NUM_CLASSES,
    };
    tandem_train::seed_backend::<B>(&device, ctx.seed);
    let model: Classifier<B> = ctx.entry.config.init(&input, &device);
    let parameters = model.parameter_count();
    let built: Result<Box<dyn Strategy<B>>, String> = match ctx.strategy {
        StrategyConfig::Sequential(_) => Ok(Box::new(Sequential::new(model, train, device.clone()))),
        StrategyConfig::DataParallel(dp) => DataParallel::new(model, train, dp, devices)
            .and_then(|s| match ctx.ranks {
                Some(ranks) => s.across_ranks(ranks),
                None => Ok(s),
            })
            .map(|s| Box::new(s) as Box<dyn Strategy<B>>),
        StrategyConfig::ModelParallel(mp) => match ctx.ranks {
            Some(ranks) => ModelParallel::across_ranks(model, train, mp, devices, &ctx.data.train, ranks),
            None => ModelParallel::new(model, train, mp, devices, &ctx.data.train),
        }
        .map(|s| Box::new(s) as Box<dyn Strategy<B>>),
        StrategyConfig::PredictiveSync(sync) => {
            sync.build(model, train, devices, &ctx.data.train, ctx.ranks).map(|s| Box::new(s) as Box<dyn Strategy<B>>)
        }
    };
    let mut strategy = match built {
        Ok(strategy) => strategy,
        Err(e) => return Outcome { parameters, shared_devices, ..Outcome::failed(e) },
    };
    if let Some(ranks) = ctx.ranks {
        // Same initial parameters everywhere (checked), but each rank its own dropout masks.
        tandem_train::seed_backend::<B>(&device, ctx.seed.wrapping_add(ranks.rank() as u64));
    }
    let epochs_path = ctx.dir.join("epochs.jsonl");
    let mut written: Vec<EpochRecord> = Vec::new();
    let progress = &ctx.progress;
    let on_batch = |n: usize| progress.inc(n as u64);
    let mut on_epoch = |record: &EpochRecord| {
        written.push(record.clone());
        if !ctx.writes_results {
            return Ok(());
        }
        let point = match &record.stream {
            Some(at) => format!("pass {:>2}, batch {:>5}", record.epoch, at.batches),
            None => format!("epoch {:>2}", record.epoch),
        };
        let line = format!(
            "  {point}: train loss {:.4}, holdout loss {:.4}, accuracy {:.4}, macro F1 {:.4}, {:.0} samples/s",
            record.train_loss,
            record.holdout_loss,
            record.holdout.accuracy,
            record.holdout.macro_f1,
            record.train_samples_per_second
        );
        if progress.is_hidden() {
            eprintln!("{line}")
        } else {
            progress.println(line)
        }
        results::write_epochs(&epochs_path, &written)
            .map_err(|e| format!("cannot write {}: {e}", epochs_path.display()))
    };
    let result = tandem_train::train(
        strategy.as_mut(),
        train,
        ctx.seed,
        &ctx.data.train,
        &ctx.data.holdout,
        &device,
        &on_batch,
        &mut on_epoch,
    );
    let saved = if ctx.writes_results { save_model(&strategy.model(), &ctx.dir.join("model")) } else { Ok(()) };
    let devices = strategy.devices();
    match result.map_err(|e| e.to_string()).and_then(|records| saved.map(|()| records)) {
        Ok(records) => Outcome { records, parameters, devices, shared_devices, error: None },
        Err(e) => Outcome { records: written, parameters, devices, shared_devices, error: Some(e) },
    }
}

/// Saves the trained parameters as `<path>.bin` (Burn's binary record, full precision).
fn save_model<B: AutodiffBackend>(model: &Classifier<B>, path: &Path) -> Result<(), String> {
    use burn::module::Module;
    use burn::record::{BinFileRecorder, FullPrecisionSettings};
    model
        .clone()
        .save_file(path, &BinFileRecorder::<FullPrecisionSettings>::new())
        .map_err(|e| format!("cannot save the model to {}.bin: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(devices: &str) -> Manifest {
        let text = format!("[experiment]\nname = \"d\"\nbackend = \"flex\"\ndevices = {devices}\n[[models]]\nname = \"cnn\"\narchitecture = \"cnn\"\n");
        Manifest::parse(&text, Path::new("d.toml")).unwrap()
    }

    fn resolve(devices: &str, backend: Option<BackendKind>, flag: Option<&[&str]>) -> Result<Vec<String>, String> {
        let m = manifest(devices);
        let options = RunOptions {
            backend,
            devices: flag.map(|d| d.iter().map(ToString::to_string).collect()),
            ..Default::default()
        };
        run_devices(&m, &options, backend.unwrap_or(m.experiment.backend))
            .map(|d| d.iter().map(ToString::to_string).collect())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn devices_come_from_the_flag_the_manifest_or_the_chosen_backend() {
        assert_eq!(resolve(r#"["cpu"]"#, None, None).unwrap(), ["cpu"]);
        // `--backend cuda` on a CPU manifest: that backend's first device.
        assert_eq!(resolve(r#"["cpu"]"#, Some(BackendKind::Cuda), None).unwrap(), ["cuda:0"]);
        assert_eq!(
            resolve(r#"["cpu"]"#, Some(BackendKind::Wgpu), Some(&["wgpu:0", "wgpu:0"])).unwrap(),
            ["wgpu:0", "wgpu:0"]
        );
        let err = resolve(r#"["cpu"]"#, Some(BackendKind::Cuda), Some(&["cuda:0", "wgpu:1"])).unwrap_err();
        assert!(err.contains("--devices") && err.contains("wgpu:1") && err.contains("cuda"), "{err}");
        let err = resolve(r#"["cpu"]"#, None, Some(&["gpu0"])).unwrap_err();
        assert!(err.contains("--devices") && err.contains("gpu0"), "{err}");
        // CubeCL numbers devices with u16: a larger number must not wrap around to another GPU.
        let err = resolve(r#"["cpu"]"#, Some(BackendKind::Cuda), Some(&["cuda:65536"])).unwrap_err();
        assert!(err.contains("cuda:65536") && err.contains("0–65535"), "{err}");
    }
}
