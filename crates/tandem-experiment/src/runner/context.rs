//! What one run needs, whatever the backend: its settings, data, folder, progress bar and place
//! in a multi-process job.

use std::path::Path;

use indicatif::ProgressBar;
use tandem_parallel::Ranks;
use tandem_train::TrainConfig;

use super::resume::Checkpoint;
use super::PreparedData;
use crate::manifest::{ModelEntry, StrategyConfig};

/// Everything a single run needs, independent of the backend type.
pub(super) struct RunContext<'a> {
    pub entry: &'a ModelEntry,
    pub strategy: &'a StrategyConfig,
    /// The model's `[train]` as the strategy trains with it (a data-parallel batch per replica
    /// makes a larger global batch).
    pub train: TrainConfig,
    pub seed: u64,
    pub data: &'a PreparedData,
    pub dir: &'a Path,
    pub progress: ProgressBar,
    /// The job's ranks, in a multi-process run.
    pub ranks: Option<&'a dyn Ranks>,
    /// Whether this process writes the run's results (rank 0 of a job; other ranks write a
    /// `rank-N.json` log only).
    pub writes_results: bool,
    /// Where to continue from (an unfinished run's checkpoint).
    pub resume: Option<&'a Checkpoint>,
}
