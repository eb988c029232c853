//! Results folders: `<out>/<experiment>/<run-id>/`, in the format of `tandem-results`. This
//! module names a fresh folder for each run; the files and their writers are the format's.

use std::path::{Path, PathBuf};

pub use tandem_results::{
    machine_description, now_utc, write_atomic, write_epochs, write_json, ClusterInfo, RankLog, RunStatus, RunSummary,
};

/// Creates a fresh run folder `<out>/<experiment>/<run-id>` (suffixing `-2`, `-3`… if taken).
pub fn create_run_dir(out: &Path, experiment: &str, run_id: &str) -> std::io::Result<(PathBuf, String)> {
    let parent = out.join(experiment);
    std::fs::create_dir_all(&parent)?;
    for attempt in 1.. {
        let id = if attempt == 1 { run_id.to_string() } else { format!("{run_id}-{attempt}") };
        match std::fs::create_dir(parent.join(&id)) {
            Ok(()) => return Ok((parent.join(&id), id)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("the attempt counter is unbounded")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_dirs_never_overwrite_an_earlier_run() {
        let dir = tempfile::tempdir().unwrap();
        let (a, id_a) = create_run_dir(dir.path(), "exp", "cnn-sequential-seed1").unwrap();
        let (b, id_b) = create_run_dir(dir.path(), "exp", "cnn-sequential-seed1").unwrap();
        assert_ne!(a, b);
        assert_eq!(id_a, "cnn-sequential-seed1");
        assert_eq!(id_b, "cnn-sequential-seed1-2");
    }
}
