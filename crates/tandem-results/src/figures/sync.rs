//! The figures of predictive synchronisation: how often the stages synced, how well the
//! predictor forecast, and what the protocol cost.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A protocol between real model-parallel steps (predictive synchronisation, local learning)
/// over the batches of one record. The step counts and the forecast error are one stage's (they
/// are the same on every stage); control bytes, label bytes and prediction time cover all stages.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SyncFigures {
    /// The protocol (absent in older results: predictive).
    #[serde(default, skip_serializing_if = "Protocol::is_predictive", deserialize_with = "protocol_or_older")]
    pub protocol: Protocol,
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

/// What model-parallel stages do between real steps.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// Predictive synchronisation: the stages apply forecast updates.
    #[default]
    Predictive,
    /// Local learning: the stages train on losses of their own.
    Local,
}

impl Protocol {
    /// As results and reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Predictive => "predictive",
            Protocol::Local => "local",
        }
    }

    fn is_predictive(&self) -> bool {
        *self == Protocol::Predictive
    }
}

/// The protocol as recorded; an empty name (results older than the field's values) is predictive.
fn protocol_or_older<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Protocol, D::Error> {
    let name = String::deserialize(deserializer)?;
    match name.as_str() {
        "" => Ok(Protocol::Predictive),
        _ => Protocol::deserialize(serde::de::value::StrDeserializer::<D::Error>::new(&name)),
    }
}

impl SyncFigures {
    /// Whether the predictor is the static one, predictive synchronisation's control: no
    /// forecast, the skipped batches simply not learned from.
    pub fn is_control(&self) -> bool {
        self.protocol == Protocol::Predictive && self.predictor == "static"
    }
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero_count(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protocol_reads_from_every_format_and_writes_only_when_not_predictive() {
        let read = |json: &str| serde_json::from_str::<SyncFigures>(json).map(|f| f.protocol);
        let rest = r#""predictor":"holt","trigger":"periodic","sync_steps":1,"predicted_steps":3,"horizons":{},"relative_error_mean":null,"control_bytes_per_step":0.0,"predict_seconds":[],"replayed_samples":0"#;
        assert_eq!(read(&format!("{{{rest}}}")).unwrap(), Protocol::Predictive, "absent in older results");
        assert_eq!(read(&format!(r#"{{"protocol":"",{rest}}}"#)).unwrap(), Protocol::Predictive);
        assert_eq!(read(&format!(r#"{{"protocol":"local",{rest}}}"#)).unwrap(), Protocol::Local);
        assert!(read(&format!(r#"{{"protocol":"telepathy",{rest}}}"#)).is_err());
        let local = SyncFigures { protocol: Protocol::Local, ..Default::default() };
        assert!(serde_json::to_string(&local).unwrap().contains(r#""protocol":"local""#));
        assert!(!serde_json::to_string(&SyncFigures::default()).unwrap().contains("protocol"));
    }
}
