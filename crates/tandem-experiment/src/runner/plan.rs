//! What one run is and what to do with it, decided before anything trains: its id, folder and
//! resolved manifest, and whether it is skipped, started or resumed — agreed by every rank of
//! a multi-process job.

use std::path::{Path, PathBuf};

use tandem_data::Vocab;
use tandem_parallel::Ranks;

use super::console::run_name;
use super::resume::{self, Checkpoint, Plan, RunLock};
use super::{RunError, RunOptions};
use crate::backend::{BackendKind, DeviceSpec};
use crate::manifest::{Manifest, ModelEntry, StrategyConfig};
use crate::results::{self, RunSummary};

/// One run of a manifest: a model, a strategy and a seed.
#[derive(Clone, Copy)]
pub(super) struct RunKey<'a> {
    pub entry: &'a ModelEntry,
    pub strategy: &'a StrategyConfig,
    pub seed: u64,
}

/// What happens to a run.
pub(super) enum Action {
    /// Finished before with the same manifest (its summary, on the rank that writes results).
    Skip(Option<Box<RunSummary>>),
    /// Train from the start.
    Start,
    /// Continue after the checkpoint's records.
    Resume(Box<Checkpoint>),
}

/// A run, where it goes and what to do with it. Holds the folder's lock on the rank that
/// writes results, until dropped.
pub(super) struct RunPlan<'a> {
    pub key: RunKey<'a>,
    pub backend: BackendKind,
    pub run_id: String,
    pub dir: PathBuf,
    /// The run's manifest as `manifest.toml` records it: one model, one strategy, one seed.
    pub resolved_toml: String,
    /// The job's ranks, in a multi-process run.
    pub ranks: Option<&'a dyn Ranks>,
    /// Whether this process writes the run's results (rank 0 of a job; other ranks write a
    /// `rank-N.json` log only).
    pub writes_results: bool,
    pub action: Action,
    _lock: Option<RunLock>,
}

impl<'a> RunPlan<'a> {
    /// Resolves the run's manifest, locks its folder and reads what is there (rank 0), and
    /// agrees with the other ranks of a job on skipping, starting or resuming.
    pub fn make(
        manifest: &Manifest,
        key: RunKey<'a>,
        backend: BackendKind,
        devices: &[DeviceSpec],
        options: &'a RunOptions,
    ) -> Result<Self, RunError> {
        let run_id = run_name(key.entry, key.strategy, key.seed);
        let ranks = options.job();
        let writes_results = ranks.is_none_or(|r| r.rank() == 0);
        let dir = options.out.join(&manifest.experiment.name).join(&run_id);
        let mut resolved = manifest.for_run(key.entry, key.strategy, key.seed);
        resolved.experiment.backend = backend;
        resolved.experiment.devices = devices.iter().map(ToString::to_string).collect();
        let resolved_toml = resolved.to_toml();
        let (lock, plan) = match writes_results {
            true => resume::prepare(&dir, &resolved_toml, options.restart).map(|(lock, plan)| (Some(lock), plan))?,
            false => (None, Plan::Start),
        };
        let action = match ranks {
            Some(ranks) => agree(ranks, writes_results, &dir, plan)?,
            None => match plan {
                Plan::Skip(summary) => Action::Skip(Some(summary)),
                Plan::Start => Action::Start,
                Plan::Resume(checkpoint) => Action::Resume(checkpoint),
            },
        };
        Ok(Self { key, backend, run_id, dir, resolved_toml, ranks, writes_results, action, _lock: lock })
    }

    /// Creates the run's folder and, on the rank that writes results, its `manifest.toml` and
    /// `vocab.json`.
    pub fn open_folder(&self, vocab: &Vocab) -> Result<(), RunError> {
        std::fs::create_dir_all(&self.dir).map_err(RunError::results(&self.dir))?;
        if self.writes_results {
            let path = self.dir.join("manifest.toml");
            results::write_atomic(&path, self.resolved_toml.as_bytes()).map_err(RunError::results(&path))?;
            vocab.save(&self.dir.join("vocab.json"))?;
        }
        Ok(())
    }
}

/// Every rank of a job skips what rank 0 skips, and resumes from the same point.
fn agree(ranks: &dyn Ranks, writes_results: bool, dir: &Path, plan: Plan) -> Result<Action, RunError> {
    let decision = match (&plan, writes_results) {
        (_, false) => "",
        (Plan::Skip(_), true) => "skip",
        (_, true) => "run",
    };
    if ranks.broadcast_text(decision).map_err(|e| RunError::Config(e.to_string()))? == "skip" {
        return Ok(Action::Skip(match plan {
            Plan::Skip(summary) => Some(summary),
            _ => None,
        }));
    }
    Ok(match resume::agree_across_ranks(ranks, dir, plan).map_err(RunError::Config)? {
        Plan::Resume(checkpoint) => Action::Resume(checkpoint),
        _ => Action::Start,
    })
}
