//! One run, start to end: its plan, its folder, the training in a pool of compute threads, and
//! its summary written and told. Returns `None` on a rank of a job that skipped a run rank 0 had
//! finished.

use super::console::{counted, human_count, progress_bar};
use super::context::RunContext;
use super::plan::{Action, RunKey, RunPlan};
use super::training::{dispatch, Ending, Outcome};
use super::{PreparedData, RunError, RunOptions};
use crate::backend::{BackendKind, DeviceSpec};
use crate::manifest::Manifest;
use crate::results::{self, ClusterInfo, RankLog, RunStart, RunSummary};

pub(super) fn run_one(
    manifest: &Manifest,
    key: RunKey,
    backend: BackendKind,
    devices: &[DeviceSpec],
    data: &PreparedData,
    options: &RunOptions,
) -> Result<Ran, RunError> {
    let mut plan = RunPlan::make(manifest, key, backend, devices, options)?;
    let resume = match std::mem::replace(&mut plan.action, Action::Start) {
        Action::Skip(summary) => {
            eprintln!("{}: skipped (finished before with the same manifest) → {}", plan.run_id, plan.dir.display());
            return Ok(Ran { summary: summary.map(|s| *s), whole: false });
        }
        Action::Start => None,
        Action::Resume(checkpoint) => {
            if plan.writes_results {
                let within = checkpoint.partial.as_ref().map(|p| format!(" and {} steps of the next", p.stats.steps));
                let done = counted(checkpoint.records.len(), "recorded epoch", "recorded epochs");
                eprintln!(
                    "{}: resuming after {done} (or evaluation points){}",
                    plan.run_id,
                    within.unwrap_or_default()
                );
            }
            Some(checkpoint)
        }
    };
    plan.open_folder(&data.vocab)?;
    let threads = key.strategy.threads(&key.entry.train);
    let train = key.strategy.train_for(&key.entry.train, plan.ranks.map_or(1, |r| r.size()));
    let mut summary = RunSummary::begun(run_start(manifest, &plan, data, threads, train.batch_size));
    let total = (train.epochs * data.train.len()) as u64;
    let ctx = RunContext {
        entry: key.entry,
        strategy: key.strategy,
        train,
        seed: key.seed,
        data,
        dir: &plan.dir,
        progress: progress_bar(options.progress && plan.writes_results, total, &plan.run_id),
        ranks: plan.ranks,
        writes_results: plan.writes_results,
        resume: resume.as_deref(),
    };
    let outcome = {
        let _watch = StuckWorkerWatch::install(&plan, &summary, options.on_stuck_worker);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tandem-compute-{i}"))
            .build()
            .map_err(|e| RunError::Config(format!("cannot start {threads} compute threads: {e}")))?;
        let outcome = pool.install(|| dispatch(backend, devices, &ctx));
        ctx.progress.finish_and_clear();
        outcome
    };
    end_summary(&mut summary, &outcome, &plan);
    write_summary(&plan, &summary)?;
    tell_end(&plan, &summary, &outcome, manifest, options);
    Ok(Ran { summary: Some(summary), whole: resume.is_none() })
}

/// What [`run_one`] did.
pub(super) struct Ran {
    /// The run's summary (`None` on the ranks of a job that do not write results and skipped it).
    pub summary: Option<RunSummary>,
    /// Whether it trained every epoch in this process: not skipped, not resumed (its time is
    /// then the time of the whole run).
    pub whole: bool,
}

/// What the run's summary says before it trains.
fn run_start(manifest: &Manifest, plan: &RunPlan, data: &PreparedData, threads: usize, batch: usize) -> RunStart {
    let RunKey { entry, strategy, seed } = plan.key;
    RunStart {
        experiment: manifest.experiment.name.clone(),
        run_id: plan.run_id.clone(),
        model: entry.name.clone(),
        architecture: entry.config.architecture().name().into(),
        strategy: strategy.label(),
        backend: plan.backend.name().into(),
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
        validation_samples: data.validation.as_ref().map_or(0, |v| v.len()),
        holdout_samples: data.holdout.len(),
        vocab_size: data.vocab.len(),
        max_len: manifest.data.max_len,
        tandem_version: crate::VERSION.into(),
        started_at: results::now_utc(),
        manifest_hash: Some(results::manifest_hash(&plan.resolved_toml)),
        global_batch: Some(batch),
    }
}

/// While it lives, a worker that never returns has the run's failure written (on the rank that
/// writes results), then `end` called: the caller's way to end the process.
struct StuckWorkerWatch;

impl StuckWorkerWatch {
    fn install(plan: &RunPlan, summary: &RunSummary, end: Option<fn()>) -> Self {
        if plan.writes_results {
            let (skeleton, dir) = (summary.clone(), plan.dir.clone());
            tandem_parallel::on_stuck_worker(Some(Box::new(move |message: &str| {
                let mut failed = skeleton.clone();
                failed.error = Some(message.to_string());
                failed.set_epochs(&tandem_results::read_run(&dir).epochs);
                failed.finished_at = results::now_utc();
                let path = dir.join("summary.json");
                if let Err(e) = results::write_json(&path, &failed) {
                    eprintln!("cannot write {}: {e}", path.display());
                }
                eprintln!("{}: FAILED: {message}", failed.run_id);
                if let Some(end) = end {
                    end();
                }
            })));
        }
        Self
    }
}

impl Drop for StuckWorkerWatch {
    fn drop(&mut self) {
        tandem_parallel::on_stuck_worker(None);
    }
}

/// Fills in what the run's training tells.
fn end_summary(summary: &mut RunSummary, outcome: &Outcome, plan: &RunPlan) {
    summary.status = outcome.ending.status();
    summary.error = outcome.ending.error();
    (summary.devices, summary.shared_devices) = (outcome.devices.clone(), outcome.shared_devices);
    summary.parameters = outcome.parameters;
    summary.reproducibility.clone_from(&outcome.reproducibility);
    summary.kernel_launches_per_step = outcome.launches_per_step;
    summary.checkpoints = (outcome.checkpoints.written > 0).then_some(outcome.checkpoints);
    summary.finished_at = results::now_utc();
    summary.set_epochs(&outcome.records);
    if let Some(ranks) = plan.ranks {
        let strategy = plan.key.strategy;
        summary.cluster = Some(match strategy.stages() {
            Some(stages) => ClusterInfo::model_parallel(ranks.size(), stages / ranks.size(), &outcome.records),
            None => ClusterInfo::data_parallel(ranks.size(), strategy.num_devices(), &outcome.records),
        });
    }
}

/// Writes `summary.json`, or on a rank other than 0 its `rank-N.json`.
fn write_summary(plan: &RunPlan, summary: &RunSummary) -> Result<(), RunError> {
    let (path, written) = match plan.ranks.filter(|_| !plan.writes_results) {
        Some(ranks) => {
            let path = plan.dir.join(format!("rank-{}.json", ranks.rank()));
            let written = results::write_json(&path, &RankLog::new(ranks.rank(), ranks.host(), summary));
            (path, written)
        }
        None => {
            let path = plan.dir.join("summary.json");
            let written = results::write_json(&path, summary);
            (path, written)
        }
    };
    written.map_err(RunError::results(&path))
}

/// Tells how the run ended; a run that failed in a multi-process job ends the job.
fn tell_end(plan: &RunPlan, summary: &RunSummary, outcome: &Outcome, manifest: &Manifest, options: &RunOptions) {
    let (run_id, done) = (&plan.run_id, counted(outcome.records.len(), "epoch", "epochs"));
    match (&outcome.ending, plan.ranks) {
        (Ending::Interrupted { signal, within }, _) => {
            let within = within.map(|steps| format!(" and {steps} steps of the next")).unwrap_or_default();
            eprintln!(
                "{run_id}: interrupted (signal {signal}) after {done} (or evaluation points) recorded{within}; \
                 `tandem run {} --out {}` resumes it",
                manifest.source.display(),
                options.out.display()
            );
        }
        // The other ranks may be waiting for this one in a collective: end the job, now that
        // this rank's results are written. A rank other than 0 first leaves rank 0 a moment to
        // write its own, in case the failure struck every rank.
        (Ending::Failed(e), Some(ranks)) => {
            if ranks.rank() != 0 {
                std::thread::sleep(std::time::Duration::from_secs(2));
            }
            ranks.abort(&format!("{run_id} failed on rank {} after {done}: {e}", ranks.rank()))
        }
        (Ending::Failed(e), None) => eprintln!("{run_id}: FAILED after {done}: {e}"),
        (Ending::Finished, _) if !plan.writes_results => {}
        (Ending::Finished, _) => eprintln!(
            "{run_id}: accuracy {:.4}, macro F1 {:.4}, {:.1} s training, {} samples/s → {}",
            summary.final_metrics.as_ref().map_or(0.0, |m| m.accuracy),
            summary.final_metrics.as_ref().map_or(0.0, |m| m.macro_f1),
            summary.train_seconds,
            human_count(summary.train_samples_per_second),
            plan.dir.display()
        ),
    }
}
