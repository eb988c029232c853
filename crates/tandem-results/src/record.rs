//! One line of `epochs.jsonl`: the record of one evaluation point.

use serde::{Deserialize, Serialize};

use crate::figures::StrategyFigures;
use crate::metrics::ClassificationMetrics;

/// One evaluation point's record, as written to `epochs.jsonl`: the end of an epoch, or in
/// stream mode a point of the stream (figures then cover the batches since the previous point).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EpochRecord {
    /// 1-based epoch number (stream mode: the pass).
    pub epoch: usize,
    /// Stream mode: where in the stream this evaluation happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamPoint>,
    pub train_loss: f64,
    pub holdout_loss: f64,
    pub holdout: ClassificationMetrics,
    /// The validation set's loss and metrics (absent without a validation split): what choices
    /// made by looking at results read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<Evaluation>,
    /// Learning rate at the epoch's last step.
    pub learning_rate: f64,
    pub train_seconds: f64,
    pub eval_seconds: f64,
    /// Wall-clock seconds since the previous record was made (since training began, for the
    /// first record of a run or of a resumed run): training, evaluation, and the previous
    /// record's checkpoint and results writing. Absent in results older than the figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_seconds: Option<f64>,
    pub train_samples_per_second: f64,
    pub steps: usize,
    /// Test-then-train accuracy on the training batches since the previous record, each
    /// classified by the forward pass before its update; `None` when no sample was tested. In
    /// stream mode, the prequential accuracy.
    #[serde(default)]
    pub prequential_accuracy: Option<f64>,
    #[serde(default)]
    pub prequential_samples: usize,
    /// What the strategy measured over these batches (communication, stages, syncs…).
    pub figures: StrategyFigures,
}

impl EpochRecord {
    /// The accuracy choices read: validation where the run has a validation set, else holdout.
    pub fn judged_accuracy(&self) -> f64 {
        self.validation.as_ref().map_or(self.holdout.accuracy, |v| v.metrics.accuracy)
    }
}

/// A model evaluated on every sample of a set once.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// Mean loss per sample.
    pub loss: f64,
    pub metrics: ClassificationMetrics,
}

/// A point of the stream (stream mode).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct StreamPoint {
    /// Global batches of the stream consumed so far, over all passes.
    pub batches: usize,
    /// Whether this point ends a pass.
    pub pass_complete: bool,
}
