//! The `predictive-sync` strategy: model parallelism whose stages skip most exchanges. Each
//! device runs a [`PredictivePolicy`] in the model-parallel batch loop (see
//! [`tandem_parallel::StepPolicy`]).

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use tandem_data::Encoded;
use tandem_models::Classifier;
use tandem_parallel::{ModelParallel, ModelParallelConfig, Ranks, StepPolicy};
use tandem_train::TrainConfig;

use crate::policy::PredictivePolicy;
use crate::predictor::PredictorConfig;
use crate::trigger::TriggerConfig;

/// Largest replay buffer, in batches (a sync step trains on all of them at once).
const MAX_REPLAY_BATCHES: usize = 1000;

/// `[strategy] kind = "predictive-sync"`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PredictiveSyncConfig {
    /// The model-parallel run underneath (stages, cuts, schedule, micro-batches, interconnect).
    pub model_parallel: ModelParallelConfig,
    pub predictor: PredictorConfig,
    pub trigger: TriggerConfig,
    /// Replay buffer (an ablation, 0 = off): at a sync step, also train on the last this many
    /// batches skipped before it.
    pub replay_batches: usize,
}

impl PredictiveSyncConfig {
    /// Checks values serde cannot; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        self.model_parallel.validate().map_err(|e| format!("model_parallel: {e}"))?;
        self.predictor.validate().map_err(|e| format!("predictor: {e}"))?;
        self.trigger.validate().map_err(|e| format!("trigger: {e}"))?;
        if self.replay_batches > MAX_REPLAY_BATCHES {
            return Err(format!("`replay_batches` must be at most {MAX_REPLAY_BATCHES}, got {}", self.replay_batches));
        }
        Ok(())
    }

    /// Short label for run names, e.g. `predictive-sync-holt-periodic4-2s-gpipe-8m`
    /// (`…-velocity-damping0.9-…` for a predictor's non-default settings).
    pub fn label(&self) -> String {
        let trigger = self.trigger.label();
        let mp = self.model_parallel.label();
        let replay = if self.replay_batches > 0 { format!("-replay{}", self.replay_batches) } else { String::new() };
        format!(
            "predictive-sync-{}-{trigger}{replay}{}",
            self.predictor.label(),
            mp.trim_start_matches("model-parallel")
        )
    }

    /// The strategy: `model` cut into stages on `devices`, each device with its own policy. In a
    /// multi-process job (`ranks`), `devices` are this rank's, one per device it runs.
    pub fn build<B: AutodiffBackend>(
        &self,
        model: Classifier<B>,
        train: &TrainConfig,
        devices: Vec<B::Device>,
        profile_data: &Encoded,
        ranks: Option<&dyn Ranks>,
    ) -> Result<ModelParallel<B>, String> {
        self.validate()?;
        let stages = self.model_parallel.stages;
        let policies = (0..stages)
            .map(|_| {
                let policy = PredictivePolicy::<B>::new(&self.predictor, &self.trigger, self.replay_batches);
                Box::new(policy) as Box<dyn StepPolicy<B>>
            })
            .collect();
        let strategy = match ranks {
            Some(ranks) => {
                ModelParallel::across_ranks(model, train, &self.model_parallel, devices, profile_data, ranks)?
            }
            None => ModelParallel::new(model, train, &self.model_parallel, devices, profile_data)?,
        };
        strategy.with_policies(policies)
    }
}
