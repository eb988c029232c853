//! The figures of a pipeline of stages: the cut, the schedule, each stage's time and memory,
//! each link's traffic, and, where they apply, predictive sync's and the ranks' figures.

use serde::{Deserialize, Serialize};

use super::SyncFigures;

/// A pipeline of stages over the batches of one record. Per-stage lists hold one value per
/// device, in order (a device runs one stage, or `virtual_stages` of them); per-link lists one
/// per boundary between consecutive stages.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PipelineFigures {
    /// Devices, one thread each.
    pub stages: usize,
    /// Stages each device runs (interleaved schedules; 1 otherwise).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub virtual_stages: usize,
    /// Block indices the model is cut at.
    pub cuts: Vec<usize>,
    /// The schedule's name (`naive`, `gpipe`, `1f1b`, `interleaved-1f1b`).
    pub schedule: String,
    /// Micro-batches per global batch, as run.
    pub micro_batches: usize,
    /// The simulated interconnect's name.
    pub interconnect: String,
    /// How boundaries encode what they carry, e.g. `a4g8-delta` (absent: 32 bits, lossless).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// Parameters of each stage (all `stages × virtual_stages` of them, in model order).
    pub stage_parameters: Vec<usize>,
    pub compute_seconds: Vec<f64>,
    pub transfer_seconds: Vec<f64>,
    pub idle_seconds: Vec<f64>,
    /// Per stage: idle time over wall time.
    pub bubble_fraction: Vec<f64>,
    pub bubble_fraction_mean: f64,
    /// The ideal pipeline's bubble for these stages and micro-batches.
    pub bubble_fraction_theory: f64,
    /// Per stage: most micro-batch activations kept alive at once.
    pub peak_live_activations: Vec<usize>,
    pub links_per_step: Vec<LinkFigures>,
    /// Bytes over all links per step, control messages included.
    pub bytes_per_step: f64,
    /// Transfer time over wall time, mean over stages.
    pub communication_share: f64,
    /// Bytes the stages of this process keep between steps at the record's end: the boundaries'
    /// per-sample memories (AQ-SGD copies, error feedback) and local learning's replay buffers
    /// (predictors' parameter-sized state not counted); absent in results older than the figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_bytes: Option<f64>,
    /// Predictive synchronisation's figures (absent: every step is a real one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncFigures>,
    /// How the stages were spread over the processes of a multi-process run (absent: one process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub across_ranks: Option<PipelineRanks>,
}

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

impl PipelineFigures {
    /// Per stage: compute, transfer and idle seconds.
    pub fn stage_seconds(&self) -> Vec<[f64; 3]> {
        self.compute_seconds
            .iter()
            .zip(&self.transfer_seconds)
            .zip(&self.idle_seconds)
            .map(|((compute, transfer), idle)| [*compute, *transfer, *idle])
            .collect()
    }
}

/// One boundary between consecutive stages: activations forward, gradients backward.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct LinkFigures {
    pub forward: TrafficPerStep,
    pub backward: TrafficPerStep,
}

/// Messages and bytes one direction of a link carried per step.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct TrafficPerStep {
    pub messages: f64,
    pub bytes: f64,
}

/// A pipeline spread over the processes of a multi-process run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PipelineRanks {
    pub ranks: usize,
    pub stages_per_rank: usize,
    /// Bytes sent between ranks per step, over all stage boundaries.
    pub cross_rank_bytes_per_step: f64,
    /// Seconds all stages' relays spent in sends and receives between ranks.
    pub cross_rank_seconds: f64,
}
