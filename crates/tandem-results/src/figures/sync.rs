//! The figures of predictive synchronisation: how often the stages synced, how well the
//! predictor forecast, and what the protocol cost.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A protocol between real model-parallel steps (predictive synchronisation, local learning)
/// over the batches of one record. The step counts and the forecast error are one stage's (they
/// are the same on every stage); control bytes, label bytes and prediction time cover all stages.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SyncFigures {
    /// The protocol (`predictive`, `local`; absent in older results: `predictive`).
    #[serde(default = "predictive", skip_serializing_if = "is_predictive")]
    pub protocol: String,
    /// The predictor's and the trigger's names (local learning: the last stage's predictor, or
    /// `replay`).
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
    /// Bytes of labels sent per step to stages that would not have them under vanilla model
    /// parallelism (local learning), over all stages.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub label_bytes_per_step: f64,
    /// Parameters of each stage's auxiliary head (local learning; empty: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aux_parameters: Vec<usize>,
    /// Steps between real steps (local learning), and among them those where activations
    /// travelled forward.
    #[serde(default, skip_serializing_if = "is_zero_count")]
    pub local_steps: u64,
    #[serde(default, skip_serializing_if = "is_zero_count")]
    pub transfer_steps: u64,
    /// Per stage: seconds spent predicting.
    pub predict_seconds: Vec<f64>,
    /// Samples trained on again from the replay buffer.
    pub replayed_samples: usize,
}

fn predictive() -> String {
    "predictive".into()
}

fn is_predictive(protocol: &str) -> bool {
    protocol == "predictive"
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero_count(n: &u64) -> bool {
    *n == 0
}
