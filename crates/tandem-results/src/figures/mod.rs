//! What a strategy measured over the batches of one record: typed, one struct per kind of
//! strategy, so every reader gets its figures by field and the compiler checks their names.

mod data_parallel;
mod merge;
mod pipeline;
mod sync;

use serde::{Deserialize, Serialize};

pub use data_parallel::DataParallelFigures;
pub use pipeline::{LinkFigures, PipelineFigures, PipelineRanks, TrafficPerStep};
pub use sync::{Protocol, SyncFigures};

/// A strategy's figures, by kind of strategy. In JSON: `"sequential"`, or an object with one
/// key naming the kind (`{"data-parallel": {…}}`, `{"pipeline": {…}}`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "kebab-case")]
#[allow(clippy::large_enum_variant, reason = "one per record, a few per run: boxing would save nothing")]
pub enum StrategyFigures {
    /// One model on one device: nothing to report beyond the record itself.
    #[default]
    Sequential,
    /// Replicas exchanging gradients by all-reduce.
    DataParallel(DataParallelFigures),
    /// Stages in a pipeline (model parallelism, predictive synchronisation).
    Pipeline(PipelineFigures),
}

impl StrategyFigures {
    /// The figures of a data-parallel run.
    pub fn data_parallel(&self) -> Option<&DataParallelFigures> {
        match self {
            Self::DataParallel(figures) => Some(figures),
            _ => None,
        }
    }

    /// The figures of a pipeline run.
    pub fn pipeline(&self) -> Option<&PipelineFigures> {
        match self {
            Self::Pipeline(figures) => Some(figures),
            _ => None,
        }
    }

    /// The predictive-synchronisation figures of a pipeline whose stages skip exchanges.
    pub fn sync(&self) -> Option<&SyncFigures> {
        self.pipeline().and_then(|p| p.sync.as_ref())
    }

    /// Bytes sent between devices per training step; `None` for a strategy that does not
    /// communicate.
    pub fn bytes_per_step(&self) -> Option<f64> {
        match self {
            Self::Sequential => None,
            Self::DataParallel(figures) => Some(figures.bytes_per_step),
            Self::Pipeline(figures) => Some(figures.bytes_per_step),
        }
    }

    /// Share of the step time spent communicating (data parallel: all-reduce time; pipeline:
    /// transfer time, mean over stages); `None` for a strategy that does not communicate.
    pub fn communication_share(&self) -> Option<f64> {
        match self {
            Self::Sequential => None,
            Self::DataParallel(figures) => Some(figures.communication_share),
            Self::Pipeline(figures) => Some(figures.communication_share),
        }
    }

    /// Seconds spent moving data between the processes of a multi-process run (0 in one process).
    pub fn cross_rank_seconds(&self) -> f64 {
        match self {
            Self::Sequential => 0.0,
            Self::DataParallel(figures) => figures.cross_rank_seconds,
            Self::Pipeline(figures) => figures.across_ranks.as_ref().map_or(0.0, |r| r.cross_rank_seconds),
        }
    }
}
