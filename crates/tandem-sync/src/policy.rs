//! One device's side of predictive synchronisation. Before each global batch the devices vote
//! (their triggers, on what each sees locally); unless one asks for a sync, every device advances
//! its stages' parameters by its predictor's forecast instead of running the batch, exchanging
//! no tensor. A sync step is the unchanged model-parallel step, whose real update then feeds the
//! predictors. Optionally (replay) a sync step also trains on the batches skipped before it.

use std::collections::{BTreeMap, VecDeque};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use tandem_models::Classifier;
use tandem_parallel::{Peers, Stage, StepError, StepInput, StepPlan, StepPolicy};
use tandem_results::SyncFigures;

use crate::predictor::{Forecaster, PredictorConfig};
use crate::trigger::{Evidence, Trigger, TriggerConfig};

/// Bytes of one control message (an alert, or a shared loss): one f64.
const CONTROL_BYTES: u64 = 8;

type Flat<B> = Vec<Tensor<<B as AutodiffBackend>::InnerBackend, 1>>;

/// One device's predictors, trigger, replay buffer and accounting.
pub struct PredictivePolicy<B: AutodiffBackend> {
    predictor: PredictorConfig,
    /// One per parameter tensor of the device's stages, made at the first sync step.
    forecasters: Vec<Forecaster<B::InnerBackend>>,
    trigger: Trigger,
    /// θ before the running sync step's update, and the forecast made for that update.
    before: Flat<B>,
    forecast: Option<Flat<B>>,
    /// θ after the last sync (for the drift).
    at_sync: Flat<B>,
    /// Batches skipped since the last sync, kept for replay (at most `replay`).
    replay: usize,
    skipped: VecDeque<Vec<usize>>,
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
    /// A policy forecasting with `predictor`, syncing when `trigger` says, and training each
    /// sync step also on up to `replay` batches skipped before it.
    pub fn new(predictor: &PredictorConfig, trigger: &TriggerConfig, replay: usize) -> Self {
        Self {
            predictor: predictor.clone(),
            forecasters: Vec::new(),
            trigger: Trigger::new(trigger),
            before: Vec::new(),
            forecast: None,
            at_sync: Vec::new(),
            replay,
            skipped: VecDeque::new(),
            epoch: EpochCounts::default(),
        }
    }

    fn evidence(&self, stages: &[&mut Stage<B>]) -> Evidence {
        if !self.trigger_config().needs_evidence() || self.at_sync.is_empty() {
            return Evidence::default();
        }
        let now = flatten(stages);
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

    /// A predicted step: every parameter moves by its forecast update; nothing is exchanged.
    fn skip(&mut self, stages: &mut [&mut Stage<B>]) {
        let h = self.trigger.since_sync() + 1;
        let updates: Vec<Option<Tensor<B::InnerBackend, 1>>> = self.forecasters.iter().map(|f| f.forecast(h)).collect();
        if updates.iter().any(Option::is_some) {
            let mut updates = updates.into_iter();
            for stage in stages.iter_mut() {
                stage.map_parameters(&mut AddUpdates { updates: &mut updates });
            }
        }
        self.trigger.predicted();
        self.epoch.predicted += 1;
    }
}

impl<B: AutodiffBackend> StepPolicy<B> for PredictivePolicy<B> {
    fn state(&self) -> Result<Vec<u8>, String> {
        Err("predictive sync's predictors and triggers are not checkpointed".into())
    }

    fn restore(&mut self, _state: &[u8]) -> Result<(), String> {
        Err("predictive sync's predictors and triggers are not checkpointed".into())
    }

    fn begin_step(
        &mut self,
        stages: &mut [&mut Stage<B>],
        input: &StepInput,
        peers: &Peers,
    ) -> Result<StepPlan, StepError> {
        let vote = self.trigger.wants_sync(&self.evidence(stages));
        // A stage that asks for a sync its peers cannot foresee sends one alert.
        if vote && self.trigger.counts().1 > 0 && self.trigger_config().alerts() {
            self.epoch.control_bytes += CONTROL_BYTES;
        }
        if peers.sum(if vote { 1.0 } else { 0.0 })? > 0.0 {
            return Ok(StepPlan::Train { replayed: self.skipped.drain(..).flatten().collect() });
        }
        self.skip(stages);
        if self.replay > 0 {
            if self.skipped.len() == self.replay {
                self.skipped.pop_front();
            }
            self.skipped.push_back(input.batch.to_vec());
        }
        Ok(StepPlan::Skip)
    }

    fn before_update(&mut self, stages: &[&mut Stage<B>]) {
        self.before = flatten(stages);
        if self.forecasters.len() != self.before.len() {
            self.forecasters = self.before.iter().map(|_| Forecaster::new(&self.predictor)).collect();
        }
        self.forecast = self.forecasters.iter().map(|f| f.forecast(1)).collect();
    }

    fn after_update(&mut self, stages: &[&mut Stage<B>], loss: Option<f64>, peers: &Peers) -> Result<(), StepError> {
        // The device with the last stage has the loss; every device learns it (one sum).
        let last_stage = loss.is_some();
        let loss = peers.sum(loss.unwrap_or(0.0))?;
        let after = flatten(stages);
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
        if last_stage && self.trigger_config().needs_loss() {
            self.epoch.control_bytes += CONTROL_BYTES;
        }
        self.trigger.synced(error, norm, loss);
        self.at_sync = after;
        self.epoch.syncs += 1;
        Ok(())
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

/// The float parameters' values of the device's stages, each flattened, in stage and visiting order.
fn flatten<B: AutodiffBackend>(stages: &[&mut Stage<B>]) -> Flat<B> {
    stages.iter().flat_map(|stage| flatten_module(stage.module())).collect()
}

fn flatten_module<B: AutodiffBackend>(module: &Classifier<B>) -> Flat<B> {
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
