//! Figures over seeds: runs of the same model and strategy in the same setting are one group;
//! each figure is a mean ± sample standard deviation over the group's finished runs.

use std::collections::BTreeMap;

use tandem_results::{BackendKind, ClassificationMetrics, ReportSettings, Run, RunSummary};

/// Mean, sample standard deviation (n − 1; 0 for one value) and count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stat {
    pub mean: f64,
    pub std: f64,
    pub n: usize,
}

impl Stat {
    /// `None` for no values.
    pub fn of(values: &[f64]) -> Option<Stat> {
        let n = values.len();
        if n == 0 {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = if n > 1 { values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64 } else { 0.0 };
        Some(Stat { mean, std: var.sqrt(), n })
    }
}

/// What a figure was measured on. Figures are only compared within one setting, and every table
/// names its setting, so no figure can be mistaken for another experiment (whose models may share
/// names but not hyper-parameters), machine, backend or dataset.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Setting {
    pub experiment: String,
    /// E.g. "AG News test split, 80/20 re-split (seed 42)".
    pub data: String,
    pub backend: String,
    pub machine: String,
}

impl Setting {
    fn of(run: &Run) -> Option<Setting> {
        run.finished().map(|s| Setting {
            experiment: s.experiment.clone(),
            data: s.data.clone(),
            backend: s.backend.clone(),
            machine: s.machine.clone(),
        })
    }
}

/// One model × strategy in one setting, over seeds.
#[derive(Clone, Debug)]
pub struct Group<'a> {
    pub model: String,
    pub architecture: String,
    pub strategy: String,
    /// Whether its runs trained sequentially: the baseline of the other groups' speedups.
    pub baseline: bool,
    /// E.g. "2 × cpu, 1 thread each".
    pub devices: String,
    pub runs: Vec<&'a Run>,
    pub train_seconds: Stat,
    pub samples_per_second: Stat,
    /// Against the sequential run of the same model and seed (see [`baseline_of`]; pairs only).
    pub speedup: Option<Stat>,
    pub accuracy: Stat,
    pub macro_precision: Stat,
    pub macro_recall: Stat,
    pub macro_f1: Stat,
    /// Bytes over the whole run (absent for strategies that do not communicate).
    pub bytes: Option<Stat>,
    pub communication_share: Option<Stat>,
    /// Test-then-train accuracy over the run (the prequential accuracy in stream mode); absent
    /// in results older than the figure.
    pub prequential: Option<Stat>,
}

impl Group<'_> {
    /// The seeds of the group's runs.
    pub fn seeds(&self) -> Vec<u64> {
        self.runs.iter().filter_map(|r| r.summary.as_ref()).map(|s| s.seed).collect()
    }
}

/// The groups of one setting, in the order: models as first met, baseline first, then by label.
#[derive(Clone, Debug)]
pub struct SettingTable<'a> {
    pub setting: Setting,
    pub groups: Vec<Group<'a>>,
    /// The experiment's `report.toml` (the manifest's `[report]`), empty where it has none.
    pub report: ReportSettings,
}

impl<'a> SettingTable<'a> {
    /// The group of `model` × `strategy`.
    pub fn group(&self, model: &str, strategy: &str) -> Option<&Group<'a>> {
        self.groups.iter().find(|g| g.model == model && g.strategy == strategy)
    }

    /// The models in table order.
    pub fn models(&self) -> Vec<&str> {
        let mut models: Vec<&str> = Vec::new();
        for g in &self.groups {
            if !models.contains(&g.model.as_str()) {
                models.push(&g.model);
            }
        }
        models
    }

    /// The strategies in table order: the sequential baselines first.
    pub fn strategies(&self) -> Vec<&str> {
        let mut strategies: Vec<(bool, &str)> =
            self.groups.iter().map(|g| (!g.baseline, g.strategy.as_str())).collect();
        strategies.sort();
        strategies.dedup();
        strategies.into_iter().map(|(_, s)| s).collect()
    }

    /// Whether the groups of strategy `label` are sequential baselines.
    pub fn is_baseline(&self, label: &str) -> bool {
        self.groups.iter().any(|g| g.strategy == label && g.baseline)
    }
}

/// What makes two run folders the same run: experiment, model, strategy, seed, machine and the
/// resolved manifest's text.
type RunKey<'a> = (&'a str, &'a str, &'a str, u64, &'a str, Option<String>);

/// The finished runs, each (experiment, model, strategy, seed, machine, resolved manifest) once:
/// of several folders with the same key (a rerun into the same results folder), the one that
/// finished last is kept, so `n` counts distinct seeds.
pub fn distinct(runs: &[Run]) -> Vec<&Run> {
    let mut newest: BTreeMap<RunKey, &Run> = BTreeMap::new();
    for run in runs {
        let Some(s) = run.finished() else { continue };
        let key = (&*s.experiment, &*s.model, &*s.strategy, s.seed, &*s.machine, run.manifest_text());
        let kept = newest.entry(key).or_insert(run);
        let later = |r: &Run| (r.finished().map(|s| s.finished_at.clone()), r.dir.clone());
        if later(run) > later(kept) {
            *kept = run;
        }
    }
    let mut kept: Vec<&Run> = newest.into_values().collect();
    kept.sort_by(|a, b| a.dir.cmp(&b.dir));
    kept
}

/// Groups the finished runs by setting, then by model × strategy, each run key once ([`distinct`]).
pub fn summarize(runs: &[Run]) -> Vec<SettingTable<'_>> {
    let mut settings: BTreeMap<Setting, Vec<&Run>> = BTreeMap::new();
    for run in distinct(runs) {
        if let Some(setting) = Setting::of(run) {
            settings.entry(setting).or_default().push(run);
        }
    }
    settings
        .into_iter()
        .map(|(setting, runs)| SettingTable { setting, groups: groups(&runs), report: ReportSettings::default() })
        .collect()
}

fn groups<'a>(runs: &[&'a Run]) -> Vec<Group<'a>> {
    let mut models: Vec<&str> = Vec::new();
    let mut by_key: BTreeMap<(usize, bool, &str), Vec<&'a Run>> = BTreeMap::new();
    for run in runs {
        let s = run.finished().expect("summarize keeps finished runs only");
        let model_index = models.iter().position(|m| *m == s.model).unwrap_or_else(|| {
            models.push(&s.model);
            models.len() - 1
        });
        by_key.entry((model_index, !s.is_sequential(), &s.strategy)).or_default().push(run);
    }
    by_key.into_values().map(|members| group(members, runs)).collect()
}

/// The sequential run `s` is measured against: of the same model and seed, with the same threads
/// per device where there is one (else the first).
fn baseline_of<'a>(s: &RunSummary, all: &[&'a Run]) -> Option<&'a RunSummary> {
    let candidates: Vec<&RunSummary> = all
        .iter()
        .filter_map(|r| r.finished())
        .filter(|b| b.is_sequential() && b.model == s.model && b.seed == s.seed)
        .collect();
    candidates.iter().find(|b| b.threads_per_device == s.threads_per_device).or(candidates.first()).copied()
}

fn group<'a>(members: Vec<&'a Run>, all: &[&'a Run]) -> Group<'a> {
    let summaries: Vec<_> = members.iter().filter_map(|r| r.finished()).collect();
    let first = summaries[0];
    let stat = |f: &dyn Fn(&RunSummary) -> f64| {
        Stat::of(&summaries.iter().map(|s| f(s)).collect::<Vec<_>>()).expect("a group has at least one run")
    };
    let metric = |f: fn(&ClassificationMetrics) -> f64| stat(&|s| s.final_metrics.as_ref().map_or(0.0, f));
    let speedups: Vec<f64> = summaries
        .iter()
        .filter_map(|s| {
            let baseline = baseline_of(s, all)?;
            Some(baseline.train_seconds / s.train_seconds.max(1e-12))
        })
        .collect();
    let devices = describe_devices(first);
    Group {
        model: first.model.clone(),
        architecture: first.architecture.clone(),
        strategy: first.strategy.clone(),
        baseline: first.is_sequential(),
        devices,
        train_seconds: stat(&|s| s.train_seconds),
        samples_per_second: stat(&|s| s.train_samples_per_second),
        speedup: Stat::of(&speedups),
        accuracy: metric(|m| m.accuracy),
        macro_precision: metric(|m| m.macro_precision),
        macro_recall: metric(|m| m.macro_recall),
        macro_f1: metric(|m| m.macro_f1),
        bytes: Stat::of(&members.iter().filter_map(|r| r.bytes_total()).collect::<Vec<_>>()),
        communication_share: Stat::of(&members.iter().filter_map(|r| r.communication_share()).collect::<Vec<_>>()),
        prequential: Stat::of(&summaries.iter().filter_map(|s| s.prequential_accuracy).collect::<Vec<_>>()),
        runs: members,
    }
}

/// Mean over `runs` of each epoch's (cumulative training seconds, holdout accuracy), for epochs
/// every run reached: the points of an accuracy-against-wall-time curve.
pub fn accuracy_curve(runs: &[&Run]) -> Vec<(f64, f64)> {
    let epochs = runs.iter().map(|r| r.epochs.len()).min().unwrap_or(0);
    (0..epochs)
        .map(|e| {
            let n = runs.len() as f64;
            let time: f64 =
                runs.iter().map(|r| r.epochs[..=e].iter().map(|x| x.train_seconds).sum::<f64>()).sum::<f64>() / n;
            let accuracy: f64 = runs.iter().map(|r| r.epochs[e].holdout.accuracy).sum::<f64>() / n;
            (time, accuracy)
        })
        .collect()
}

/// Per stage of a model-parallel run, mean over `runs` of the last epoch's compute, transfer and
/// idle seconds; empty for strategies without stages.
pub fn stage_breakdown(runs: &[&Run]) -> Vec<[f64; 3]> {
    let per_run: Vec<Vec<[f64; 3]>> =
        runs.iter().filter_map(|r| Some(r.last_figures()?.pipeline()?.stage_seconds())).collect();
    let Some(stages) = per_run.iter().map(Vec::len).min() else { return Vec::new() };
    let n = per_run.len() as f64;
    (0..stages).map(|s| std::array::from_fn(|k| per_run.iter().map(|r| r[s][k]).sum::<f64>() / n)).collect()
}

/// Points not dominated by another: no other point has fewer-or-equal bytes and
/// higher-or-equal accuracy with one of them strictly better. Input: (bytes, accuracy).
pub fn pareto_front(points: &[(f64, f64)]) -> Vec<usize> {
    let mut front: Vec<usize> = (0..points.len())
        .filter(|&i| {
            let (b, a) = points[i];
            !points.iter().any(|&(b2, a2)| b2 <= b && a2 >= a && (b2 < b || a2 > a))
        })
        .collect();
    front.sort_by(|&i, &j| points[i].0.total_cmp(&points[j].0));
    front
}

/// E.g. "Cpu, 4 threads", "2 × Cpu, 1 thread each", "2 × Cuda(0), shared" or "Cuda(0), Cuda(1)".
fn describe_devices(run: &RunSummary) -> String {
    let per_rank = describe_rank_devices(run);
    match &run.cluster {
        Some(cluster) => format!("{} ranks × ({per_rank})", cluster.ranks),
        None => per_rank,
    }
}

/// The devices of one process (rank 0's, in a multi-process run).
fn describe_rank_devices(run: &RunSummary) -> String {
    let cpu = run.backend.parse::<BackendKind>().is_ok_and(|b| b.is_cpu());
    let first = run.devices.first().map_or("?", |d| d.as_str());
    let count = run.devices.len();
    if cpu {
        let threads = run.threads_per_device;
        let threads = format!("{threads} thread{}", if threads == 1 { "" } else { "s" });
        match count {
            1 => format!("{first}, {threads}"),
            _ => format!("{count} × {first}, {threads} each"),
        }
    } else if run.shared_devices && run.devices.iter().all(|d| d == first) {
        format!("{count} × {first}, shared")
    } else {
        run.devices.join(", ")
    }
}
