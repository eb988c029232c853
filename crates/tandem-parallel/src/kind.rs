//! What a strategy kind of a manifest (`[strategy] kind = "…"`) says of itself: its name and
//! label, the devices it computes on, its checks, and how its strategy is built. The manifest
//! lists the kinds; the runner, the checks and the messages ask the kind.

use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;
use tandem_data::Encoded;
use tandem_models::{Classifier, Invalid};
use tandem_train::{Strategy, TrainConfig};

use crate::{ModelParallelConfig, RankError, Ranks};

/// Why a strategy could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A setting the kind's checks refuse.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// What the strategy was given does not fit its settings (devices, step policies, a model
    /// too short for its stages, a job's ranks).
    #[error("{0}")]
    Mismatch(String),
    /// The job's ranks disagree, or did not answer.
    #[error(transparent)]
    Ranks(#[from] RankError),
    /// The compute threads could not be started.
    #[error("{0}")]
    Threads(String),
    /// Timing the model's blocks on the device (`balance = "time"`) failed.
    #[error("{0}")]
    Profile(String),
}

/// What a strategy is built from, besides its kind's settings.
pub struct Ingredients<'a, B: AutodiffBackend> {
    pub model: Classifier<B>,
    pub train: &'a TrainConfig,
    /// One per replica or stage; in a multi-process job, this rank's.
    pub devices: Vec<B::Device>,
    /// The training data (a model-parallel kind profiles its blocks on it to choose the cuts).
    pub data: &'a Encoded,
    /// The job's ranks, in a multi-process run.
    pub ranks: Option<&'a dyn Ranks>,
}

/// A kind of strategy, as its manifest settings describe it.
pub trait StrategyKind {
    /// `kind = "…"` in a manifest.
    fn name(&self) -> &'static str;
    /// Names the run folder: the kind plus what tells two entries of one kind apart.
    fn label(&self) -> String;
    /// Checks values serde cannot; the error names the field.
    fn validate(&self) -> Result<(), Invalid>;
    /// Devices the strategy computes on: one per replica or stage.
    fn devices(&self) -> usize {
        self.model_parallel().map_or(1, |(mp, _)| mp.stages)
    }
    /// For a kind that cuts the model into stages: its model-parallel settings, and the key that
    /// holds them in the strategy's table (`None`: they are the table's own keys).
    fn model_parallel(&self) -> Option<(&ModelParallelConfig, Option<&'static str>)> {
        None
    }
    fn model_parallel_mut(&mut self) -> Option<&mut ModelParallelConfig> {
        None
    }
    /// Copies of the whole model one process trains (stages each hold a part of one copy).
    fn model_copies(&self) -> usize {
        1
    }
    /// How long the strategy's workers (and the processes of a job) wait for each other.
    fn timeout(&self) -> Duration {
        self.model_parallel().map_or(Duration::MAX, |(mp, _)| Duration::from_secs_f64(mp.timeout_seconds))
    }
    /// Compute threads per device, where the kind sets them instead of `[train] threads`.
    fn threads(&self) -> Option<usize> {
        None
    }
    /// Whether its replicas or stages can be spread over the processes of a job.
    fn spans_ranks(&self) -> bool {
        true
    }
    /// The training settings its runs train with, from the manifest's `train` (`ranks`: the
    /// processes of the job, 1 in a single process): the same, unless the kind's batch is not
    /// `[train] batch_size` (data parallelism with a batch per replica).
    fn train_for(&self, train: &TrainConfig, _ranks: usize) -> TrainConfig {
        train.clone()
    }
    /// The strategy these settings describe, from `with`.
    fn build<B: AutodiffBackend>(&self, with: Ingredients<B>) -> Result<Box<dyn Strategy<B>>, BuildError>
    where
        Self: Sized;
}

/// `timeout_seconds`, how long workers wait for each other: in (0, 1e6].
pub(crate) fn check_timeout(seconds: f64) -> Result<(), Invalid> {
    match seconds > 0.0 && seconds <= 1e6 {
        true => Ok(()),
        false => Err(Invalid::at("timeout_seconds", format!("`timeout_seconds` must be in (0, 1e6], got {seconds}"))),
    }
}
