//! Reading run folders: finding them under results folders, and reading one. A folder is a run
//! when it holds a `manifest.toml` (the runner writes it first), `summary.json` (written last)
//! or `epochs.jsonl`. Files of every format this build knows are read (see [`crate::legacy`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::figures::StrategyFigures;
use crate::record::EpochRecord;
use crate::summary::{RunStatus, RunSummary};
use crate::{legacy, FORMAT_VERSION};

/// How far below each input folder runs are looked for (`results/<experiment>/<run>` is depth 2).
const MAX_DEPTH: usize = 4;

/// Where a run got to.
#[derive(Clone, Debug, PartialEq)]
pub enum RunState {
    Finished,
    /// The run ended with an error (from `summary.json`).
    Failed(String),
    /// No `summary.json`, or one saying `interrupted`: the run was stopped, or is still going.
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

/// Why no runs could be listed.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error("{}: not a results folder (no such directory)", .0.display())]
    NoSuchFolder(PathBuf),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("no runs under {} (a run folder holds manifest.toml or summary.json)", names(.0))]
    NoRuns(Vec<PathBuf>),
}

fn names(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
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

    /// The text of the run's resolved `manifest.toml` (`None` when it is missing or unreadable).
    pub fn manifest_text(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.join("manifest.toml")).ok()
    }

    /// The strategy's figures of the last record.
    pub fn last_figures(&self) -> Option<&StrategyFigures> {
        self.epochs.last().map(|e| &e.figures)
    }

    /// Bytes communicated over the whole run: each epoch's bytes per step × steps. `None` for
    /// strategies that do not communicate.
    pub fn bytes_total(&self) -> Option<f64> {
        let per_epoch: Vec<f64> =
            self.epochs.iter().filter_map(|e| e.figures.bytes_per_step().map(|b| b * e.steps as f64)).collect();
        (!per_epoch.is_empty()).then(|| per_epoch.iter().sum())
    }

    /// Share of the training time spent communicating, averaged over epochs.
    pub fn communication_share(&self) -> Option<f64> {
        mean(self.epochs.iter().filter_map(|e| e.figures.communication_share()))
    }

    /// Sync steps over the whole run (predictive synchronisation).
    pub fn sync_steps(&self) -> Option<f64> {
        let counts: Vec<f64> =
            self.epochs.iter().filter_map(|e| e.figures.sync().map(|s| s.sync_steps as f64)).collect();
        (!counts.is_empty()).then(|| counts.iter().sum())
    }
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// Every run under `inputs` (run folders, experiment folders or results roots), each once,
/// sorted by path. An input that does not exist is an error; a run whose files cannot be read
/// is returned as [`RunState::Unreadable`], so one bad folder never hides the others.
pub fn find_runs(inputs: &[PathBuf]) -> Result<Vec<Run>, FindError> {
    let mut dirs = Vec::new();
    for input in inputs {
        if !input.is_dir() {
            return Err(FindError::NoSuchFolder(input.clone()));
        }
        find_run_dirs(input, 0, &mut dirs).map_err(|source| FindError::Io { path: input.clone(), source })?;
    }
    let mut dirs: Vec<PathBuf> = dirs.into_iter().map(|d| std::fs::canonicalize(&d).unwrap_or(d)).collect();
    dirs.sort();
    dirs.dedup();
    if dirs.is_empty() {
        return Err(FindError::NoRuns(inputs.to_vec()));
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
    let (epochs, problem) = read_epochs(&dir.join("epochs.jsonl"));
    run.epochs = epochs;
    if let Some(message) = problem {
        run.state = RunState::Unreadable(message);
        return run;
    }
    let path = dir.join("summary.json");
    if !path.is_file() {
        return run;
    }
    match std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|t| parse_summary(&t).map_err(|e| e.to_string()))
    {
        Ok(summary) => {
            run.state = match (&summary.status, &summary.error) {
                (RunStatus::Finished, _) => RunState::Finished,
                (RunStatus::Interrupted, _) => RunState::Unfinished,
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

/// The epoch records of `epochs.jsonl` (none if the file does not exist yet): those before the
/// first line that cannot be read, and what is wrong with that line.
fn read_epochs(path: &Path) -> (Vec<EpochRecord>, Option<String>) {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Vec::new(), None),
        Err(e) => return (Vec::new(), Some(format!("{}: {e}", path.display()))),
    };
    let mut records = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let parsed = std::str::from_utf8(line).map_err(|e| e.to_string()).and_then(|line| match line.trim() {
            "" => Ok(None),
            line => parse_record(line).map(Some).map_err(|e| e.to_string()),
        });
        match parsed {
            Ok(record) => records.extend(record),
            Err(e) => return (records, Some(format!("{} line {}: {e}", path.display(), i + 1))),
        }
    }
    (records, None)
}

/// The fields that tell the formats apart: a summary's `format_version` (absent in format 1)
/// and a record's `extra` (format 1's figures; records carry no version).
#[derive(Deserialize)]
struct Format {
    format_version: Option<u32>,
    extra: Option<serde::de::IgnoredAny>,
}

/// Why a `summary.json` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("results format {0} is newer than this build reads ({FORMAT_VERSION})")]
    Newer(u32),
    #[error("unknown results format {0}")]
    Unknown(u32),
}

/// `summary.json`'s text, in any format this build reads.
pub fn parse_summary(text: &str) -> Result<RunSummary, SummaryError> {
    let format = serde_json::from_str::<Format>(text)?;
    Ok(match format.format_version.unwrap_or(legacy::FORMAT) {
        legacy::FORMAT => legacy::parse(text)?,
        FORMAT_VERSION => serde_json::from_str(text)?,
        newer if newer > FORMAT_VERSION => return Err(SummaryError::Newer(newer)),
        unknown => return Err(SummaryError::Unknown(unknown)),
    })
}

/// One line of `epochs.jsonl`, in any format this build reads.
pub fn parse_record(line: &str) -> serde_json::Result<EpochRecord> {
    match serde_json::from_str::<Format>(line)?.extra {
        Some(_) => legacy::parse(line),
        None => serde_json::from_str(line),
    }
}
