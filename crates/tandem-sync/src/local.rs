//! One device's side of local learning: stages that keep learning between real steps.
//!
//! Between two real (end-to-end) steps, which a trigger schedules as for predictive sync, each
//! stage before the last trains on the loss of its own auxiliary head, on its own batches; the
//! stages after it train on the activations sent forward every `transfer_every` steps
//! (compressed as the boundary's codec says; no gradient goes back), and in between either on
//! inputs they received before (features replay) or advance by a predictor's forecast. A real
//! step is vanilla model parallelism's, with the auxiliary loss added at `aux_weight`.

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use tandem_parallel::{LocalStep, Peers, Stage, StepError, StepInput, StepPlan, StepPolicy};
use tandem_results::{Protocol, SyncFigures};

use crate::policy::{record_sync, vote, EpochCounts, Forecasts};
use crate::predictor::PredictorConfig;
use crate::trigger::{Evidence, Trigger, TriggerConfig};
use tandem_train::bytes::{Reader, Writer};
use tandem_train::StateError;

/// `later_stages`: what the stages after the first do on steps that transfer nothing.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LaterStages {
    /// Train again on inputs received at real or transfer steps (features replay): the last
    /// `buffer_batches` global batches' worth, one batch's worth every `every` steps.
    Replay {
        /// Global batches of received inputs each stage keeps.
        #[serde(default = "buffer_batches")]
        #[schemars(range(min = 1, max = 1000))]
        buffer_batches: usize,
        /// Replay on every this many steps between real steps.
        #[serde(default = "one")]
        #[schemars(range(min = 1))]
        every: usize,
    },
    /// Advance the parameters by a predictor's forecast of their next real update
    /// (`static`: keep them).
    Predict { predictor: PredictorConfig },
}

fn buffer_batches() -> usize {
    8
}
fn one() -> usize {
    1
}

impl Default for LaterStages {
    fn default() -> Self {
        Self::Replay { buffer_batches: buffer_batches(), every: one() }
    }
}

impl LaterStages {
    /// For run names: `replay8`, `replay8e2`, or the predictor's label.
    pub fn label(&self) -> String {
        match self {
            Self::Replay { buffer_batches, every: 1 } => format!("replay{buffer_batches}"),
            Self::Replay { buffer_batches, every } => format!("replay{buffer_batches}e{every}"),
            Self::Predict { predictor } => predictor.label(),
        }
    }

    /// The name in figures: `replay` or the predictor's.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Replay { .. } => "replay",
            Self::Predict { predictor } => predictor.name(),
        }
    }
}

/// How often each role works between real steps.
#[derive(Clone, Debug)]
pub(crate) struct Cadence {
    pub local_every: usize,
    pub transfer_every: usize,
    pub later: LaterStages,
}

/// One device's trigger, forecasts (when later stages predict) and accounting.
pub struct LocalPolicy<B: AutodiffBackend> {
    cadence: Cadence,
    trigger: Trigger,
    forecasts: Option<Forecasts<B>>,
    /// The device's stage indices (from the running step).
    ids: Vec<usize>,
    epoch: EpochCounts,
    local_steps: u64,
    transfer_steps: u64,
}

impl<B: AutodiffBackend> LocalPolicy<B> {
    pub(crate) fn new(cadence: Cadence, trigger: &TriggerConfig) -> Self {
        let forecasts = match &cadence.later {
            LaterStages::Predict { predictor } => Some(Forecasts::new(predictor)),
            LaterStages::Replay { .. } => None,
        };
        Self {
            cadence,
            trigger: Trigger::new(trigger),
            forecasts,
            ids: Vec::new(),
            epoch: EpochCounts::default(),
            local_steps: 0,
            transfer_steps: 0,
        }
    }
}

/// The stages after the first among a device's `stages` (indices `ids`).
fn later<'s, B: AutodiffBackend>(stages: &'s [&mut Stage<B>], ids: &'s [usize]) -> impl Iterator<Item = &'s Stage<B>> {
    stages.iter().zip(ids).filter(|(_, &id)| id > 0).map(|(s, _)| &**s)
}

fn later_mut<'s, 'a: 's, B: AutodiffBackend>(
    stages: &'s mut [&'a mut Stage<B>],
    ids: &'s [usize],
) -> impl Iterator<Item = &'s mut Stage<B>> + use<'s, 'a, B> {
    stages.iter_mut().zip(ids).filter(|(_, &id)| id > 0).map(|(s, _)| &mut **s)
}

impl<B: AutodiffBackend> StepPolicy<B> for LocalPolicy<B> {
    fn begin_step(
        &mut self,
        stages: &mut [&mut Stage<B>],
        input: &StepInput,
        peers: &Peers,
    ) -> Result<StepPlan, StepError> {
        self.ids = input.stages.to_vec();
        if vote(&self.trigger, &Evidence::default(), &mut self.epoch.control_bytes, peers)? {
            return Ok(StepPlan::Train { replayed: Vec::new() });
        }
        let n = self.trigger.since_sync() + 1;
        self.trigger.predicted();
        self.local_steps += 1;
        let Cadence { local_every, transfer_every, later } = &self.cadence;
        let transfer = *transfer_every > 0 && n.is_multiple_of(*transfer_every);
        self.transfer_steps += transfer as u64;
        let first = self.ids.first() == Some(&0) && n.is_multiple_of(*local_every);
        let replay = match later {
            LaterStages::Replay { every, .. } => n.is_multiple_of(*every),
            LaterStages::Predict { .. } => false,
        };
        if let (Some(forecasts), false) = (&self.forecasts, transfer) {
            forecasts.apply(n, later_mut(stages, &self.ids));
            self.epoch.predicted += 1;
        }
        let later_trains = self.ids.iter().any(|&id| id > 0) && (transfer || replay);
        Ok(match first || transfer || later_trains {
            true => StepPlan::Local(LocalStep { first, transfer, replay }),
            false => StepPlan::Skip,
        })
    }

    fn after_local(&mut self, losses: &[(usize, f64)]) {
        // One series per device: the loss of its first stage that learnt (in model order).
        if let Some(&(_, loss)) = losses.first() {
            self.trigger.observe_local_loss(loss);
        }
    }

    fn before_update(&mut self, stages: &[&mut Stage<B>]) {
        if let Some(forecasts) = &mut self.forecasts {
            forecasts.before_update(later(stages, &self.ids));
        }
    }

    fn after_update(&mut self, stages: &[&mut Stage<B>], loss: Option<f64>, peers: &Peers) -> Result<(), StepError> {
        let (error, norm) = match &mut self.forecasts {
            Some(forecasts) => {
                let (error, norm, _) = forecasts.after_update(later(stages, &self.ids));
                (error, norm)
            }
            None => (None, 0.0),
        };
        record_sync(&mut self.trigger, &mut self.epoch, (error, norm), loss, peers)
    }

    fn control_bytes(&self) -> u64 {
        self.epoch.control_bytes
    }

    fn held_bytes(&self) -> usize {
        self.forecasts.as_ref().map_or(0, Forecasts::held_bytes)
    }

    fn state(&self) -> Result<Vec<u8>, StateError> {
        let mut out = Writer::default();
        out.count(self.forecasts.is_some() as usize);
        if let Some(forecasts) = &self.forecasts {
            forecasts.write_state(&mut out);
        }
        out.json(&self.trigger);
        Ok(out.0)
    }

    fn restore(&mut self, state: &[u8], device: &B::Device) -> Result<(), StateError> {
        let mut input = Reader(state);
        if input.count()? == 1 {
            self.forecasts
                .as_mut()
                .ok_or_else(|| StateError::Mismatch("the checkpoint has forecasts this run does not make".into()))?
                .read_state(&mut input, device)?;
        }
        self.trigger = input.json()?;
        input.end()
    }

    fn take_epoch_figures(&mut self) -> SyncFigures {
        let figures = self.epoch.take(Protocol::Local, self.cadence.later.name(), self.trigger.config());
        SyncFigures {
            local_steps: std::mem::take(&mut self.local_steps),
            transfer_steps: std::mem::take(&mut self.transfer_steps),
            ..figures
        }
    }
}
