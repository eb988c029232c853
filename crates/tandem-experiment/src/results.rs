//! Results folders: `<out>/<experiment>/<run-id>/`, in the format of `tandem-results`. This
//! module re-exports the format's files and their writers.

pub use tandem_results::{
    machine_description, now_utc, write_atomic, write_epochs, write_json, write_sealed, ClusterInfo, RankLog, RunStart,
    RunStatus, RunSummary,
};

/// The hash `summary.json` records of a run's resolved manifest (`manifest_hash`): FNV-1a of
/// its text, in hex.
pub fn manifest_hash(resolved_toml: &str) -> String {
    format!("{:016x}", tandem_parallel::fingerprint(resolved_toml.as_bytes()))
}
