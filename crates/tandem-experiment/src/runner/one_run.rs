//! One run: its results folder, its progress bar, the training, and its summary. Returns
//! `None` on a rank of a job that skipped a run rank 0 had finished.

use std::path::Path;

use super::console::{human_count, progress_bar, run_name};
use super::context::RunContext;
use super::resume::{self, Plan};
use super::training::dispatch;
use super::{PreparedData, RunError, RunOptions};
use crate::backend::{BackendKind, DeviceSpec};
use crate::manifest::{Manifest, ModelEntry, StrategyConfig};
use crate::results::{self, ClusterInfo, RankLog, RunStatus, RunSummary};

#[allow(clippy::too_many_arguments)]
pub(super) fn run_one(
    manifest: &Manifest,
    entry: &ModelEntry,
    strategy: &StrategyConfig,
    seed: u64,
    backend: BackendKind,
    devices: &[DeviceSpec],
    data: &PreparedData,
    options: &RunOptions,
) -> Result<Option<RunSummary>, RunError> {
    let run_id = run_name(entry, strategy, seed);
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RunError::Results { path, source }
    };
    let ranks = options.job();
    let writes_results = ranks.is_none_or(|r| r.rank() == 0);
    let dir = options.out.join(&manifest.experiment.name).join(&run_id);
    let mut resolved = manifest.for_run(entry, strategy, seed);
    resolved.experiment.backend = backend;
    resolved.experiment.devices = devices.iter().map(ToString::to_string).collect();
    let resolved_toml = resolved.to_toml();
    let (_lock, plan) = match writes_results {
        true => {
            let (lock, plan) = resume::prepare(&dir, &resolved_toml, options.fresh)?;
            (Some(lock), plan)
        }
        false => (None, Plan::Start),
    };
    // Every rank of a job skips what rank 0 skips.
    let skip = match (ranks, &plan) {
        (Some(ranks), _) => {
            let decision = if matches!(plan, Plan::Skip(_)) { "skip" } else { "run" };
            ranks.broadcast_text(if writes_results { decision } else { "" }).map_err(RunError::Config)? == "skip"
        }
        (None, plan) => matches!(plan, Plan::Skip(_)),
    };
    if skip {
        eprintln!("{run_id}: skipped (finished before with the same manifest) → {}", dir.display());
        return Ok(match plan {
            Plan::Skip(summary) => Some(*summary),
            _ => None,
        });
    }
    let plan = match ranks {
        Some(ranks) => resume::agree_across_ranks(ranks, &dir, plan).map_err(RunError::Config)?,
        None => plan,
    };
    let checkpoint = match plan {
        Plan::Resume(checkpoint) => {
            let within = checkpoint.partial.as_ref().map(|p| format!(" and {} steps of the next", p.stats.steps));
            if writes_results {
                eprintln!(
                    "{run_id}: resuming after {} recorded epochs or evaluation points{}",
                    checkpoint.records.len(),
                    within.unwrap_or_default()
                );
            }
            Some(checkpoint)
        }
        _ => None,
    };
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    if writes_results {
        let path = dir.join("manifest.toml");
        results::write_atomic(&path, resolved_toml.as_bytes()).map_err(io_err(&path))?;
        data.vocab.save(&dir.join("vocab.json"))?;
    }

    let threads = strategy.threads(&entry.train);
    let total = (entry.train.epochs * data.train.len()) as u64;
    let progress = progress_bar(options.progress && writes_results, total, &run_id);
    let started_at = results::now_utc();
    let ctx = RunContext {
        entry,
        strategy,
        seed,
        data,
        dir: &dir,
        progress,
        ranks,
        writes_results,
        resume: checkpoint.as_deref(),
    };
    let mut summary = RunSummary {
        format_version: tandem_results::FORMAT_VERSION,
        status: RunStatus::Failed,
        error: None,
        experiment: manifest.experiment.name.clone(),
        run_id: run_id.clone(),
        model: entry.name.clone(),
        architecture: entry.config.architecture().name().into(),
        strategy: strategy.label(),
        backend: backend.name().into(),
        devices: Vec::new(),
        shared_devices: false,
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
        parameters: 0,
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
        manifest_hash: Some(results::manifest_hash(&resolved_toml)),
        reproducibility: None,
        cluster: None,
        kernel_launches_per_step: None,
    };
    // A worker that never returns ends the process; its run's failure is written first.
    if writes_results {
        let (skeleton, path) = (summary.clone(), dir.join("summary.json"));
        tandem_parallel::on_stuck_worker(Some(Box::new(move |message: &str| {
            let mut failed = skeleton.clone();
            failed.error = Some(message.to_string());
            failed.set_epochs(&tandem_results::read_run(path.parent().expect("a run folder")).epochs);
            failed.finished_at = results::now_utc();
            if let Err(e) = results::write_json(&path, &failed) {
                eprintln!("cannot write {}: {e}", path.display());
            }
            eprintln!("{}: FAILED: {message}", failed.run_id);
        })));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("tandem-compute-{i}"))
        .build()
        .map_err(|e| RunError::Config(format!("cannot start {threads} compute threads: {e}")))?;
    let outcome = pool.install(|| dispatch(backend, devices, &ctx));
    let error = outcome.error.clone();
    let (records, parameters) = (outcome.records.clone(), outcome.parameters);
    ctx.progress.finish_and_clear();
    tandem_parallel::on_stuck_worker(None);
    summary.status = match (&error, outcome.interrupted) {
        (_, Some(_)) => RunStatus::Interrupted,
        (Some(_), None) => RunStatus::Failed,
        (None, None) => RunStatus::Finished,
    };
    summary.error = error;
    (summary.devices, summary.shared_devices) = (outcome.devices, outcome.shared_devices);
    summary.parameters = parameters;
    summary.reproducibility = outcome.reproducibility;
    summary.kernel_launches_per_step = outcome.launches_per_step;
    summary.finished_at = results::now_utc();
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
        results::write_json(&log, &RankLog::new(ranks.rank(), ranks.host(), &summary)).map_err(io_err(&log))?;
    } else {
        let path = dir.join("summary.json");
        results::write_json(&path, &summary).map_err(io_err(&path))?;
    }
    if let Some(signal) = outcome.interrupted {
        let within = outcome.stopped_within.map(|steps| format!(" and {steps} steps of the next")).unwrap_or_default();
        eprintln!(
            "{run_id}: interrupted (signal {signal}) after {} recorded epochs or evaluation points{within}; \
             `tandem run {} --out {}` resumes it",
            records.len(),
            manifest.source.display(),
            options.out.display()
        );
        return Ok(Some(summary));
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
            "{run_id}: accuracy {:.4}, macro F1 {:.4}, {:.1} s training, {} samples/s → {}",
            summary.final_metrics.as_ref().map_or(0.0, |m| m.accuracy),
            summary.final_metrics.as_ref().map_or(0.0, |m| m.macro_f1),
            summary.train_seconds,
            human_count(summary.train_samples_per_second),
            dir.display()
        ),
    }
    Ok(Some(summary))
}
