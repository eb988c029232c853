//! The strategies of this crate: `predictive-sync`, model parallelism whose stages skip most
//! exchanges (each device runs a [`PredictivePolicy`]), and `local-learning`, whose stages keep
//! learning between real steps (each device runs a [`LocalPolicy`]); both in the model-parallel
//! batch loop (see [`tandem_parallel::StepPolicy`]).

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use tandem_models::{AuxHeadConfig, Invalid};
use tandem_parallel::{BuildError, Ingredients, ModelParallel, ModelParallelConfig, StepPolicy, StrategyKind};
use tandem_train::Strategy;

use crate::local::{Cadence, LaterStages, LocalPolicy};
use crate::local_stage::LocalStage;
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

impl StrategyKind for PredictiveSyncConfig {
    fn name(&self) -> &'static str {
        "predictive-sync"
    }

    fn validate(&self) -> Result<(), Invalid> {
        self.model_parallel.validate().map_err(|e| e.under("model_parallel"))?;
        self.predictor.validate().map_err(|e| e.under("predictor"))?;
        self.trigger.validate().map_err(|e| e.under("trigger"))?;
        if self.trigger.needs_local_loss() {
            let message = "`local-loss` reads the stages' own losses, which only `kind = \"local-learning\"` has";
            return Err(Invalid::rule(message).under("trigger"));
        }
        if self.replay_batches > MAX_REPLAY_BATCHES {
            let message = format!("`replay_batches` must be at most {MAX_REPLAY_BATCHES}, got {}", self.replay_batches);
            return Err(Invalid::at("replay_batches", message));
        }
        Ok(())
    }

    /// E.g. `predictive-sync-holt-periodic4-2s-gpipe-8m` (`…-velocity-damping0.9-…` for a
    /// predictor's non-default settings).
    fn label(&self) -> String {
        let trigger = self.trigger.label();
        let replay = if self.replay_batches > 0 { format!("-replay{}", self.replay_batches) } else { String::new() };
        format!("predictive-sync-{}-{trigger}{replay}{}", self.predictor.label(), self.model_parallel.settings_label())
    }

    fn model_parallel(&self) -> Option<(&ModelParallelConfig, Option<&'static str>)> {
        Some((&self.model_parallel, Some("model_parallel")))
    }

    fn model_parallel_mut(&mut self) -> Option<&mut ModelParallelConfig> {
        Some(&mut self.model_parallel)
    }

    /// `with.model` cut into stages on `with.devices`, each device with its own policy.
    fn build<B: AutodiffBackend>(&self, with: Ingredients<B>) -> Result<Box<dyn Strategy<B>>, BuildError> {
        self.validate()?;
        let stages = self.model_parallel.stages;
        let policies = (0..stages)
            .map(|_| {
                let policy = PredictivePolicy::<B>::new(&self.predictor, &self.trigger, self.replay_batches);
                Box::new(policy) as Box<dyn StepPolicy<B>>
            })
            .collect();
        let Ingredients { model, train, devices, data, ranks } = with;
        let strategy = ModelParallel::for_job(model, train, &self.model_parallel, devices, data, ranks)?;
        Ok(Box::new(strategy.with_policies(policies)?))
    }
}

/// `[strategy] kind = "local-learning"`: model parallelism whose stages keep learning between
/// real steps, each on a loss of its own (see [`crate::local`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LocalLearningConfig {
    /// The model-parallel run underneath (stages, cuts, schedule, micro-batches, interconnect,
    /// compression).
    pub model_parallel: ModelParallelConfig,
    /// When a real, end-to-end step runs: `periodic`, `budget`, `local-loss`, or `adaptive` with
    /// later stages that predict (it reads their forecast error).
    pub trigger: TriggerConfig,
    /// The auxiliary classifier of every stage before the last.
    pub aux_head: AuxHeadConfig,
    /// Weight of the auxiliary heads' loss added to a real step's loss (0: a real step is
    /// vanilla model parallelism's).
    #[schemars(range(min = 0.0, max = 100.0))]
    pub aux_weight: f64,
    /// The first stage trains on its own loss every this many steps between real steps.
    #[schemars(range(min = 1))]
    pub local_every: usize,
    /// Every this many steps between real steps, the activations travel forward (encoded as
    /// `model_parallel.compression` says; no gradient goes back) and the stages after the first
    /// train on them; 0: never.
    pub transfer_every: usize,
    /// What the stages after the first do on the other steps.
    pub later_stages: LaterStages,
}

impl Default for LocalLearningConfig {
    fn default() -> Self {
        Self {
            model_parallel: ModelParallelConfig::default(),
            trigger: TriggerConfig::local_loss(),
            aux_head: AuxHeadConfig::default(),
            aux_weight: 1.0,
            local_every: 1,
            transfer_every: 0,
            later_stages: LaterStages::default(),
        }
    }
}

impl StrategyKind for LocalLearningConfig {
    fn name(&self) -> &'static str {
        "local-learning"
    }

    fn validate(&self) -> Result<(), Invalid> {
        self.model_parallel.validate().map_err(|e| e.under("model_parallel"))?;
        if self.model_parallel.pieces() < 2 {
            let message = "local learning needs at least 2 stages (`model_parallel.stages`)";
            return Err(Invalid::at("model_parallel.stages", message));
        }
        self.trigger.validate().map_err(|e| e.under("trigger"))?;
        let predicts = matches!(self.later_stages, LaterStages::Predict { .. });
        match &self.trigger {
            TriggerConfig::SafeZone { .. } => {
                let message = "`safe-zone` reads predictive sync's drift, which local learning does not have: use \
                               `local-loss`, `periodic`, `budget` or `adaptive`";
                return Err(Invalid::rule(message).under("trigger"));
            }
            TriggerConfig::Adaptive { .. } if !predicts => {
                let message = "`adaptive` reads the forecast error of later stages that predict \
                               (`later_stages = { kind = \"predict\", … }`); with replay use `local-loss`, `periodic` or \
                               `budget`";
                return Err(Invalid::rule(message).under("trigger"));
            }
            _ => {}
        }
        self.aux_head.validate()?;
        within("aux_weight", (0.0..=100.0).contains(&self.aux_weight), "[0, 100]", self.aux_weight)?;
        within("local_every", (1..=100_000).contains(&self.local_every), "[1, 100000]", self.local_every)?;
        within("transfer_every", self.transfer_every <= 100_000, "[0, 100000]", self.transfer_every)?;
        match &self.later_stages {
            LaterStages::Replay { buffer_batches, every } => {
                let ok = (1..=MAX_REPLAY_BATCHES).contains(buffer_batches);
                let range = format!("[1, {MAX_REPLAY_BATCHES}]");
                within("later_stages.buffer_batches", ok, &range, buffer_batches)?;
                within("later_stages.every", (1..=100_000).contains(every), "[1, 100000]", every)
            }
            LaterStages::Predict { predictor } => predictor.validate().map_err(|e| e.under("later_stages.predictor")),
        }
    }

    /// E.g. `local-linear-replay8-periodic28-2s-gpipe-4m-1gbe` (`-t4` transfers every 4 steps,
    /// `-l2` the first stage every 2, `-w0.5` an aux weight).
    fn label(&self) -> String {
        let mut label =
            format!("local-{}-{}-{}", self.aux_head.label(), self.later_stages.label(), self.trigger.label());
        if self.transfer_every > 0 {
            label += &format!("-t{}", self.transfer_every);
        }
        if self.local_every != 1 {
            label += &format!("-l{}", self.local_every);
        }
        if self.aux_weight != 1.0 {
            label += &format!("-w{:?}", self.aux_weight);
        }
        label + &self.model_parallel.settings_label()
    }

    fn model_parallel(&self) -> Option<(&ModelParallelConfig, Option<&'static str>)> {
        Some((&self.model_parallel, Some("model_parallel")))
    }

    fn model_parallel_mut(&mut self) -> Option<&mut ModelParallelConfig> {
        Some(&mut self.model_parallel)
    }

    /// `with.model` cut into stages on `with.devices`, each stage learning locally, each device
    /// with its own policy.
    fn build<B: AutodiffBackend>(&self, with: Ingredients<B>) -> Result<Box<dyn Strategy<B>>, BuildError> {
        self.validate()?;
        let Ingredients { model, train, devices, data, ranks } = with;
        let cadence = Cadence {
            local_every: self.local_every,
            transfer_every: self.transfer_every,
            later: self.later_stages.clone(),
        };
        let policies = (0..self.model_parallel.stages)
            .map(|_| Box::new(LocalPolicy::<B>::new(cadence.clone(), &self.trigger)) as Box<dyn StepPolicy<B>>)
            .collect();
        let replay_samples = match &self.later_stages {
            LaterStages::Replay { buffer_batches, .. } => buffer_batches * train.batch_size,
            LaterStages::Predict { .. } => 0,
        };
        let strategy = ModelParallel::for_job(model, train, &self.model_parallel, devices, data, ranks)?
            .with_add_ons(data.max_len, |site| {
                Box::new(LocalStage::new(site, &self.aux_head, self.aux_weight, replay_samples))
            });
        Ok(Box::new(strategy.with_policies(policies)?))
    }
}

/// `ok`, or `field` refused: it must be in `range`, not `value`.
fn within(field: &str, ok: bool, range: &str, value: impl std::fmt::Display) -> Result<(), Invalid> {
    match ok {
        true => Ok(()),
        false => Err(Invalid::at(field, format!("`{field}` must be in {range}, got {value}"))),
    }
}
