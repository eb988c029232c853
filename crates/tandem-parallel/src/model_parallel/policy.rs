//! The seam where a protocol decides, device by device, what each global batch does: a real
//! model-parallel step (vanilla model parallelism does nothing else), or something local that
//! exchanges no tensor — e.g. predictive synchronisation (crate `tandem-sync`) advances the
//! parameters by a forecast. The executor knows nothing of what a policy does; it runs the
//! steps the policy asks for.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;
use tandem_data::Encoded;
use tandem_results::SyncFigures;
use tandem_train::StateError;

use super::scalar_sum::ScalarSum;
use super::stage::Stage;
use crate::schedule::LocalStep;
use crate::supervisor::Failure;

/// What a device does with a global batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepPlan {
    /// A real model-parallel step on the batch and, before it, on `replayed` (sample indices of
    /// earlier batches trained on again; empty for none).
    Train { replayed: Vec<usize> },
    /// No end-to-end step: each of the device's stages trains on its own loss (local learning;
    /// no gradient crosses a boundary), as the [`LocalStep`] says.
    Local(LocalStep),
    /// No model-parallel step: the policy has done whatever it does locally.
    Skip,
}

/// One device's view of a global batch, for its policy.
pub struct StepInput<'a> {
    /// The batch's sample indices, and the data they index.
    pub batch: &'a [usize],
    pub data: &'a Encoded,
    /// Whether this device runs the model's last stage (it has the loss).
    pub last_stage: bool,
    /// The indices of the device's stages, in model order.
    pub stages: &'a [usize],
}

/// A policy's failure: its run stops, naming the device.
pub struct StepError(pub(crate) Failure);

impl fmt::Debug for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl From<String> for StepError {
    fn from(message: String) -> Self {
        StepError(Failure::own(message))
    }
}

/// Sums a value over the run's devices: every device's policy calls [`Peers::sum`] the same
/// number of times per step, and each call returns the same total everywhere.
pub struct Peers<'a, 'l> {
    pub(super) sum: &'a ScalarSum<'l>,
    pub(super) device: usize,
    pub(super) timeout: Duration,
    pub(super) stop: &'a AtomicBool,
    /// Time spent waiting for the other devices (counted as idle, not as the policy's own).
    pub(super) waited: Cell<Duration>,
}

impl Peers<'_, '_> {
    /// The sum of every device's `value`.
    pub fn sum(&self, value: f64) -> Result<f64, StepError> {
        let started = Instant::now();
        let total = self.sum.sum(self.device, value, self.timeout, self.stop).map_err(StepError);
        self.waited.set(self.waited.get() + started.elapsed());
        total
    }
}

/// A device's step policy (one per device; calls come from the device's thread). `stages` are
/// the device's stages, in model order.
pub trait StepPolicy<B: AutodiffBackend>: Send {
    /// Before a global batch: what this device does with it. All devices must agree (use
    /// `peers`), since a real step needs every stage.
    fn begin_step(
        &mut self,
        stages: &mut [&mut Stage<B>],
        input: &StepInput,
        peers: &Peers,
    ) -> Result<StepPlan, StepError>;
    /// A real step's gradients are ready; the optimizer update comes next.
    fn before_update(&mut self, stages: &[&mut Stage<B>]);
    /// A real step is done; `loss` is the batch's mean loss on the device with the last stage
    /// (`None` elsewhere).
    fn after_update(&mut self, stages: &[&mut Stage<B>], loss: Option<f64>, peers: &Peers) -> Result<(), StepError>;
    /// A local step is done (a [`StepPlan::Local`]): each of the device's stages that trained
    /// on its own loss, with that loss.
    fn after_local(&mut self, _losses: &[(usize, f64)]) {}
    /// Bytes of control messages this device sent in the current epoch.
    fn control_bytes(&self) -> u64;
    /// Bytes of state it keeps between steps (a predictor's, the parameters at the last sync),
    /// counted in the protocol state a run holds.
    fn held_bytes(&self) -> usize {
        0
    }
    /// The policy's state between steps, to checkpoint a run (an error where it cannot be).
    fn state(&self) -> Result<Vec<u8>, StateError>;
    /// Continues from [`StepPolicy::state`]'s bytes, with tensors on the device's `device`.
    fn restore(&mut self, state: &[u8], device: &B::Device) -> Result<(), StateError>;
    /// The epoch's protocol figures (names, step counts, horizons, forecast error); starts a new
    /// epoch. The pipeline fills in the figures over all devices (control bytes, prediction
    /// time, replayed samples).
    fn take_epoch_figures(&mut self) -> SyncFigures;
}
