//! What a run folder that already exists means for a new `tandem run`: a finished run of the
//! same resolved manifest is skipped, an unfinished one continues from its checkpoint, and a
//! folder of a different manifest is refused (naming what changed) unless `--restart-changed`
//! or `--fresh` says to start it over. A lock file keeps two processes out of the same folder.

use std::io::Write;
use std::path::{Path, PathBuf};

use tandem_parallel::Ranks;
use tandem_results::folder::{read_run, RunState};
use tandem_train::{EpochRecord, PartialPoint, StateError, StateParts};

use super::{Restart, RunError};
use crate::results::RunSummary;

/// The checkpoint's file name in a run folder.
pub(super) const CHECKPOINT: &str = "checkpoint.bin";
const LOCK: &str = "run.lock";

/// What to do with a run.
pub(super) enum Plan {
    /// Finished before with the same manifest: nothing to do.
    Skip(Box<RunSummary>),
    /// Train from the start.
    Start,
    /// Continue after the checkpoint's records.
    Resume(Box<Checkpoint>),
}

/// A run's state after its last recorded epoch or evaluation point, or part-way through the
/// next one (when a signal stopped it there).
pub(super) struct Checkpoint {
    pub records: Vec<EpochRecord>,
    pub partial: Option<PartialPoint>,
    pub strategy: StateParts,
}

/// Holds a run folder's lock file; removes it when dropped.
pub(super) struct RunLock(PathBuf);

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Locks `dir` (creating it) and decides what to do with the run whose resolved manifest is
/// `resolved_toml`; what `restart` names starts over, whatever is in the folder removed.
pub(super) fn prepare(dir: &Path, resolved_toml: &str, restart: Restart) -> Result<(RunLock, Plan), RunError> {
    std::fs::create_dir_all(dir).map_err(RunError::results(dir))?;
    let lock = acquire(&dir.join(LOCK))?;
    remove_temporary_files(dir).map_err(|(path, source)| RunError::Results { path, source })?;
    let recorded = dir.join("manifest.toml");
    if restart == Restart::All {
        empty(dir, &lock)?;
        return Ok((lock, Plan::Start));
    }
    if !recorded.is_file() {
        let others =
            std::fs::read_dir(dir).map_err(RunError::results(dir))?.filter_map(Result::ok).any(|e| e.path() != lock.0);
        if others {
            return Err(RunError::Config(format!(
                "{} holds files but no manifest.toml: not a run folder; pass --fresh to replace it",
                dir.display()
            )));
        }
        return Ok((lock, Plan::Start));
    }
    let before = read_recorded_manifest(&recorded).map_err(RunError::Config)?;
    if before != resolved_toml {
        let changed = changed_keys(&before, resolved_toml).join(", ");
        if restart == Restart::Changed {
            eprintln!("{}: its manifest changed ({changed}): starting it over", dir.display());
            empty(dir, &lock)?;
            return Ok((lock, Plan::Start));
        }
        return Err(RunError::Config(format!(
            "{} was run with another manifest (changed: {changed}); pass --restart-changed to start over the runs \
             whose manifest changed (keeping the others), --fresh to start every run over, or choose another --out",
            dir.display()
        )));
    }
    let run = read_run(dir);
    if let (RunState::Finished, Some(summary)) = (&run.state, run.summary) {
        return Ok((lock, Plan::Skip(Box::new(summary))));
    }
    let checkpoint = dir.join(CHECKPOINT);
    if !checkpoint.is_file() {
        return Ok((lock, Plan::Start));
    }
    let (done, partial, strategy) = read_checkpoint(&checkpoint).map_err(RunError::Config)?;
    let unreadable = match &run.state {
        RunState::Unreadable(why) => format!(" ({why})"),
        _ => String::new(),
    };
    if run.epochs.len() < done {
        return Err(RunError::Config(format!(
            "{}: holds {done} records, epochs.jsonl {} that can be read{unreadable}; pass --fresh to start over",
            checkpoint.display(),
            run.epochs.len()
        )));
    }
    if !unreadable.is_empty() {
        eprintln!("note: resuming after the {done} records of the checkpoint, which epochs.jsonl holds{unreadable}");
    }
    let records = run.epochs.into_iter().take(done).collect();
    Ok((lock, Plan::Resume(Box::new(Checkpoint { records, partial, strategy }))))
}

/// Removes everything in run folder `dir` but its lock.
fn empty(dir: &Path, lock: &RunLock) -> Result<(), RunError> {
    for entry in std::fs::read_dir(dir).map_err(RunError::results(dir))? {
        let path = entry.map_err(RunError::results(dir))?.path();
        if path != lock.0 {
            let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            removed.map_err(RunError::results(&path))?;
        }
    }
    Ok(())
}

/// The text of a run folder's `manifest.toml`, which Tandem wrote: TOML, or the folder is damaged.
fn read_recorded_manifest(path: &Path) -> Result<String, String> {
    let damaged = |why: String| format!("{}: {why}; pass --fresh to start the run over", path.display());
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|_| damaged("damaged (not UTF-8 text)".into()))?;
    text.parse::<toml::Table>().map_err(|e| damaged(format!("damaged (not TOML: {})", e.message())))?;
    Ok(text)
}

/// Removes the temporary files a killed writer left in run folder `dir` (atomic writes'
/// `.NAME.tmp-PID` and the vocabulary's `.tandem-tmp-*`): the caller holds the folder's lock,
/// so no other process is writing there.
fn remove_temporary_files(dir: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    for entry in std::fs::read_dir(dir).map_err(|e| (dir.to_path_buf(), e))? {
        let path = entry.map_err(|e| (dir.to_path_buf(), e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let temporary = name.starts_with(".tandem-tmp-") || (name.starts_with('.') && name.contains(".tmp-"));
        if temporary && path.is_file() {
            std::fs::remove_file(&path).map_err(|e| (path.clone(), e))?;
        }
    }
    Ok(())
}

/// A checkpoint file's records done, steps done of the next point, and strategy state.
fn read_checkpoint(path: &Path) -> Result<(usize, Option<PartialPoint>, StateParts), String> {
    let damaged = |e: StateError| format!("{}: {e}; pass --fresh to start over", path.display());
    let (bytes, _) = tandem_results::read_patched(path).map_err(|e| format!("{e}; pass --fresh to start over"))?;
    let parts = StateParts::from_bytes(&bytes).map_err(damaged)?;
    let done = parts.get("points_done").map_err(damaged)?;
    let done = u64::from_le_bytes(
        done.try_into().map_err(|_| damaged(StateError::Damaged("`points_done` is damaged".into())))?,
    ) as usize;
    let strategy = StateParts::from_bytes(parts.get("strategy").map_err(damaged)?).map_err(damaged)?;
    let partial = match parts.get(PARTIAL) {
        Ok(json) => Some(
            serde_json::from_slice(json)
                .map_err(|e| damaged(StateError::Damaged(format!("`{PARTIAL}` is damaged: {e}"))))?,
        ),
        Err(_) => None,
    };
    Ok((done, partial, strategy))
}

/// The checkpoint file of the process of rank `rank` of a job (`None`: a single process).
pub(super) fn checkpoint_file(rank: Option<usize>) -> String {
    match rank {
        None | Some(0) => CHECKPOINT.to_string(),
        Some(rank) => format!("checkpoint.rank-{rank}.bin"),
    }
}

/// In a multi-process job, rank 0 decides from its folder (`plan`, its own) and the job
/// resumes only if every rank holds a checkpoint of the same records (each rank its own file,
/// `checkpoint.rank-N.bin`, with its share of the state); else every rank starts the run over.
/// The records travel from rank 0.
pub(super) fn agree_across_ranks(ranks: &dyn Ranks, dir: &Path, plan: Plan) -> Result<Plan, String> {
    let told = match &plan {
        Plan::Resume(checkpoint) => {
            let lines: Result<Vec<String>, _> = checkpoint.records.iter().map(serde_json::to_string).collect();
            format!("resume\n{}", lines.map_err(|e| e.to_string())?.join("\n"))
        }
        _ => "start".to_string(),
    };
    let told = ranks.broadcast_text(if ranks.rank() == 0 { &told } else { "" }).map_err(|e| e.to_string())?;
    let Some(lines) = told.strip_prefix("resume") else { return Ok(Plan::Start) };
    let records: Vec<EpochRecord> = lines
        .lines()
        .filter(|l| !l.is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("rank 0 sent records this rank cannot read: {e}"))?;
    let own = match plan {
        Plan::Resume(checkpoint) => Ok(checkpoint),
        _ => read_checkpoint(&dir.join(checkpoint_file(Some(ranks.rank())))).and_then(|(done, partial, strategy)| {
            match done == records.len() && partial.is_none() {
                true => Ok(Box::new(Checkpoint { records, partial, strategy })),
                false => Err(format!("its checkpoint holds {done} records, rank 0's {}", records.len())),
            }
        }),
    };
    // Every rank learns whether every rank can resume: the same value everywhere, or not.
    let ready = match &own {
        Ok(checkpoint) => checkpoint.records.len() as u64,
        Err(_) => u64::MAX - ranks.rank() as u64,
    };
    match (ranks.check_same("checkpoint", ready), own) {
        (Ok(()), Ok(checkpoint)) => Ok(Plan::Resume(checkpoint)),
        (_, own) => {
            if let Err(why) = own {
                eprintln!("note: rank {} cannot resume ({why}): the job starts this run over", ranks.rank());
            }
            Ok(Plan::Start)
        }
    }
}

/// The checkpoint's part with the steps done of an unfinished point.
const PARTIAL: &str = "partial";

/// A checkpoint file's bytes: the records done, the steps done of the next point when stopped
/// part-way, and the strategy's state.
pub(super) fn checkpoint_bytes(points_done: usize, partial: Option<&PartialPoint>, strategy: &StateParts) -> Vec<u8> {
    let mut parts = StateParts::default();
    parts.put("points_done", (points_done as u64).to_le_bytes().to_vec());
    if let Some(partial) = partial {
        // Exact: floats are written and read back with every digit (`float_roundtrip`).
        parts.put(PARTIAL, serde_json::to_vec(partial).unwrap_or_default());
    }
    parts.put("strategy", strategy.to_bytes());
    parts.to_bytes()
}

/// Creates the lock file (holding this process's id); a lock left by a process that no longer
/// runs is taken over.
fn acquire(path: &Path) -> Result<RunLock, RunError> {
    for _ in 0..2 {
        match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
            Ok(mut file) => {
                let _ = writeln!(file, "{}", std::process::id());
                return Ok(RunLock(path.to_path_buf()));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = std::fs::read_to_string(path).ok().and_then(|t| t.trim().parse::<u32>().ok());
                match holder {
                    Some(pid) if !process_runs(pid) => {
                        let _ = std::fs::remove_file(path);
                    }
                    _ => break,
                }
            }
            Err(source) => return Err(RunError::Results { path: path.to_path_buf(), source }),
        }
    }
    Err(RunError::Config(format!(
        "{} exists: another `tandem run` is writing this run (remove the file if none is)",
        path.display()
    )))
}

/// Whether a process with id `pid` runs on this machine (Linux: `/proc/<pid>`; elsewhere a
/// lock is never taken over).
fn process_runs(pid: u32) -> bool {
    !Path::new("/proc/self").exists() || Path::new(&format!("/proc/{pid}")).exists()
}

/// The dotted keys whose values differ between two manifests' texts (added and removed
/// included).
fn changed_keys(before: &str, after: &str) -> Vec<String> {
    let parse = |text: &str| text.parse::<toml::Table>().unwrap_or_default();
    let mut keys = Vec::new();
    diff("", &toml::Value::Table(parse(before)), &toml::Value::Table(parse(after)), &mut keys);
    if keys.is_empty() {
        keys.push("the text".into());
    }
    keys
}

fn diff(prefix: &str, before: &toml::Value, after: &toml::Value, keys: &mut Vec<String>) {
    let join = |key: &str| if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") };
    match (before, after) {
        (toml::Value::Table(a), toml::Value::Table(b)) => {
            let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
            names.sort();
            names.dedup();
            for name in names {
                match (a.get(name), b.get(name)) {
                    (Some(x), Some(y)) => diff(&join(name), x, y, keys),
                    _ => keys.push(join(name)),
                }
            }
        }
        (toml::Value::Array(a), toml::Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff(&format!("{prefix}[{i}]"), x, y, keys);
            }
        }
        (a, b) if a != b => keys.push(prefix.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_keys_name_every_difference() {
        let before = "[train]\nepochs = 2\nbatch_size = 32\n[[models]]\nname = \"a\"\nhidden = 8\n";
        let after = "[train]\nepochs = 3\nbatch_size = 32\nthreads = 2\n[[models]]\nname = \"a\"\nhidden = 16\n";
        assert_eq!(changed_keys(before, after), ["models[0].hidden", "train.epochs", "train.threads"]);
    }

    #[test]
    fn a_second_lock_is_refused_and_a_stale_one_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK);
        let held = acquire(&path).unwrap();
        let refused = acquire(&path).err().unwrap().to_string();
        assert!(refused.contains("run.lock") && refused.contains("another `tandem run`"), "{refused}");
        drop(held);
        assert!(!path.exists());
        std::fs::write(&path, "4000000000\n").unwrap();
        drop(acquire(&path).unwrap());
    }
}
