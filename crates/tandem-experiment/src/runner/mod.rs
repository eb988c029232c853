//! Runs a manifest: data preparation once, then one training run per model × strategy × seed.
//!
//! - [`console`]: the banner, run counter and progress bars a person sees;
//! - [`context`]: what one run needs, whatever the backend;
//! - [`job`]: the checks of a multi-process job (every rank runs the same thing);
//! - [`one_run`]: one run, start to end, in three steps:
//!   - [`plan`]: which run, its folder, and whether it is skipped, started or resumed
//!     ([`resume`]: what an existing run folder means, and its lock);
//!   - [`setup`]: on a concrete backend, its devices ([`devices`]), model and strategy;
//!   - [`training`]: the epoch loop, observed by a [`recorder`] that writes `epochs.jsonl`
//!     and the checkpoints ([`checkpoints`]) and stops at a signal ([`signals`]).

mod checkpoints;
mod console;
mod context;
mod devices;
mod job;
mod one_run;
mod plan;
mod recorder;
mod resume;
mod setup;
mod signals;
mod training;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tandem_data::{DataError, Encoded, SplitConfig, SplitMode, Splits, Vocab};
use tandem_parallel::{fingerprint, Ranks};

use crate::backend::{compiled_backends, is_compiled, BackendKind};
use crate::manifest::Manifest;
use crate::results::{RunStatus, RunSummary};
use console::Console;
use devices::run_devices;
use job::{check_job, check_job_size};
use one_run::run_one;

/// Command-line choices that override or complete the manifest.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Overrides `[experiment] backend`. Without `devices`, manifest devices of another backend
    /// are replaced by this backend's first device (`cpu`, `wgpu:0`, `cuda:0`).
    pub backend: Option<BackendKind>,
    /// Overrides `[experiment] devices`.
    pub devices: Option<Vec<String>>,
    /// Results root (runs go to `<out>/<experiment>/<run-id>/`).
    pub out: PathBuf,
    /// Draw progress bars (only shown on a terminal).
    pub progress: bool,
    /// This process's place in a multi-process job (`mpirun`); `None` or one rank: a
    /// single-process run.
    pub ranks: Option<Arc<dyn Ranks>>,
    /// Which runs already in `out` start over; the others are skipped when finished and
    /// resumed when not.
    pub restart: Restart,
    /// What ends the process when a worker thread never returns, once the run's failure is
    /// written (a thread cannot be stopped from outside; `tandem` exits with status 1).
    /// `None`: wait for the worker.
    pub on_stuck_worker: Option<fn()>,
}

/// Which runs whose folder already exists start over, their folder replaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Restart {
    /// None: a run whose manifest changed is refused, naming what changed.
    #[default]
    None,
    /// The runs whose manifest changed (`--restart-changed`).
    Changed,
    /// Every run (`--fresh`).
    All,
}

impl RunOptions {
    /// The ranks of a multi-process job; `None` for a single process (a job of one rank too).
    pub fn job(&self) -> Option<&dyn Ranks> {
        self.ranks.as_deref().filter(|r| r.size() > 1)
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            backend: None,
            devices: None,
            out: PathBuf::from("results"),
            progress: true,
            ranks: None,
            restart: Restart::None,
            on_stuck_worker: None,
        }
    }
}

/// Why a run could not start or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("{0}")]
    Config(String),
    /// The ranks of a multi-process job disagree (every rank gets this same error).
    #[error("{0}")]
    Job(String),
    #[error("cannot write results to {path}: {source}")]
    Results { path: PathBuf, source: std::io::Error },
    /// A signal stopped the run after its checkpoint was written.
    #[error("interrupted by signal {signal}; run the same `tandem run` command again to resume")]
    Interrupted { signal: i32 },
    #[error(
        "{failed} of {total} run{} failed (see {} summary.json){}",
        if *total == 1 { "" } else { "s" },
        if *failed == 1 { "its" } else { "their" },
        match total.saturating_sub(*failed) { 0 => "", 1 => "; the other one finished", _ => "; the others finished" }
    )]
    RunsFailed { failed: usize, total: usize },
}

impl RunError {
    /// How a failed read or write of `path` in a results folder is reported.
    pub(super) fn results(path: &Path) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| RunError::Results { path, source }
    }

    /// Whether the error means "no dataset found" (the caller may offer `tandem data fetch`).
    pub fn is_missing_data(&self) -> bool {
        matches!(self, RunError::Data(DataError::NoData { .. }))
    }

    /// The exit status the process should end with: 128 + the signal for an interrupted run.
    pub fn exit_status(&self) -> Option<u8> {
        match self {
            RunError::Interrupted { signal } => u8::try_from(128 + signal).ok(),
            _ => None,
        }
    }

    /// Whether every rank of a multi-process job failed with this same error, or stopped at the
    /// same point (so they can all stop normally; otherwise the failing rank must end the job).
    pub fn is_on_every_rank(&self) -> bool {
        matches!(self, RunError::Job(_) | RunError::Interrupted { .. })
    }
}

/// The prepared data every run of an experiment shares.
pub struct PreparedData {
    pub splits_description: String,
    /// Why `split = "auto"` chose the split it did (shown in the banner); `None` otherwise.
    pub split_choice: Option<String>,
    pub vocab: Vocab,
    pub train: Encoded,
    /// Carved from the training rows where `[data] validation_fraction` asks for it.
    pub validation: Option<Encoded>,
    pub holdout: Encoded,
}

/// Loads the splits and builds the vocabulary from the training split only.
pub fn prepare_data(manifest: &Manifest) -> Result<PreparedData, RunError> {
    let d = &manifest.data;
    let dir = manifest.data_dir();
    let split = SplitConfig {
        mode: d.split,
        holdout_fraction: d.holdout_fraction,
        validation_fraction: d.validation_fraction.unwrap_or(0.0),
        seed: d.split_seed,
        verify_md5: d.verify_md5,
        max_train: d.max_train_rows,
        max_holdout: d.max_holdout_rows,
    };
    let Splits { train, validation, holdout, description } = tandem_data::load_splits_with(&dir, &split)?;
    let split_choice = (d.split == SplitMode::Auto).then(|| match d.split.resolve(&dir) {
        SplitMode::Official => "`split = \"auto\"`: train.csv is there, so the official split".to_string(),
        _ => "`split = \"auto\"`: no train.csv there, so a re-split of test.csv; \
              `split = \"official\"` would stop instead"
            .to_string(),
    });
    let vocab = Vocab::build(train.iter().map(|s| s.text()), &d.vocab);
    Ok(PreparedData {
        splits_description: description,
        split_choice,
        train: Encoded::new(&train, &vocab, d.max_len),
        validation: (!validation.is_empty()).then(|| Encoded::new(&validation, &vocab, d.max_len)),
        holdout: Encoded::new(&holdout, &vocab, d.max_len),
        vocab,
    })
}

/// Writes the manifest's `[report]` as `report.toml` beside the experiment's run folders, or
/// removes one a manifest without the section would leave stale.
fn keep_report_settings(manifest: &Manifest, out: &Path) -> Result<(), RunError> {
    let dir = out.join(&manifest.experiment.name);
    let path = dir.join(tandem_results::REPORT_FILE);
    let io = |source| RunError::Results { path: path.clone(), source };
    if manifest.report.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
            _ => Ok(()),
        };
    }
    let text = toml::to_string_pretty(&manifest.report)
        .map_err(|e| RunError::Config(format!("cannot write [report] back as TOML: {e}")))?;
    let header = format!("# [report] of the manifest {}, read by `tandem report`.\n", manifest.source.display());
    std::fs::create_dir_all(&dir).map_err(io)?;
    tandem_results::write_atomic(&path, format!("{header}{text}").as_bytes()).map_err(io)
}

/// Runs every model × seed of `manifest`; returns the summaries of all runs.
/// A failed run is recorded (with the epochs it finished) and the others still run.
pub fn run(manifest: &Manifest, options: &RunOptions) -> Result<Vec<RunSummary>, RunError> {
    let backend = options.backend.unwrap_or(manifest.experiment.backend);
    if !is_compiled(backend) {
        return Err(RunError::Config(format!(
            "backend `{backend}` is not compiled into this build (it has: {}); rebuild with `--features {backend}`",
            compiled_backends().iter().map(|b| b.name()).collect::<Vec<_>>().join(", ")
        )));
    }
    let devices = run_devices(manifest, options, backend)?;
    let ranks = options.job();
    match ranks {
        Some(ranks) => check_job(manifest, backend, ranks)?,
        None => check_job_size(manifest, 1)?,
    }
    let data = prepare_data(manifest)?;
    if let Some(ranks) = ranks {
        let split =
            data.train.tokens.iter().chain(data.validation.iter().flat_map(|v| &v.tokens)).chain(&data.holdout.tokens);
        let split: Vec<u8> = split.flat_map(|t| t.to_le_bytes()).collect();
        ranks
            .check_same("data (train, validation and holdout tokens)", fingerprint(&split))
            .map_err(|e| RunError::Job(e.to_string()))?;
    }
    let shows = ranks.is_none_or(|r| r.rank() == 0);
    if shows {
        keep_report_settings(manifest, &options.out)?;
    }
    let mut console = Console::start(manifest, &data, backend, &devices, &options.out, shows);
    signals::interrupt();
    let mut summaries = Vec::new();
    for model in &manifest.models {
        for strategy in &manifest.strategies {
            for &seed in &manifest.experiment.seeds {
                console.begin_run(&console::run_name(model, strategy, seed));
                let key = plan::RunKey { entry: model, strategy, seed };
                let ran = run_one(manifest, key, backend, &devices, &data, options)?;
                if let Some(signal) =
                    signals::agreed_stop(ranks, strategy.timeout()).map_err(|e| RunError::Job(e.to_string()))?
                {
                    return Err(RunError::Interrupted { signal });
                }
                console.end_run(ran.whole);
                summaries.extend(ran.summary);
            }
        }
    }
    let failed = summaries.iter().filter(|s| s.status == RunStatus::Failed).count();
    if failed > 0 {
        return Err(RunError::RunsFailed { failed, total: summaries.len() });
    }
    console.finish();
    Ok(summaries)
}
