//! The `predictive-sync` strategy: model parallelism whose stages skip most exchanges. Each
//! stage runs a [`PredictivePolicy`] in the model-parallel batch loop (see
//! [`tandem_parallel::StepPolicy`]): before each global batch the stages vote, and unless one
//! asks for a sync, every stage advances its parameters by its predictor's forecast instead of
//! running the batch. A sync step is the unchanged model-parallel step, whose real update then
//! feeds the predictors.

use std::collections::BTreeMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use serde::{Deserialize, Serialize};
use tandem_data::Encoded;
use tandem_models::Classifier;
use tandem_parallel::{ModelParallel, ModelParallelConfig, Ranks, Stage, StepPolicy};
use tandem_results::SyncFigures;
use tandem_train::TrainConfig;

use crate::predictor::{Forecaster, PredictorConfig};
use crate::trigger::{Evidence, Trigger, TriggerConfig};

/// Bytes of one control message (an alert, or a shared loss): one f64.
const CONTROL_BYTES: u64 = 8;

/// Largest replay buffer, in batches (a sync step trains on all of them at once).
const MAX_REPLAY_BATCHES: usize = 1000;

/// `[strategy] kind = "predictive-sync"`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
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
        let trigger = match &self.trigger {
            TriggerConfig::Periodic { every } => format!("periodic{every}"),
            TriggerConfig::Budget { fraction } => format!("budget{fraction}"),
            other => other.name().to_string(),
        };
        let mp = self.model_parallel.label();
        let replay = if self.replay_batches > 0 { format!("-replay{}", self.replay_batches) } else { String::new() };
        format!(
            "predictive-sync-{}-{trigger}{replay}{}",
            self.predictor.label(),
            mp.trim_start_matches("model-parallel")
        )
    }

    /// The strategy: `model` cut into stages on `devices`, each stage with its own policy. In a
    /// multi-process job (`ranks`), `devices` are this rank's, one per stage it runs.
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
            .map(|_| Box::new(PredictivePolicy::<B>::new(&self.predictor, &self.trigger)) as Box<dyn StepPolicy<B>>)
            .collect();
        let strategy = match ranks {
            Some(ranks) => {
                ModelParallel::across_ranks(model, train, &self.model_parallel, devices, profile_data, ranks)?
            }
            None => ModelParallel::new(model, train, &self.model_parallel, devices, profile_data)?,
        };
        Ok(strategy.with_policies(policies)?.with_replay(self.replay_batches))
    }
}

type Flat<B> = Vec<Tensor<<B as AutodiffBackend>::InnerBackend, 1>>;

/// One stage's predictors, trigger and accounting.
pub struct PredictivePolicy<B: AutodiffBackend> {
    predictor: PredictorConfig,
    /// One per parameter tensor, made at the first sync step.
    forecasters: Vec<Forecaster<B::InnerBackend>>,
    trigger: Trigger,
    /// θ before the running sync step's update, and the forecast made for that update.
    before: Flat<B>,
    forecast: Option<Flat<B>>,
    /// θ after the last sync (for the drift).
    at_sync: Flat<B>,
    epoch: EpochCounts,
}

#[derive(Default)]
struct EpochCounts {
    syncs: u64,
    predicted: u64,
    /// Predicted steps between consecutive syncs → how often.
    horizons: BTreeMap<usize, u64>,
    control_bytes: u64,
    relative_errors: Vec<f64>,
}

impl<B: AutodiffBackend> PredictivePolicy<B> {
    pub fn new(predictor: &PredictorConfig, trigger: &TriggerConfig) -> Self {
        Self {
            predictor: predictor.clone(),
            forecasters: Vec::new(),
            trigger: Trigger::new(trigger),
            before: Vec::new(),
            forecast: None,
            at_sync: Vec::new(),
            epoch: EpochCounts::default(),
        }
    }

    fn evidence(&self, stage: &Stage<B>) -> Evidence {
        let needs_drift = matches!(self.trigger_config(), TriggerConfig::SafeZone { .. });
        if !needs_drift || self.at_sync.is_empty() {
            return Evidence::default();
        }
        let now = flatten(stage.module());
        let drift = now.iter().zip(&self.at_sync).map(|(a, b)| squared_norm(a.clone() - b.clone())).sum::<f64>().sqrt();
        let h = self.trigger.since_sync() + 1;
        let uncertainty = self
            .forecasters
            .iter()
            .zip(&now)
            .map(|(f, t)| f.forecast_variance(h).map(|v| v * t.dims()[0] as f64))
            .sum::<Option<f64>>()
            .map(f64::sqrt);
        Evidence { drift, uncertainty }
    }

    fn trigger_config(&self) -> &TriggerConfig {
        self.trigger.config()
    }
}

impl<B: AutodiffBackend> StepPolicy<B> for PredictivePolicy<B> {
    fn wants_sync(&mut self, stage: &Stage<B>) -> bool {
        let vote = self.trigger.wants_sync(&self.evidence(stage));
        // A stage that asks for a sync its peers cannot foresee sends one alert.
        if vote
            && self.trigger.counts().1 > 0
            && matches!(self.trigger_config(), TriggerConfig::SafeZone { .. } | TriggerConfig::Adaptive { .. })
        {
            self.epoch.control_bytes += CONTROL_BYTES;
        }
        vote
    }

    fn before_update(&mut self, stage: &Stage<B>) {
        self.before = flatten(stage.module());
        if self.forecasters.len() != self.before.len() {
            self.forecasters = self.before.iter().map(|_| Forecaster::new(&self.predictor)).collect();
        }
        self.forecast = self.forecasters.iter().map(|f| f.forecast(1)).collect();
    }

    fn after_update(&mut self, stage: &Stage<B>, loss: f64, last_stage: bool) {
        let after = flatten(stage.module());
        let deltas: Flat<B> = after.iter().zip(&self.before).map(|(a, b)| a.clone() - b.clone()).collect();
        let norm = deltas.iter().map(|d| squared_norm(d.clone())).sum::<f64>().sqrt();
        let error = self.forecast.take().map(|forecast| {
            let miss: f64 = forecast.into_iter().zip(&deltas).map(|(f, d)| squared_norm(f - d.clone())).sum();
            miss.sqrt() / norm.max(1e-30)
        });
        if let Some(e) = error {
            self.epoch.relative_errors.push(e);
        }
        for (f, d) in self.forecasters.iter_mut().zip(deltas) {
            f.observe(d);
        }
        if self.trigger.counts().1 > 0 {
            *self.epoch.horizons.entry(self.trigger.since_sync()).or_default() += 1;
        }
        // The adaptive trigger needs the loss on every stage: the last stage sends it.
        if last_stage && matches!(self.trigger_config(), TriggerConfig::Adaptive { .. }) {
            self.epoch.control_bytes += CONTROL_BYTES;
        }
        self.trigger.synced(error, norm, loss);
        self.at_sync = after;
        self.epoch.syncs += 1;
    }

    fn skip(&mut self, stage: &mut Stage<B>) {
        let h = self.trigger.since_sync() + 1;
        let updates: Vec<Option<Tensor<B::InnerBackend, 1>>> = self.forecasters.iter().map(|f| f.forecast(h)).collect();
        if updates.iter().any(Option::is_some) {
            stage.map_parameters(&mut AddUpdates { updates: updates.into_iter() });
        }
        self.trigger.predicted();
        self.epoch.predicted += 1;
    }

    fn control_bytes(&self) -> u64 {
        self.epoch.control_bytes
    }

    fn take_epoch_figures(&mut self) -> SyncFigures {
        let epoch = std::mem::take(&mut self.epoch);
        let errors = &epoch.relative_errors;
        SyncFigures {
            predictor: self.predictor.name().into(),
            trigger: self.trigger_config().name().into(),
            sync_steps: epoch.syncs,
            predicted_steps: epoch.predicted,
            horizons: epoch.horizons,
            relative_error_mean: (!errors.is_empty()).then(|| errors.iter().sum::<f64>() / errors.len() as f64),
            ..SyncFigures::default()
        }
    }
}

fn squared_norm<B: burn::tensor::backend::Backend>(t: Tensor<B, 1>) -> f64 {
    (t.clone() * t).sum().into_scalar().elem()
}

/// The float parameters' values, each flattened, in visiting order.
fn flatten<B: AutodiffBackend>(module: &Classifier<B>) -> Flat<B> {
    struct Collect<B: AutodiffBackend>(Flat<B>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let values = param.val().inner();
            let n = values.shape().num_elements();
            self.0.push(values.reshape([n]));
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

/// Adds each parameter's forecast update (none: unchanged), keeping ids and `require_grad`.
struct AddUpdates<I> {
    updates: I,
}

impl<B: AutodiffBackend, I: Iterator<Item = Option<Tensor<B::InnerBackend, 1>>>> ModuleMapper<B> for AddUpdates<I> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(Some(update)) = self.updates.next() else { return param };
        param.map(|t| {
            let trainable = t.is_require_grad();
            let shape = t.shape();
            let moved = Tensor::from_inner(t.inner() + update.reshape(shape));
            if trainable {
                moved.require_grad()
            } else {
                moved
            }
        })
    }
}
