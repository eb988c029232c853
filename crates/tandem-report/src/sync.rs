//! Protocols that cut model-parallel communication — predictive synchronisation, local
//! learning, compressed boundaries — against vanilla model parallelism, with the honest control
//! for predictors (a predictor is only useful where it beats `static`, skipping the same batches
//! without predicting, at the same number of sync steps), the target verdict, and, where the
//! target is missed, the closest point.
//!
//! Read from the runs' last records: a pipeline's sync figures (protocol, predictor, trigger,
//! sync steps) and its compression. A vanilla run is a pipeline with neither.

use tandem_results::{PipelineFigures, Protocol, StrategyFigures, SyncFigures};

use crate::aggregate::{Group, SettingTable, Stat};

/// The target a protocol is held to: at least this much less communication…
pub const TARGET_REDUCTION: f64 = 27.0;
/// … at least this speedup over vanilla model parallelism …
pub const TARGET_SPEEDUP: f64 = 5.0;
/// … losing at most this many accuracy points.
pub const TARGET_POINTS_LOST: f64 = 3.0;

/// How a group cuts communication: a protocol between real steps, or real steps every time over
/// compressed boundaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    Between(Protocol),
    Compressed,
}

impl Cut {
    /// As the report's tables name it: `predictive`, `local` or `compressed`.
    pub fn name(self) -> &'static str {
        match self {
            Cut::Between(protocol) => protocol.name(),
            Cut::Compressed => "compressed",
        }
    }
}

/// One protocol group against its vanilla model-parallel reference.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncComparison {
    pub model: String,
    pub strategy: String,
    pub protocol: Cut,
    pub predictor: String,
    /// Predictive synchronisation's control: the static predictor.
    pub control: bool,
    pub trigger: String,
    /// The vanilla model-parallel strategy compared with.
    pub reference: String,
    pub sync_steps: Option<Stat>,
    /// Vanilla bytes / these bytes (means over seeds).
    pub communication_reduction: Option<f64>,
    /// Vanilla training time / this training time.
    pub speedup: f64,
    /// Accuracy points gained (negative: lost) against vanilla.
    pub accuracy_change: f64,
    /// Test-then-train accuracy of the batches with a forward pass before their update.
    pub prequential: Option<f64>,
    /// The `static` group with the same mean number of sync steps, and the accuracy points this
    /// predictor gains over it.
    pub versus_static: Option<(String, f64)>,
}

fn pipeline<'a>(g: &'a Group) -> Option<&'a PipelineFigures> {
    g.runs.first().and_then(|r| r.last_figures()).and_then(StrategyFigures::pipeline)
}

fn sync<'a>(g: &'a Group) -> Option<&'a SyncFigures> {
    pipeline(g).and_then(|p| p.sync.as_ref())
}

/// Vanilla model parallelism: a pipeline that syncs every step and compresses nothing.
fn is_vanilla(g: &Group) -> bool {
    pipeline(g).is_some_and(|p| p.sync.is_none() && p.compression.is_none())
}

/// The pipeline's shape, which a protocol and its reference share.
fn shape(p: &PipelineFigures) -> (usize, &[usize], &str, usize, &str) {
    (p.stages, &p.cuts, &p.schedule, p.micro_batches, &p.interconnect)
}

/// The group's protocol, or compression for a vanilla pipeline whose boundaries compress.
fn protocol_of(g: &Group) -> Cut {
    sync(g).map_or(Cut::Compressed, |s| Cut::Between(s.protocol))
}

fn is_control(g: &Group) -> bool {
    sync(g).is_some_and(SyncFigures::is_control)
}

fn mean_sync_steps(g: &Group) -> Option<Stat> {
    Stat::of(&g.runs.iter().filter_map(|r| r.sync_steps()).collect::<Vec<_>>())
}

/// The comparisons for every protocol group of `table` that has a vanilla reference: of the
/// same pipeline shape where there is one, else the model's fastest vanilla group.
pub fn compare(table: &SettingTable) -> Vec<SyncComparison> {
    let protocols: Vec<&Group> = table.groups.iter().filter(|g| pipeline(g).is_some() && !is_vanilla(g)).collect();
    let name = |g: &Group, of: fn(&SyncFigures) -> &str, none: &str| sync(g).map_or(none.to_string(), |s| of(s).into());
    let predictor_of = |g: &Group| name(g, |s| &s.predictor, "—");
    protocols
        .iter()
        .filter_map(|g| {
            let vanillas: Vec<&Group> = table.groups.iter().filter(|v| v.model == g.model && is_vanilla(v)).collect();
            let mine = pipeline(g).map(shape);
            let fastest = vanillas.iter().min_by(|a, b| a.train_seconds.mean.total_cmp(&b.train_seconds.mean));
            let vanilla = vanillas.iter().find(|v| pipeline(v).map(shape) == mine).or(fastest)?;
            let sync_steps = mean_sync_steps(g);
            let protocol = protocol_of(g);
            let predictor = predictor_of(g);
            let predicts = protocol == Cut::Between(Protocol::Predictive) && !is_control(g);
            let versus_static = predicts
                .then(|| {
                    protocols.iter().find(|s| {
                        s.model == g.model
                            && is_control(s)
                            && matches!((mean_sync_steps(s), sync_steps), (Some(a), Some(b)) if (a.mean - b.mean).abs() < 0.5)
                    })
                })
                .flatten()
                .map(|s| (s.strategy.clone(), (g.accuracy.mean - s.accuracy.mean) * 100.0));
            Some(SyncComparison {
                model: g.model.clone(),
                strategy: g.strategy.clone(),
                protocol,
                predictor,
                control: is_control(g),
                trigger: name(g, |s| &s.trigger, "every step"),
                reference: vanilla.strategy.clone(),
                sync_steps,
                communication_reduction: match (vanilla.bytes, g.bytes) {
                    (Some(v), Some(p)) => Some(v.mean / p.mean.max(1.0)),
                    _ => None,
                },
                speedup: vanilla.train_seconds.mean / g.train_seconds.mean.max(1e-12),
                accuracy_change: (g.accuracy.mean - vanilla.accuracy.mean) * 100.0,
                prequential: g.prequential.map(|p| p.mean),
                versus_static,
            })
        })
        .collect()
}

impl SyncComparison {
    /// Whether this protocol meets the target (≥ 27× less communication, ≥ 5× faster, ≤ 3 points lost).
    pub fn meets_target(&self) -> bool {
        self.shortfall() == 0.0
    }

    /// How far the protocol is from the target: the relative shortfall on each criterion, summed
    /// (0 inside the target). Less communication and speed count as ratios (27 / reduction − 1,
    /// 5 / speedup − 1), accuracy as points beyond the 3 allowed, over 3.
    pub fn shortfall(&self) -> f64 {
        let reduction = self.communication_reduction.unwrap_or(0.0).max(1e-9);
        (TARGET_REDUCTION / reduction - 1.0).max(0.0)
            + (TARGET_SPEEDUP / self.speedup.max(1e-9) - 1.0).max(0.0)
            + ((-TARGET_POINTS_LOST - self.accuracy_change) / TARGET_POINTS_LOST).max(0.0)
    }
}

/// The verdict for one model: the protocols that meet the target, or the closest one.
pub fn verdict(model: &str, comparisons: &[SyncComparison]) -> String {
    let mine: Vec<&SyncComparison> = comparisons.iter().filter(|c| c.model == model).collect();
    let met: Vec<&str> = mine.iter().filter(|c| c.meets_target()).map(|c| c.strategy.as_str()).collect();
    if !met.is_empty() {
        return format!("{model}: met by {}", met.join(", "));
    }
    match mine.iter().min_by(|a, b| a.shortfall().total_cmp(&b.shortfall())) {
        Some(c) => format!(
            "{model}: not met; closest {} ({:.1}× less communication, {:.2}× faster, {:+.1} points)",
            c.strategy,
            c.communication_reduction.unwrap_or(0.0),
            c.speedup,
            c.accuracy_change
        ),
        None => format!("{model}: not met"),
    }
}
