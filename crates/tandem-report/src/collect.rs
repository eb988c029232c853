//! Finding runs in results folders and reading their files. A folder is a run when it holds a
//! `manifest.toml` (the runner writes it first), `summary.json` (written last) or `epochs.jsonl`.

use std::path::{Path, PathBuf};

use tandem_experiment::results::RunStatus;
use tandem_experiment::RunSummary;
use tandem_train::EpochRecord;

use crate::ReportError;

/// How far below each input folder runs are looked for (`results/<experiment>/<run>` is depth 2).
const MAX_DEPTH: usize = 4;

/// Where a run got to.
#[derive(Clone, Debug, PartialEq)]
pub enum RunState {
    Finished,
    /// The run ended with an error (from `summary.json`).
    Failed(String),
    /// No `summary.json`: the run was interrupted, or is still going.
    Unfinished,
    /// A file could not be read; the message names it (and the line, for JSON).
    Unreadable(String),
}

/// One run folder as found on disk.
#[derive(Clone, Debug)]
pub struct Run {
    pub dir: PathBuf,
    pub state: RunState,
    /// Present when `summary.json` was read.
    pub summary: Option<RunSummary>,
    /// The epochs recorded so far (`epochs.jsonl`).
    pub epochs: Vec<EpochRecord>,
}

impl Run {
    /// The summary of a finished run.
    pub fn finished(&self) -> Option<&RunSummary> {
        match self.state {
            RunState::Finished => self.summary.as_ref(),
            _ => None,
        }
    }

    /// The folder name, which is the run id.
    pub fn name(&self) -> String {
        self.dir.file_name().map_or_else(|| self.dir.display().to_string(), |n| n.to_string_lossy().into_owned())
    }

    /// Bytes communicated over the whole run: each epoch's `bytes_per_step` × steps.
    /// `None` for strategies that do not communicate (no such key).
    pub fn bytes_total(&self) -> Option<f64> {
        let per_epoch: Vec<f64> = self
            .epochs
            .iter()
            .filter_map(|e| e.extra.get("bytes_per_step").and_then(|b| b.as_f64()).map(|b| b * e.steps as f64))
            .collect();
        (!per_epoch.is_empty()).then(|| per_epoch.iter().sum())
    }

    /// Share of the training time spent communicating, averaged over epochs.
    pub fn communication_share(&self) -> Option<f64> {
        mean(self.epochs.iter().filter_map(|e| e.extra.get("communication_share").and_then(|b| b.as_f64())))
    }

    /// A number from the last epoch's strategy figures (`extra`).
    pub fn extra_f64(&self, key: &str) -> Option<f64> {
        self.epochs.last().and_then(|e| e.extra.get(key)).and_then(|v| v.as_f64())
    }

    /// The sum over epochs of a per-epoch count in `extra` (e.g. `sync_steps`).
    pub fn extra_sum(&self, key: &str) -> Option<f64> {
        let values: Vec<f64> = self.epochs.iter().filter_map(|e| e.extra.get(key).and_then(|v| v.as_f64())).collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    /// A string from the last epoch's strategy figures.
    pub fn extra_str(&self, key: &str) -> Option<String> {
        self.epochs.last().and_then(|e| e.extra.get(key)).and_then(|v| v.as_str()).map(str::to_string)
    }
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// Every run under `inputs` (run folders, experiment folders or results roots), each once,
/// sorted by path. An input that does not exist is an error; a run whose files cannot be read
/// is returned as [`RunState::Unreadable`], so one bad folder never hides the others.
pub fn collect_runs(inputs: &[PathBuf]) -> Result<Vec<Run>, ReportError> {
    let mut dirs = Vec::new();
    for input in inputs {
        if !input.is_dir() {
            return Err(ReportError::Input(format!("{}: not a results folder (no such directory)", input.display())));
        }
        find_run_dirs(input, 0, &mut dirs).map_err(|e| ReportError::Input(format!("{}: {e}", input.display())))?;
    }
    let mut dirs: Vec<PathBuf> = dirs.into_iter().map(|d| std::fs::canonicalize(&d).unwrap_or(d)).collect();
    dirs.sort();
    dirs.dedup();
    if dirs.is_empty() {
        let names: Vec<String> = inputs.iter().map(|p| p.display().to_string()).collect();
        return Err(ReportError::Input(format!(
            "no runs under {} (a run folder holds manifest.toml or summary.json)",
            names.join(", ")
        )));
    }
    Ok(dirs.into_iter().map(|dir| read_run(&dir)).collect())
}

fn is_run_dir(dir: &Path) -> bool {
    ["manifest.toml", "summary.json", "epochs.jsonl"].iter().any(|f| dir.join(f).is_file())
}

fn find_run_dirs(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if is_run_dir(dir) {
        found.push(dir.to_path_buf());
        return Ok(());
    }
    if depth == MAX_DEPTH {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            find_run_dirs(&path, depth + 1, found)?;
        }
    }
    Ok(())
}

/// Reads one run folder; problems become [`RunState::Unreadable`].
pub fn read_run(dir: &Path) -> Run {
    let mut run = Run { dir: dir.to_path_buf(), state: RunState::Unfinished, summary: None, epochs: Vec::new() };
    match read_epochs(&dir.join("epochs.jsonl")) {
        Ok(epochs) => run.epochs = epochs,
        Err(message) => {
            run.state = RunState::Unreadable(message);
            return run;
        }
    }
    let path = dir.join("summary.json");
    if !path.is_file() {
        return run;
    }
    match std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str::<RunSummary>(&t).map_err(|e| e.to_string()))
    {
        Ok(summary) => {
            run.state = match (&summary.status, &summary.error) {
                (RunStatus::Finished, _) => RunState::Finished,
                (RunStatus::Failed, error) => {
                    RunState::Failed(error.clone().unwrap_or_else(|| "no error recorded".into()))
                }
            };
            run.summary = Some(summary);
        }
        Err(e) => run.state = RunState::Unreadable(format!("{}: {e}", path.display())),
    }
    run
}

/// The epoch records of `epochs.jsonl` (none if the file does not exist yet).
fn read_epochs(path: &Path) -> Result<Vec<EpochRecord>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| serde_json::from_str(line).map_err(|e| format!("{} line {}: {e}", path.display(), i + 1)))
        .collect()
}
