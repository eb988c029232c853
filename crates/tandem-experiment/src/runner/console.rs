//! What a person running an experiment sees on stderr: a banner, "run k of N" with the overall
//! time left, per-run progress bars, and numbers written for people (`1,092 samples/s`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

use super::PreparedData;
use crate::backend::{BackendKind, DeviceSpec};
use crate::manifest::{Manifest, ModelEntry, StrategyConfig};

/// Names a run (and its folder): `<model>-<strategy label>-seed<seed>`.
pub(super) fn run_name(entry: &ModelEntry, strategy: &StrategyConfig, seed: u64) -> String {
    format!("{}-{}-seed{seed}", entry.name, strategy.label())
}

/// The experiment's console: silent on the ranks of a job that do not write results.
pub(super) struct Console {
    enabled: bool,
    /// Every run of the experiment, in the order they run.
    runs: Vec<PlannedRun>,
    done: usize,
    /// Seconds per epoch of the runs that trained whole, by their index in `runs`.
    timed: Vec<(usize, f64)>,
    started: Instant,
    run_started: Instant,
    folder: PathBuf,
}

/// A run of the experiment, as far as its time goes.
#[derive(Clone, Debug, PartialEq)]
struct PlannedRun {
    model: String,
    strategy: String,
    epochs: usize,
}

/// The time the runs after the first `done` of `runs` will take: each at the seconds per epoch
/// timed for its model and strategy, else for its model, else the mean of every timed run (a
/// guess: how many runs needed it is returned too). `None` before any run was timed.
fn time_left(runs: &[PlannedRun], done: usize, timed: &[(usize, f64)]) -> Option<(Duration, usize)> {
    let mean = |of: &dyn Fn(&PlannedRun) -> bool| {
        let rates: Vec<f64> = timed.iter().filter(|(i, _)| of(&runs[*i])).map(|(_, r)| *r).collect();
        (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64)
    };
    let overall = mean(&|_| true)?;
    let mut guessed = 0;
    let seconds: f64 = runs[done.min(runs.len())..]
        .iter()
        .map(|run| {
            let per_epoch = mean(&|r| r.model == run.model && r.strategy == run.strategy)
                .or_else(|| mean(&|r| r.model == run.model))
                .unwrap_or_else(|| {
                    guessed += 1;
                    overall
                });
            per_epoch * run.epochs as f64
        })
        .sum();
    Some((Duration::from_secs_f64(seconds), guessed))
}

impl Console {
    /// Prints the banner: experiment, data, runs, backend and devices, results folder.
    pub fn start(
        manifest: &Manifest,
        data: &PreparedData,
        backend: BackendKind,
        devices: &[DeviceSpec],
        out: &Path,
        enabled: bool,
    ) -> Self {
        let (models, strategies, seeds) =
            (manifest.models.len(), manifest.strategies.len(), manifest.experiment.seeds.len());
        let total = models * strategies * seeds;
        let mut runs = Vec::with_capacity(total);
        for model in &manifest.models {
            for strategy in &manifest.strategies {
                let run =
                    PlannedRun { model: model.name.clone(), strategy: strategy.label(), epochs: model.train.epochs };
                runs.extend(std::iter::repeat_n(run, seeds));
            }
        }
        let folder = out.join(&manifest.experiment.name);
        if enabled {
            let devices: Vec<String> = devices.iter().map(ToString::to_string).collect();
            eprintln!("experiment {} ({})", manifest.experiment.name, manifest.source.display());
            eprintln!("  data:    {} from {}", data.splits_description, manifest.data_dir().display());
            if let Some(choice) = &data.split_choice {
                eprintln!("           ({choice})");
            }
            eprintln!(
                "  runs:    {total} = {models} model{} × {strategies} strateg{} × {seeds} seed{}",
                plural(models, "", "s"),
                plural(strategies, "y", "ies"),
                plural(seeds, "", "s")
            );
            eprintln!("  backend: {backend} on {}", devices.join(", "));
            eprintln!("  results: {}", folder.display());
        }
        Self { enabled, runs, done: 0, timed: Vec::new(), started: Instant::now(), run_started: Instant::now(), folder }
    }

    /// Announces the next run.
    pub fn begin_run(&mut self, name: &str) {
        self.run_started = Instant::now();
        if self.enabled {
            eprintln!("run {} of {}: {name}", self.done + 1, self.runs.len());
        }
    }

    /// Records the run begun last, `whole` when it trained from its first epoch to its last here
    /// (not skipped, not resumed); prints the time spent and an estimate of the time left from
    /// the whole runs so far.
    pub fn end_run(&mut self, whole: bool) {
        if whole {
            let epochs = self.runs.get(self.done).map_or(1, |r| r.epochs.max(1));
            self.timed.push((self.done, self.run_started.elapsed().as_secs_f64() / epochs as f64));
        }
        self.done += 1;
        let total = self.runs.len();
        if !self.enabled || self.done >= total {
            return;
        }
        let elapsed = human_duration(self.started.elapsed());
        match time_left(&self.runs, self.done, &self.timed) {
            Some((left, 0)) => {
                eprintln!("{} of {total} runs done in {elapsed}, about {} left", self.done, human_duration(left))
            }
            Some((left, guessed)) => eprintln!(
                "{} of {total} runs done in {elapsed}, about {} left ({} of models or strategies not timed yet)",
                self.done,
                human_duration(left),
                counted(guessed, "run", "runs")
            ),
            None => eprintln!("{} of {total} runs done in {elapsed}", self.done),
        }
    }

    /// The closing lines: where the results are and the command that reports them.
    pub fn finish(&self) {
        if self.enabled {
            eprintln!(
                "{} run{} finished in {}; results in {}",
                self.done,
                plural(self.done, "", "s"),
                human_duration(self.started.elapsed()),
                self.folder.display()
            );
            let name = self.folder.file_name().map_or_else(|| "report".into(), |n| n.to_string_lossy());
            eprintln!("next: tandem report {} --out report/{name}", self.folder.display());
        }
    }
}

fn plural(n: usize, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// A run's progress bar over `total` samples, labelled `label` (hidden unless `enabled`).
pub(super) fn progress_bar(enabled: bool, total: u64, label: &str) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    // stderr target: drawn only when stderr is a terminal.
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{prefix} [{bar:30}] {done}/{all} samples, {rate} samples/s, {left} {msg}")
    {
        let style = style
            .with_key("done", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&human_count(s.pos() as f64));
            })
            .with_key("all", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&human_count(s.len().unwrap_or(0) as f64));
            })
            // Nothing to go by before the first samples: "–", not "0" and "eta 0s".
            .with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&if s.pos() == 0 { "–".into() } else { human_count(s.per_sec()) });
            })
            .with_key("left", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = match s.pos() {
                    0 => w.write_str("time left –"),
                    _ => write!(w, "{} left", human_duration(s.eta())),
                };
            });
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label.to_string());
    bar
}

/// `n` things, the noun singular for one: `1 epoch`, `2 epochs`.
pub fn counted(n: usize, one: &'static str, many: &'static str) -> String {
    format!("{n} {}", plural(n, one, many))
}

/// A count or rate rounded to a whole number, with thousands separators: `1,092`.
pub fn human_count(x: f64) -> String {
    if !x.is_finite() {
        return "–".into();
    }
    let digits = tandem_data::thousands(x.abs().round() as usize);
    if x < 0.0 && digits != "0" {
        format!("-{digits}")
    } else {
        digits
    }
}

/// A duration as people say it: `42 s`, `1 min 46 s`, `2 h 05 min`.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs_f64().round() as u64;
    let mut out = String::new();
    let _ = match s {
        0..60 => write!(out, "{s} s"),
        60..3600 => write!(out, "{} min {:02} s", s / 60, s % 60),
        _ => write!(out, "{} h {:02} min", s / 3600, s % 3600 / 60),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_for_people() {
        assert_eq!(human_count(1091.5489), "1,092");
        assert_eq!(human_count(999.4), "999");
        assert_eq!(human_count(1_234_567.0), "1,234,567");
        assert_eq!(human_count(0.2), "0");
        assert_eq!(human_count(-1500.0), "-1,500");
        assert_eq!(human_duration(Duration::from_secs(42)), "42 s");
        assert_eq!(human_duration(Duration::from_secs(106)), "1 min 46 s");
        assert_eq!(human_duration(Duration::from_secs(7500)), "2 h 05 min");
    }

    fn planned(model: &str, strategy: &str, epochs: usize) -> PlannedRun {
        PlannedRun { model: model.into(), strategy: strategy.into(), epochs }
    }

    #[test]
    fn the_time_left_weighs_each_run_by_what_its_model_and_strategy_took() {
        let runs = [
            planned("cnn", "sequential", 5),
            planned("cnn", "data-parallel", 5),
            planned("lstm", "sequential", 10),
            planned("lstm", "data-parallel", 10),
        ];
        let secs = |d: Duration| d.as_secs_f64().round() as u64;
        assert_eq!(time_left(&runs, 1, &[]), None, "nothing timed yet (the first run was skipped)");
        // The CNN took 2 s an epoch: the rest at that rate, the LSTM's runs a guess.
        let (left, guessed) = time_left(&runs, 1, &[(0, 2.0)]).unwrap();
        assert_eq!((secs(left), guessed), (10 + 20 + 20, 2));
        // The LSTM took 9 s an epoch: its other run is timed by it, not by the CNN's.
        let (left, guessed) = time_left(&runs, 3, &[(0, 2.0), (1, 3.0), (2, 9.0)]).unwrap();
        assert_eq!((secs(left), guessed), (90, 0));
        assert_eq!(time_left(&runs, 4, &[(0, 2.0)]).map(|(l, g)| (secs(l), g)), Some((0, 0)));
    }
}
