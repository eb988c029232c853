//! Tandem's results format, and its reader and writer. A run writes a folder
//! `<out>/<experiment>/<run-id>/` with the resolved manifest, the vocabulary, one record per
//! evaluation point (`epochs.jsonl`, [`EpochRecord`]) and, last, `summary.json`
//! ([`RunSummary`]). Each record carries the strategy's figures, typed by kind of strategy
//! ([`StrategyFigures`]). [`find_runs`] and [`read_run`] read folders of every format, format 1
//! (figures as untyped maps, [`legacy`]) included; the types' own `Deserialize` reads the
//! current format only.

pub mod backend;
pub mod figures;
pub mod folder;
pub mod judging;
pub mod legacy;
pub mod metrics;
pub mod patched;
pub mod record;
pub mod sealed;
pub mod summary;
pub mod write;

pub use backend::BackendKind;
pub use figures::{
    DataParallelFigures, LinkFigures, PipelineFigures, PipelineRanks, Protocol, StrategyFigures, SyncFigures,
    TrafficPerStep,
};
pub use folder::{find_runs, read_run, FindError, Run, RunState};
pub use judging::{ReportSettings, Target, REPORT_FILE};
pub use metrics::{ClassMetrics, ClassificationMetrics, ConfusionMatrix};
pub use patched::{read_patched, PatchedFile, WriteCost};
pub use record::{EpochRecord, Evaluation, StreamPoint};
pub use sealed::{read_sealed, write_sealed};
pub use summary::{
    machine_description, now_utc, CheckpointWrites, ClusterInfo, RankLog, RunStart, RunStatus, RunSummary,
};
pub use write::{write_atomic, write_epochs, write_json};

/// The results format this build writes: typed strategy figures (`figures`), and
/// `format_version` in `summary.json`.
pub const FORMAT_VERSION: u32 = 2;
