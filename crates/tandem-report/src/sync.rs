//! Predictive synchronisation against vanilla model parallelism, and the honest control: a
//! predictor is only useful where it beats `static` (skipping the same batches without
//! predicting) at the same number of sync steps.
//!
//! Read from the runs: strategy labels starting with [`PREDICTIVE`], and each record's sync
//! figures: the predictor's and trigger's names, and its count of sync steps.

use tandem_results::SyncFigures;

use crate::aggregate::{Group, SettingTable, Stat};

/// Strategy label prefix of predictive-sync runs.
pub const PREDICTIVE: &str = "predictive-sync";
/// Strategy label prefix of the vanilla model-parallel runs they are compared with.
pub const VANILLA: &str = "model-parallel";

/// One predictive-sync group against its vanilla model-parallel reference.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncComparison {
    pub model: String,
    pub strategy: String,
    pub predictor: String,
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
    /// Test-then-train accuracy of the synced steps' batches (the only ones with a forward pass).
    pub prequential: Option<f64>,
    /// The `static` group with the same mean number of sync steps, and the accuracy points this
    /// predictor gains over it.
    pub versus_static: Option<(String, f64)>,
}

/// The name `of` the first run's last sync figures give ("?" without them).
fn label(g: &Group, of: fn(&SyncFigures) -> &str) -> String {
    g.runs.first().and_then(|r| r.last_figures()?.sync()).map_or_else(|| "?".into(), |s| of(s).to_string())
}

fn predictor_of(g: &Group) -> String {
    label(g, |s| &s.predictor)
}

fn mean_sync_steps(g: &Group) -> Option<Stat> {
    Stat::of(&g.runs.iter().filter_map(|r| r.sync_steps()).collect::<Vec<_>>())
}

/// The comparisons for every predictive-sync group of `table` that has a vanilla reference.
pub fn compare(table: &SettingTable) -> Vec<SyncComparison> {
    let predictive: Vec<&Group> = table.groups.iter().filter(|g| g.strategy.starts_with(PREDICTIVE)).collect();
    predictive
        .iter()
        .filter_map(|g| {
            let vanilla = table.groups.iter().find(|v| v.model == g.model && v.strategy.starts_with(VANILLA))?;
            let sync_steps = mean_sync_steps(g);
            let predictor = predictor_of(g);
            let versus_static = (predictor != "static")
                .then(|| {
                    predictive.iter().find(|s| {
                        s.model == g.model
                            && predictor_of(s) == "static"
                            && matches!((mean_sync_steps(s), sync_steps), (Some(a), Some(b)) if (a.mean - b.mean).abs() < 0.5)
                    })
                })
                .flatten()
                .map(|s| (s.strategy.clone(), (g.accuracy.mean - s.accuracy.mean) * 100.0));
            Some(SyncComparison {
                model: g.model.clone(),
                strategy: g.strategy.clone(),
                predictor,
                trigger: label(g, |s| &s.trigger),
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

/// The target for predictive synchronisation: at least this much less communication…
pub const TARGET_REDUCTION: f64 = 27.0;
/// … at least this speedup over vanilla model parallelism …
pub const TARGET_SPEEDUP: f64 = 5.0;
/// … losing at most this many accuracy points.
pub const TARGET_POINTS_LOST: f64 = 3.0;

impl SyncComparison {
    /// Whether this protocol meets the target (≥ 27× less communication, ≥ 5× faster, ≤ 3 points lost).
    pub fn meets_target(&self) -> bool {
        self.communication_reduction.is_some_and(|r| r >= TARGET_REDUCTION)
            && self.speedup >= TARGET_SPEEDUP
            && self.accuracy_change >= -TARGET_POINTS_LOST
    }
}
