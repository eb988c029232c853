//! Tandem's experiment runner: reads a manifest, prepares the data, trains every
//! model × seed with the requested strategy on the requested backend, and writes a
//! results folder per run.

pub mod backend;
pub mod inference;
pub mod manifest;
pub mod memory;
pub mod overrides;
pub mod results;
pub mod runner;

pub use backend::{BackendKind, DeviceSpec};
pub use inference::{InferenceError, Prediction, TrainedRun};
pub use manifest::{Launch, Manifest, ManifestError, ModelEntry, StrategyConfig};
pub use overrides::Override;
pub use results::RunSummary;
pub use runner::{run, Restart, RunOptions};
#[cfg(feature = "mpi")]
pub use tandem_parallel::MpiRanks;
pub use tandem_parallel::{launched_by_mpi, launched_job_size, local_ranks_command, Ranks};

/// Tandem's version, recorded in every results folder.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
