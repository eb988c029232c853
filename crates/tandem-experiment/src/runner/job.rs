//! The checks of a multi-process job, done on every rank before any data is loaded.

use tandem_parallel::{fingerprint, RankError, Ranks};

use super::RunError;
use crate::backend::BackendKind;
use crate::manifest::Manifest;

/// Checks, on every rank of a multi-process job, that all ranks run the same Tandem version,
/// manifest and backend, and that every strategy can span ranks. Any mismatch fails every rank
/// with the same message.
pub(super) fn check_job(manifest: &Manifest, backend: BackendKind, ranks: &dyn Ranks) -> Result<(), RunError> {
    let config = |e: String| RunError::Job(format!("{}: {e}", manifest.source.display()));
    let differ = |e: RankError| config(e.to_string());
    ranks.check_same("Tandem version", fingerprint(crate::VERSION.as_bytes())).map_err(differ)?;
    ranks.check_same("manifest", fingerprint(manifest.to_toml().as_bytes())).map_err(differ)?;
    ranks.check_same("backend", fingerprint(backend.name().as_bytes())).map_err(differ)?;
    check_job_size(manifest, ranks.size())?;
    for strategy in &manifest.strategies {
        let (name, size) = (strategy.name(), ranks.size());
        match (strategy.kind().spans_ranks(), strategy.stages()) {
            (false, _) => {
                return Err(config(format!(
                    "strategy `{name}` runs in one process; only strategies of several replicas or stages span ranks \
                     (run it without mpirun)"
                )))
            }
            (true, Some(stages)) if stages % size != 0 => {
                return Err(config(format!(
                    "strategy `{name}`: its {stages} stages cannot be spread evenly over the job's {size} ranks (make `stages` a multiple of {size})"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Fails when the job does not have the `[cluster] ranks` the manifest asks for.
pub(super) fn check_job_size(manifest: &Manifest, size: usize) -> Result<(), RunError> {
    match manifest.cluster.ranks.filter(|&n| n != size) {
        Some(wanted) => Err(RunError::Job(format!(
            "{}: [cluster] ranks = {wanted}, but the job has {size} (start it with `mpirun -np {wanted} tandem run …`)",
            manifest.source.display()
        ))),
        None => Ok(()),
    }
}
