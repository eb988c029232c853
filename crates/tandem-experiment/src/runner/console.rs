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
    total: usize,
    done: usize,
    started: Instant,
    folder: PathBuf,
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
        Self { enabled, total, done: 0, started: Instant::now(), folder }
    }

    /// Announces the next run.
    pub fn begin_run(&self, name: &str) {
        if self.enabled {
            eprintln!("run {} of {}: {name}", self.done + 1, self.total);
        }
    }

    /// Records a finished run; prints the time spent and, from the runs so far, the time left.
    pub fn end_run(&mut self) {
        self.done += 1;
        if !self.enabled || self.done == self.total {
            return;
        }
        let elapsed = self.started.elapsed();
        let left = elapsed.mul_f64((self.total - self.done) as f64 / self.done as f64);
        eprintln!(
            "{} of {} runs done in {}, about {} left",
            self.done,
            self.total,
            human_duration(elapsed),
            human_duration(left)
        );
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
        ProgressStyle::with_template("{prefix} [{bar:30}] {done}/{all} samples, {rate} samples/s, eta {eta} {msg}")
    {
        let style = style
            .with_key("done", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&human_count(s.pos() as f64));
            })
            .with_key("all", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&human_count(s.len().unwrap_or(0) as f64));
            })
            .with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&human_count(s.per_sec()));
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
}
