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
use tandem_results::{Protocol, SyncFigures};

use crate::predictor::{Forecaster, PredictorConfig};
use crate::trigger::{Evidence, Trigger, TriggerConfig};
use tandem_train::bytes::{Reader, Writer};
use tandem_train::StateError;

/// Bytes of one control message (an alert, or a shared loss): one f64.
pub(crate) const CONTROL_BYTES: u64 = 8;

type Flat<B> = Vec<Tensor<<B as AutodiffBackend>::InnerBackend, 1>>;

/// One device's predictors, trigger, replay buffer and accounting.
pub struct PredictivePolicy<B: AutodiffBackend> {
    forecasts: Forecasts<B>,
    trigger: Trigger,
    /// θ after the last sync (for the drift).
    at_sync: Flat<B>,
    /// Batches skipped since the last sync, kept for replay (at most `replay`).
    replay: usize,
    skipped: VecDeque<Vec<usize>>,
    epoch: EpochCounts,
}

/// What a protocol counts over the steps of one record.
#[derive(Default)]
pub(crate) struct EpochCounts {
    pub syncs: u64,
    pub predicted: u64,
    /// Predicted steps between consecutive syncs → how often.
    pub horizons: BTreeMap<usize, u64>,
    pub control_bytes: u64,
    pub relative_errors: Vec<f64>,
}

impl EpochCounts {
    /// The counts as figures (the pipeline adds the rest); starts a new record.
    pub fn take(&mut self, protocol: Protocol, predictor: &str, trigger: &TriggerConfig) -> SyncFigures {
        let epoch = std::mem::take(self);
        let errors = &epoch.relative_errors;
        SyncFigures {
            protocol,
            predictor: predictor.into(),
            trigger: trigger.name().into(),
            sync_steps: epoch.syncs,
            predicted_steps: epoch.predicted,
            horizons: epoch.horizons,
            relative_error_mean: (!errors.is_empty()).then(|| errors.iter().sum::<f64>() / errors.len() as f64),
            ..SyncFigures::default()
        }
    }

    /// Records a sync step after `since_sync` steps without one.
    pub fn synced(&mut self, since_sync: usize, after_a_sync: bool) {
        if after_a_sync {
            *self.horizons.entry(since_sync).or_default() += 1;
        }
        self.syncs += 1;
    }
}

/// A device's forecasts of its stages' updates: one forecaster per parameter tensor, fed with
/// each sync step's real update.
pub(crate) struct Forecasts<B: AutodiffBackend> {
    predictor: PredictorConfig,
    /// One per parameter tensor of the forecast stages, made at the first sync step.
    forecasters: Vec<Forecaster<B::InnerBackend>>,
    /// θ before the running sync step's update, and the forecast made for that update.
    before: Flat<B>,
    forecast: Option<Flat<B>>,
}

impl<B: AutodiffBackend> Forecasts<B> {
    pub fn new(predictor: &PredictorConfig) -> Self {
        Self { predictor: predictor.clone(), forecasters: Vec::new(), before: Vec::new(), forecast: None }
    }

    pub fn predictor(&self) -> &PredictorConfig {
        &self.predictor
    }

    /// Before a sync step's update of `stages`: θ, and the forecast of the update.
    pub fn before_update<'s>(&mut self, stages: impl Iterator<Item = &'s Stage<B>>) {
        self.before = flatten(stages);
        if self.forecasters.len() != self.before.len() {
            self.forecasters = self.before.iter().map(|_| Forecaster::new(&self.predictor)).collect();
        }
        self.forecast = self.forecasters.iter().map(|f| f.forecast(1)).collect();
    }

    /// After the update: feeds the forecasters. Returns the forecast's relative error (none
    /// without a forecast), the update's norm and θ.
    pub fn after_update<'s>(&mut self, stages: impl Iterator<Item = &'s Stage<B>>) -> (Option<f64>, f64, Flat<B>) {
        let after = flatten(stages);
        let deltas: Flat<B> = after.iter().zip(&self.before).map(|(a, b)| a.clone() - b.clone()).collect();
        let norm = deltas.iter().map(|d| squared_norm(d.clone())).sum::<f64>().sqrt();
        let error = self.forecast.take().map(|forecast| {
            let miss: f64 = forecast.into_iter().zip(&deltas).map(|(f, d)| squared_norm(f - d.clone())).sum();
            miss.sqrt() / norm.max(1e-30)
        });
        for (f, d) in self.forecasters.iter_mut().zip(deltas) {
            f.observe(d);
        }
        (error, norm, after)
    }

    /// A predicted step, `h` steps after the last sync: every parameter moves by its forecast.
    pub fn apply<'s>(&self, h: usize, stages: impl Iterator<Item = &'s mut Stage<B>>)
    where
        B: 's,
    {
        let updates: Vec<Option<Tensor<B::InnerBackend, 1>>> = self.forecasters.iter().map(|f| f.forecast(h)).collect();
        if updates.iter().any(Option::is_some) {
            let mut updates = updates.into_iter();
            for stage in stages {
                stage.map_parameters(&mut AddUpdates { updates: &mut updates });
            }
        }
    }

    /// The forecast's standard deviation `h` steps ahead, as a norm over `now`'s elements
    /// (Kalman only).
    pub fn uncertainty(&self, h: usize, now: &Flat<B>) -> Option<f64> {
        self.forecasters
            .iter()
            .zip(now)
            .map(|(f, t)| f.forecast_variance(h).map(|v| v * t.dims()[0] as f64))
            .sum::<Option<f64>>()
            .map(f64::sqrt)
    }

    /// Bytes of the forecasters' state.
    pub fn held_bytes(&self) -> usize {
        self.forecasters.iter().map(Forecaster::held_bytes).sum()
    }

    pub fn write_state(&self, out: &mut Writer) {
        out.count(self.forecasters.len());
        self.forecasters.iter().for_each(|f| f.write_state(out));
    }

    pub fn read_state(&mut self, input: &mut Reader, device: &B::Device) -> Result<(), StateError> {
        self.forecasters = (0..input.count()?)
            .map(|_| {
                let mut f = Forecaster::new(&self.predictor);
                f.read_state(input, device).map(|()| f)
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }
}

impl<B: AutodiffBackend> PredictivePolicy<B> {
    /// A policy forecasting with `predictor`, syncing when `trigger` says, and training each
    /// sync step also on up to `replay` batches skipped before it.
    pub fn new(predictor: &PredictorConfig, trigger: &TriggerConfig, replay: usize) -> Self {
        Self {
            forecasts: Forecasts::new(predictor),
            trigger: Trigger::new(trigger),
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
        let now = flatten(stages.iter().map(|s| &**s));
        let drift = now.iter().zip(&self.at_sync).map(|(a, b)| squared_norm(a.clone() - b.clone())).sum::<f64>().sqrt();
        let uncertainty = self.forecasts.uncertainty(self.trigger.since_sync() + 1, &now);
        Evidence { drift, uncertainty }
    }

    fn trigger_config(&self) -> &TriggerConfig {
        self.trigger.config()
    }
}

/// Whether the coming step is a sync step. A trigger whose syncs every device foresees
/// (periodic, budget) decides alone, with no message; otherwise the devices vote, and a device
/// asking for a sync the others cannot foresee sends an alert.
pub(crate) fn vote(
    trigger: &Trigger,
    evidence: &Evidence,
    control_bytes: &mut u64,
    peers: &Peers,
) -> Result<bool, StepError> {
    let vote = trigger.wants_sync(evidence);
    if !trigger.config().alerts() {
        return Ok(vote);
    }
    if vote && trigger.counts().1 > 0 {
        *control_bytes += CONTROL_BYTES;
    }
    Ok(peers.sum(if vote { 1.0 } else { 0.0 })? > 0.0)
}

/// After a sync step: every device learns the loss (one sum; the last stage sends it when the
/// trigger needs it) and the trigger records the step.
pub(crate) fn record_sync(
    trigger: &mut Trigger,
    epoch: &mut EpochCounts,
    (error, norm): (Option<f64>, f64),
    loss: Option<f64>,
    peers: &Peers,
) -> Result<(), StepError> {
    let last_stage = loss.is_some();
    let loss = peers.sum(loss.unwrap_or(0.0))?;
    if let Some(e) = error {
        epoch.relative_errors.push(e);
    }
    epoch.synced(trigger.since_sync(), trigger.counts().1 > 0);
    if last_stage && trigger.config().needs_loss() {
        epoch.control_bytes += CONTROL_BYTES;
    }
    trigger.synced(error, norm, loss);
    Ok(())
}

impl<B: AutodiffBackend> StepPolicy<B> for PredictivePolicy<B> {
    fn state(&self) -> Result<Vec<u8>, StateError> {
        let mut out = Writer::default();
        self.forecasts.write_state(&mut out);
        out.count(self.at_sync.len());
        self.at_sync.iter().for_each(|t| {
            out.tensor(t);
        });
        out.count(self.skipped.len());
        self.skipped.iter().for_each(|batch| {
            out.counts(batch);
        });
        out.json(&self.trigger);
        Ok(out.0)
    }

    fn restore(&mut self, state: &[u8], device: &B::Device) -> Result<(), StateError> {
        let mut input = Reader(state);
        self.forecasts.read_state(&mut input, device)?;
        self.at_sync = (0..input.count()?).map(|_| input.tensor(device)).collect::<Result<_, _>>()?;
        self.skipped = (0..input.count()?).map(|_| input.counts()).collect::<Result<_, _>>()?;
        self.trigger = input.json()?;
        input.end()
    }

    fn begin_step(
        &mut self,
        stages: &mut [&mut Stage<B>],
        input: &StepInput,
        peers: &Peers,
    ) -> Result<StepPlan, StepError> {
        let evidence = self.evidence(stages);
        if vote(&self.trigger, &evidence, &mut self.epoch.control_bytes, peers)? {
            return Ok(StepPlan::Train { replayed: self.skipped.drain(..).flatten().collect() });
        }
        self.forecasts.apply(self.trigger.since_sync() + 1, stages.iter_mut().map(|s| &mut **s));
        self.trigger.predicted();
        self.epoch.predicted += 1;
        if self.replay > 0 {
            if self.skipped.len() == self.replay {
                self.skipped.pop_front();
            }
            self.skipped.push_back(input.batch.to_vec());
        }
        Ok(StepPlan::Skip)
    }

    fn before_update(&mut self, stages: &[&mut Stage<B>]) {
        self.forecasts.before_update(stages.iter().map(|s| &**s));
    }

    fn after_update(&mut self, stages: &[&mut Stage<B>], loss: Option<f64>, peers: &Peers) -> Result<(), StepError> {
        let (error, norm, after) = self.forecasts.after_update(stages.iter().map(|s| &**s));
        record_sync(&mut self.trigger, &mut self.epoch, (error, norm), loss, peers)?;
        self.at_sync = after;
        Ok(())
    }

    fn control_bytes(&self) -> u64 {
        self.epoch.control_bytes
    }

    fn held_bytes(&self) -> usize {
        let at_sync: usize = self.at_sync.iter().map(|t| t.shape().num_elements() * size_of::<f32>()).sum();
        self.forecasts.held_bytes() + at_sync
    }

    fn take_epoch_figures(&mut self) -> SyncFigures {
        self.epoch.take(Protocol::Predictive, self.forecasts.predictor().name(), self.trigger.config())
    }
}

pub(crate) fn squared_norm<B: burn::tensor::backend::Backend>(t: Tensor<B, 1>) -> f64 {
    (t.clone() * t).sum().into_scalar().elem()
}

/// The float parameters' values of `stages`, each flattened, in stage and visiting order.
pub(crate) fn flatten<'s, B: AutodiffBackend>(stages: impl Iterator<Item = &'s Stage<B>>) -> Flat<B> {
    stages.flat_map(|stage| flatten_module(stage.module())).collect()
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
