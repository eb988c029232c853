//! Results folders: `<out>/<experiment>/<run-id>/`, in the format of `tandem-results`. This
//! module re-exports the format's files and their writers.

pub use tandem_results::{
    machine_description, now_utc, write_atomic, write_epochs, write_json, ClusterInfo, RankLog, RunStatus, RunSummary,
};
