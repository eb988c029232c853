//! `[cluster] launch = "local"`: `tandem run` starts the job's ranks on this machine itself.

use std::process::ExitStatus;

/// Runs this same command line again as `ranks` processes under `mpirun` (`$TANDEM_MPIRUN`, split
/// at spaces, replaces `mpirun --bind-to none`), and waits for the job to end: its ranks bound
/// their own waits, so this wait is bounded too. Returns the job's exit status, which the ranks
/// have explained.
#[cfg(feature = "mpi")]
pub fn local_job(ranks: usize) -> Result<ExitStatus, String> {
    use std::process::Command;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    let this = std::env::current_exe().map_err(|e| format!("cannot find this program to start its ranks: {e}"))?;
    let (mut job, launcher) = tandem_experiment::local_ranks_command(ranks, &this, std::env::args_os().skip(1))?;
    // A Ctrl-C goes to the whole process group, the ranks included: this process only outlives
    // it. A SIGTERM comes to this process alone: it goes on to the launcher.
    let (interrupted, terminated) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    for (signal, flag) in [(signal_hook::consts::SIGINT, &interrupted), (signal_hook::consts::SIGTERM, &terminated)] {
        signal_hook::flag::register(signal, flag.clone())
            .map_err(|e| format!("cannot watch for signal {signal} while the ranks run: {e}"))?;
    }
    let mut child = job.spawn().map_err(|e| {
        format!("`[cluster] launch = \"local\"` starts the ranks with `{launcher}`, which did not start ({e}): install an MPI library (OpenMPI, MPICH) or name its launcher in TANDEM_MPIRUN")
    })?;
    let mut passed_on = false;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("lost track of the ranks' launcher: {e}"))? {
            return Ok(status);
        }
        if terminated.load(Ordering::SeqCst) && !passed_on {
            passed_on = true;
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(not(feature = "mpi"))]
pub fn local_job(_ranks: usize) -> Result<ExitStatus, String> {
    Err("`[cluster] launch = \"local\"` starts the ranks as MPI processes, but this build has no MPI support: rebuild with `--features mpi`".into())
}
