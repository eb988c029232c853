//! `[strategy] kind = "model-parallel"`: how the model is cut, placed and scheduled.

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use tandem_models::{positive, Invalid};
use tandem_train::Strategy;

use super::ModelParallel;
use crate::compression::CompressionConfig;
use crate::kind::{check_timeout, BuildError, Ingredients, StrategyKind};
use crate::link::Interconnect;
use crate::schedule::{Layout, Schedule};

/// How cut points are chosen when the manifest gives none.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Balance {
    /// Stages with parameter counts as even as possible.
    Params,
    /// Stages with training-step times as even as possible, from a short profiling pass.
    Time,
}

/// `[strategy] kind = "model-parallel"`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ModelParallelConfig {
    /// Number of devices: one thread each (on a CPU, `[train] threads` cores each).
    #[schemars(range(min = 1))]
    pub stages: usize,
    /// Stages each device runs (interleaved schedules): the model is cut into
    /// `stages × virtual_stages` pieces, piece `s` on device `s % stages`.
    #[serde(skip_serializing_if = "is_one")]
    #[schemars(range(min = 1), default = "one")]
    pub virtual_stages: usize,
    /// Explicit cut points (block indices, strictly increasing); overrides `balance`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuts: Option<Vec<usize>>,
    pub balance: Balance,
    /// The pipeline schedule: when each stage runs which micro-batch's forward and backward.
    pub schedule: Schedule,
    /// Micro-batches per global batch (the naive schedule uses 1).
    #[schemars(range(min = 1))]
    pub micro_batches: usize,
    /// Simulated interconnect on every stage boundary.
    pub interconnect: Interconnect,
    /// How boundaries encode activations and gradients (default: 32 bits, lossless).
    #[serde(skip_serializing_if = "CompressionConfig::is_lossless")]
    pub compression: CompressionConfig,
    /// A stage that waits this long for a message, or a run where no stage reports progress for
    /// this long, fails.
    pub timeout_seconds: f64,
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

fn one() -> usize {
    1
}

impl Default for ModelParallelConfig {
    fn default() -> Self {
        Self {
            stages: 2,
            virtual_stages: 1,
            cuts: None,
            balance: Balance::Time,
            schedule: Schedule::GPIPE,
            micro_batches: 8,
            interconnect: Interconnect::default(),
            compression: CompressionConfig::default(),
            timeout_seconds: 600.0,
        }
    }
}

impl ModelParallelConfig {
    /// Pieces the model is cut into: `stages × virtual_stages`.
    pub fn pieces(&self) -> usize {
        self.stages * self.virtual_stages
    }

    /// The layout of a global batch of `micro` micro-batches.
    pub fn layout(&self, micro: usize) -> Layout {
        Layout { devices: self.stages, virtual_stages: self.virtual_stages, micro }
    }

    /// Micro-batches a global batch of `samples` samples runs as: the schedule's count, at most
    /// one per sample.
    pub fn micro_batches_for(&self, samples: usize) -> usize {
        self.schedule.micro_batches(self.micro_batches).min(samples).max(1)
    }

    /// What a run name says of these settings after the kind, e.g. `-2s-gpipe-8m`,
    /// `-2s-naive-1gbe`, `-3s-cuts1-3-1f1b-4m` or `-2s-2v-interleaved-1f1b-4m`.
    pub fn settings_label(&self) -> String {
        let mut label = format!("-{}s", self.stages);
        if self.virtual_stages != 1 {
            label += &format!("-{}v", self.virtual_stages);
        }
        match (&self.cuts, self.balance) {
            (Some(cuts), _) => {
                label += &format!("-cuts{}", cuts.iter().map(usize::to_string).collect::<Vec<_>>().join("-"))
            }
            (None, Balance::Params) => label += "-params",
            (None, Balance::Time) => {}
        }
        label += &format!("-{}", self.schedule.name());
        if self.schedule != Schedule::NAIVE {
            label += &format!("-{}m", self.micro_batches);
        }
        if self.interconnect.figures().is_some() {
            label += &format!("-{}", self.interconnect.name());
        }
        label + &self.compression.label()
    }
}

impl StrategyKind for ModelParallelConfig {
    fn name(&self) -> &'static str {
        "model-parallel"
    }

    /// E.g. `model-parallel-2s-gpipe-8m`.
    fn label(&self) -> String {
        format!("model-parallel{}", self.settings_label())
    }

    fn validate(&self) -> Result<(), Invalid> {
        positive("stages", self.stages)?;
        positive("micro_batches", self.micro_batches)?;
        self.schedule.check_virtual_stages(self.virtual_stages)?;
        if let Some(cuts) = &self.cuts {
            if cuts.len() + 1 != self.pieces() {
                let message = match self.virtual_stages {
                    1 => format!("`cuts` {cuts:?} make {} stages but `stages` is {}", cuts.len() + 1, self.stages),
                    v => format!(
                        "`cuts` {cuts:?} make {} stages but `stages` × `virtual_stages` is {} × {v}",
                        cuts.len() + 1,
                        self.stages
                    ),
                };
                return Err(Invalid::at("cuts", message));
            }
        }
        check_timeout(self.timeout_seconds)?;
        self.compression.validate()?;
        self.interconnect.validate()
    }

    fn model_parallel(&self) -> Option<(&ModelParallelConfig, Option<&'static str>)> {
        Some((self, None))
    }

    fn model_parallel_mut(&mut self) -> Option<&mut ModelParallelConfig> {
        Some(self)
    }

    fn build<B: AutodiffBackend>(&self, with: Ingredients<B>) -> Result<Box<dyn Strategy<B>>, BuildError> {
        Ok(Box::new(ModelParallel::for_job(with.model, with.train, self, with.devices, with.data, with.ranks)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::Preset;

    #[test]
    fn labels_name_the_schedule_and_a_simulated_interconnect() {
        let naive = ModelParallelConfig { schedule: Schedule::NAIVE, ..Default::default() };
        assert_eq!(naive.label(), "model-parallel-2s-naive");
        let cut = ModelParallelConfig {
            stages: 3,
            cuts: Some(vec![1, 3]),
            schedule: Schedule::ONE_F_ONE_B,
            micro_batches: 4,
            ..Default::default()
        };
        assert_eq!(cut.label(), "model-parallel-3s-cuts1-3-1f1b-4m");
        let slow = ModelParallelConfig { interconnect: Interconnect::Preset(Preset::OneGbE), ..Default::default() };
        assert_eq!(slow.label(), "model-parallel-2s-gpipe-8m-1gbe");
        let interleaved = ModelParallelConfig {
            virtual_stages: 2,
            schedule: Schedule::INTERLEAVED_1F1B,
            micro_batches: 4,
            ..Default::default()
        };
        assert_eq!(interleaved.label(), "model-parallel-2s-2v-interleaved-1f1b-4m");
        assert!(ModelParallelConfig { timeout_seconds: 0.0, ..Default::default() }.validate().is_err());
    }

    #[test]
    fn virtual_stages_need_an_interleaved_schedule_and_matching_cuts() {
        let one_f_one_b =
            ModelParallelConfig { virtual_stages: 2, schedule: Schedule::ONE_F_ONE_B, ..Default::default() };
        assert!(one_f_one_b.validate().unwrap_err().field.as_deref() == Some("virtual_stages"));
        let cuts = ModelParallelConfig {
            virtual_stages: 2,
            schedule: Schedule::INTERLEAVED_1F1B,
            cuts: Some(vec![1]),
            ..Default::default()
        };
        assert!(cuts.validate().unwrap_err().to_string().contains("2 × 2"));
        assert_eq!(ModelParallelConfig { virtual_stages: 3, ..Default::default() }.pieces(), 6);
    }

    #[test]
    fn the_resolved_manifest_keeps_its_form_without_virtual_stages() {
        let text = serde_json::to_string(&ModelParallelConfig::default()).unwrap();
        assert!(!text.contains("virtual_stages"), "{text}");
    }
}
