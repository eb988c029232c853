//! `tandem report`: tables over seeds and SVG plots from results folders alone.
//!
//! Runs are grouped by *setting* (data, backend, machine) and compared only within one; in a
//! setting, runs of the same model and strategy are aggregated over seeds (mean ± sample std).
//! Speedups pair each run with the `sequential` run of the same model and seed. Runs that did not
//! finish are listed, never averaged.

pub mod aggregate;
pub mod classes;
pub mod curves;
pub mod document;
pub mod hyper;
pub mod interval;
pub mod plots;
pub mod protocols;
pub mod style;
pub mod sync;

use std::path::{Path, PathBuf};

use aggregate::{summarize, SettingTable, Stat};
use document::{Block, Document};
use tandem_results::{FindError, ReportSettings, Run, RunState, RunStatus, StrategyFigures};

/// Draws one plot of a setting as SVG text (`None`: nothing to plot).
type Plot = fn(&SettingTable) -> Result<Option<String>, String>;

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Input(#[from] FindError),
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot draw {plot}: {message}")]
    Plot { plot: String, message: String },
    #[error("{}: {message}", path.display())]
    Settings { path: PathBuf, message: String },
}

/// The files a report wrote.
#[derive(Clone, Debug)]
pub struct ReportFiles {
    pub markdown: PathBuf,
    pub html: PathBuf,
    pub plots: Vec<PathBuf>,
    /// Runs read: finished, and not finished (failed, interrupted or unreadable).
    pub finished: usize,
    pub not_finished: usize,
}

/// Reads every run under `inputs` and writes `report.md`, `report.html` and the SVG plots to `out`.
pub fn write_report(inputs: &[PathBuf], out: &Path) -> Result<ReportFiles, ReportError> {
    let runs = tandem_results::find_runs(inputs)?;
    let document = build(&runs, inputs)?;
    let write = |name: &str, text: &str| -> Result<PathBuf, ReportError> {
        let path = out.join(name);
        tandem_results::write_atomic(&path, text.as_bytes())
            .map_err(|source| ReportError::Write { path: path.clone(), source })?;
        Ok(path)
    };
    std::fs::create_dir_all(out).map_err(|source| ReportError::Write { path: out.to_path_buf(), source })?;
    let earlier_plots = plots_of_report(&out.join("report.md"));
    let mut plots = Vec::new();
    for block in &document.blocks {
        match block {
            Block::Figure { file, svg, .. } => plots.push(write(file, svg)?),
            Block::Gallery { figures, .. } => {
                for f in figures {
                    plots.push(write(&f.file, &f.svg)?);
                }
            }
            _ => {}
        }
    }
    let finished = runs.iter().filter(|r| r.finished().is_some()).count();
    let files = ReportFiles {
        markdown: write("report.md", &document.markdown())?,
        html: write("report.html", &document.html())?,
        plots,
        finished,
        not_finished: runs.len() - finished,
    };
    // The earlier report's plots this one does not have would read as part of it.
    for stale in earlier_plots.iter().map(|name| out.join(name)).filter(|p| !files.plots.contains(p)) {
        match std::fs::remove_file(&stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(ReportError::Write { path: stale, source: e })
            }
            _ => {}
        }
    }
    Ok(files)
}

/// Where the strategies of a setting train on global batches of different sizes (data
/// parallelism with a batch per replica), which batch each took: their speedups and accuracies
/// then compare training at different batch sizes, in different numbers of steps.
fn global_batches_note(table: &SettingTable) -> Option<String> {
    let mut batches: Vec<(String, usize)> = Vec::new();
    for g in &table.groups {
        for batch in g.runs.iter().filter_map(|r| r.finished()?.global_batch) {
            if !batches.iter().any(|(s, b)| *s == g.strategy && *b == batch) {
                batches.push((g.strategy.clone(), batch));
            }
        }
    }
    let first = batches.first()?.1;
    if batches.iter().all(|(_, b)| *b == first) {
        return None;
    }
    let listed: Vec<String> = batches.iter().map(|(s, b)| format!("{s} {b}")).collect();
    Some(format!(
        "Global batches differ (rows a step trains on, over every replica): {}. Speedups and accuracies across them compare training at different batch sizes, in different numbers of steps.",
        listed.join(", ")
    ))
}

/// The SVG files a `report.md` Tandem wrote links to (`](name.svg)`, in the folder itself); none
/// without one.
fn plots_of_report(markdown: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(markdown).unwrap_or_default();
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(link, _)| link))
        .filter(|link| link.ends_with(".svg") && !link.contains(['/', '\\']))
        .map(str::to_string)
        .collect()
}

/// The report for `runs` (read from `inputs`, named in its opening).
pub fn build(runs: &[Run], inputs: &[PathBuf]) -> Result<Document, ReportError> {
    let mut doc = Document { title: "Tandem report".into(), blocks: Vec::new() };
    let mut tables = summarize(runs);
    for table in &mut tables {
        table.report = report_settings(table)?;
    }
    let finished = runs.iter().filter(|r| r.finished().is_some()).count();
    let duplicates = finished - aggregate::distinct(runs).len();
    let mut versions: Vec<&str> =
        runs.iter().filter_map(|r| r.summary.as_ref()).map(|s| s.tandem_version.as_str()).collect();
    versions.sort();
    versions.dedup();
    doc.push(Block::Paragraph(format!(
        "From {} run folder{} under {} ({finished} finished), written by Tandem {}. Figures are means ± sample standard deviations over seeds; n is the number of seeds. Speedups pair each run with the sequential run of the same model and seed. Runs are compared only within one setting (experiment, data, backend, machine).",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" },
        inputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        if versions.is_empty() { "?".to_string() } else { versions.join(", ") }
    )));
    if duplicates > 0 {
        doc.push(Block::Paragraph(format!(
            "{duplicates} finished run folder{} ignored: each holds the same run (experiment, model, strategy, seed, machine and resolved manifest) as another folder, and of such copies only the one that finished last is counted.",
            if duplicates == 1 { " was" } else { "s were" }
        )));
    }
    for (k, table) in tables.iter().enumerate() {
        let suffix = if tables.len() > 1 { format!("-{}", k + 1) } else { String::new() };
        setting_section(&mut doc, k + 1, table, &suffix)?;
    }
    let unfinished: Vec<String> = runs.iter().filter(|r| r.finished().is_none()).map(describe_unfinished).collect();
    if !unfinished.is_empty() {
        doc.push(Block::Heading(1, "Runs that did not finish".into()));
        doc.push(Block::Paragraph("Not included in any figure above.".into()));
        doc.push(Block::List(unfinished));
    }
    Ok(doc)
}

/// The `report.toml` beside the setting's run folders, or none; an error where two folders of
/// the setting hold different ones.
fn report_settings(table: &SettingTable) -> Result<ReportSettings, ReportError> {
    let mut dirs: Vec<&Path> = table.groups.iter().flat_map(|g| &g.runs).filter_map(|r| r.dir.parent()).collect();
    dirs.sort();
    dirs.dedup();
    let mut found: Option<(PathBuf, ReportSettings)> = None;
    for path in dirs.iter().map(|d| d.join(tandem_results::REPORT_FILE)).filter(|p| p.is_file()) {
        let settings = read_report_settings(&path)?;
        match &found {
            Some((first, kept)) if *kept != settings => {
                return Err(ReportError::Settings {
                    path,
                    message: format!("differs from {}, for runs of the same setting; make them agree", first.display()),
                })
            }
            Some(_) => {}
            None => found = Some((path, settings)),
        }
    }
    Ok(found.map(|(_, settings)| settings).unwrap_or_default())
}

/// One `report.toml`, checked.
fn read_report_settings(path: &Path) -> Result<ReportSettings, ReportError> {
    let fail = |message: String| ReportError::Settings { path: path.to_path_buf(), message };
    let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let settings: ReportSettings = toml::from_str(&text).map_err(|e| fail(e.to_string().trim_end().to_string()))?;
    match settings.target.as_ref().and_then(|t| t.problem()) {
        Some((field, message)) => Err(fail(format!("target.{field} {message}"))),
        None => Ok(settings),
    }
}

fn describe_unfinished(run: &Run) -> String {
    let epochs = match run.epochs.len() {
        1 => "1 epoch".to_string(),
        n => format!("{n} epochs"),
    };
    let interrupted = run.summary.as_ref().is_some_and(|s| s.status == RunStatus::Interrupted);
    match &run.state {
        RunState::Failed(error) => format!("{} — failed after {epochs}: {error}", run.name()),
        RunState::Unfinished if interrupted => format!(
            "{} — interrupted after {epochs} (stopped by a signal; the same tandem run command resumes it)",
            run.name()
        ),
        RunState::Unfinished => {
            format!("{} — still running, or killed: {epochs} recorded, no summary.json", run.name())
        }
        RunState::Unreadable(error) => format!("{} — unreadable: {error}", run.name()),
        RunState::Finished => unreachable!("only runs without a finished summary are described"),
    }
}

pub(crate) fn stat(s: Option<Stat>, scale: f64, decimals: usize) -> String {
    match s {
        Some(s) if s.n > 1 => format!("{:.*} ± {:.*}", decimals, s.mean * scale, decimals, s.std * scale),
        Some(s) => format!("{:.*}", decimals, s.mean * scale),
        None => "—".into(),
    }
}

fn setting_section(doc: &mut Document, index: usize, table: &SettingTable, suffix: &str) -> Result<(), ReportError> {
    let s = &table.setting;
    let machine = if s.machine.is_empty() { "machine not recorded" } else { s.machine.as_str() };
    doc.push(Block::Heading(1, format!("Setting {index}: {} · {} · {} backend", s.experiment, s.data, s.backend)));
    doc.push(Block::Paragraph(format!(
        "Experiment: {}. Data: {}. Backend: {}. Machine: {machine}.",
        s.experiment, s.data, s.backend
    )));
    doc.push(Block::Heading(2, "Training time, speedup and accuracy".into()));
    doc.push(Block::Table {
        header: [
            "model",
            "strategy",
            "devices",
            "n",
            "train time (s)",
            "speedup",
            "samples/s",
            "accuracy (%)",
            "macro precision (%)",
            "macro recall (%)",
            "macro F1 (%)",
        ]
        .map(String::from)
        .to_vec(),
        rows: table
            .groups
            .iter()
            .map(|g| {
                vec![
                    g.model.clone(),
                    g.strategy.clone(),
                    g.devices.clone(),
                    g.runs.len().to_string(),
                    stat(Some(g.train_seconds), 1.0, 1),
                    g.speedup.map_or("—".into(), |_| format!("{}×", stat(g.speedup, 1.0, 2))),
                    stat(Some(g.samples_per_second), 1.0, 0),
                    stat(Some(g.accuracy), 100.0, 1),
                    stat(Some(g.macro_precision), 100.0, 1),
                    stat(Some(g.macro_recall), 100.0, 1),
                    stat(Some(g.macro_f1), 100.0, 1),
                ]
            })
            .collect(),
    });
    if let Some(note) = global_batches_note(table) {
        doc.push(Block::Paragraph(note));
    }
    hyper::section(doc, table);
    classes::section(doc, table, suffix).map_err(|message| ReportError::Plot { plot: "confusion".into(), message })?;
    communication_table(doc, table);
    protocols::section(doc, table);
    let context = format!("{} · {} · {} · {machine}", s.experiment, s.data, s.backend);
    let figures: [(&str, &str, Plot); 9] = [
        ("speedup", "Speedup over sequential per architecture and strategy", plots::speedup),
        ("accuracy-time", "Holdout accuracy against training time per strategy", curves::accuracy_over_time),
        (
            "validation-time",
            "Validation accuracy against training time per strategy (anytime accuracy)",
            curves::validation_over_time,
        ),
        ("accuracy-bytes", "Accuracy against bytes moved per strategy", curves::accuracy_over_bytes),
        ("train-loss", "Training loss at each evaluation point per strategy", curves::train_loss),
        ("holdout-loss", "Holdout loss at each evaluation point per strategy", curves::holdout_loss),
        (
            "communication-accuracy",
            "Communication against accuracy, Pareto front marked",
            plots::communication_vs_accuracy,
        ),
        ("stage-time", "Per-stage time breakdown of the model-parallel schedules", plots::stage_time),
        (
            "protocols",
            "Protocols against vanilla model parallelism: less communication against accuracy change, marker size by speedup, the target (where the experiment sets one) shaded, the Pareto front dashed",
            plots::protocols,
        ),
    ];
    for (name, caption, draw) in figures {
        let svg = draw(table).map_err(|message| ReportError::Plot { plot: name.into(), message })?;
        if let Some(svg) = svg {
            doc.push(Block::Figure {
                file: format!("{name}{suffix}.svg"),
                caption: format!("{caption} ({context})."),
                svg,
            });
        }
    }
    Ok(())
}

fn communication_table(doc: &mut Document, table: &SettingTable) {
    let rows: Vec<Vec<String>> = table
        .groups
        .iter()
        .filter(|g| g.bytes.is_some())
        .map(|g| {
            let figures = g.runs[0].last_figures();
            let per_step = figures.and_then(StrategyFigures::bytes_per_step).unwrap_or(0.0);
            let detail = if let Some(replicas) = figures.and_then(StrategyFigures::data_parallel) {
                format!("{:.3} MB sent per replica", replicas.bytes_sent_per_replica_per_step / 1e6)
            } else if let Some(links) =
                figures.and_then(StrategyFigures::pipeline).map(|p| &p.links_per_step).filter(|l| !l.is_empty())
            {
                format!(
                    "{:.3} MB per link ({} link{})",
                    per_step / links.len() as f64 / 1e6,
                    links.len(),
                    if links.len() == 1 { "" } else { "s" }
                )
            } else {
                "—".into()
            };
            vec![
                g.model.clone(),
                g.strategy.clone(),
                stat(g.bytes, 1e-6, 1),
                format!("{:.3}", per_step / 1e6),
                detail,
                stat(g.communication_share, 100.0, 1),
            ]
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    doc.push(Block::Heading(2, "Communication".into()));
    doc.push(Block::Paragraph(
        "Bytes each strategy moved between devices over the whole run, per training step (last epoch), and the share of step time spent communicating (data parallel: all-reduce time; model parallel: transfer time, mean over stages).".into(),
    ));
    doc.push(Block::Table {
        header: ["model", "strategy", "MB per run", "MB per step", "per step, split", "share of step time (%)"]
            .map(String::from)
            .to_vec(),
        rows,
    });
}
