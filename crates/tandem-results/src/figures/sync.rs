//! The figures of predictive synchronisation: how often the stages synced, how well the
//! predictor forecast, and what the protocol cost.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Predictive synchronisation over the batches of one record. The step counts and the
/// forecast error are one stage's (they are the same on every stage); control bytes and
/// prediction time cover all stages.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SyncFigures {
    /// The predictor's and the trigger's names.
    pub predictor: String,
    pub trigger: String,
    /// Real model-parallel steps, and steps skipped with a predicted update.
    pub sync_steps: u64,
    pub predicted_steps: u64,
    /// Predicted steps between consecutive syncs → how often that many.
    pub horizons: BTreeMap<usize, u64>,
    /// Mean of ‖Δ̂ − Δ‖ / ‖Δ‖ over the syncs that had a forecast (`None`: none had).
    pub relative_error_mean: Option<f64>,
    /// Bytes of control messages (alerts, shared losses) per step, over all stages.
    pub control_bytes_per_step: f64,
    /// Per stage: seconds spent predicting.
    pub predict_seconds: Vec<f64>,
    /// Samples trained on again from the replay buffer.
    pub replayed_samples: usize,
}
