//! A run trained: on the backend and devices it names, the epoch loop over its set-up strategy,
//! the model saved, and how the run ended.

use std::path::Path;

use burn::tensor::backend::AutodiffBackend;
use tandem_models::Classifier;
use tandem_results::CheckpointWrites;
use tandem_train::{EpochRecord, TrainError};

use super::checkpoints::reproducibility;
use super::context::RunContext;
use super::devices::devices_for;
use super::recorder::Recorder;
use super::setup::{set_up, SetUpFailure, Setup};
use crate::backend::{with_backend, BackendKind, BackendTask, DeviceSpec};
use crate::results::{self, RunStatus};

/// How a run ended.
pub(super) enum Ending {
    Finished,
    Failed(String),
    /// A signal stopped it, at an epoch or evaluation point (`within: None`) or after `within`
    /// steps of the next one; its checkpoint is written.
    Interrupted {
        signal: i32,
        within: Option<usize>,
    },
}

impl Ending {
    pub fn status(&self) -> RunStatus {
        match self {
            Ending::Finished => RunStatus::Finished,
            Ending::Failed(_) => RunStatus::Failed,
            Ending::Interrupted { .. } => RunStatus::Interrupted,
        }
    }

    /// The error a summary records: a failure's (an interrupted run's status says it all).
    pub fn error(&self) -> Option<String> {
        match self {
            Ending::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }
}

/// What a finished, failed or interrupted run returns.
pub(super) struct Outcome {
    pub ending: Ending,
    pub records: Vec<EpochRecord>,
    pub parameters: usize,
    /// The devices the strategy computed on, as the backend names them.
    pub devices: Vec<String>,
    /// Several replicas or stages on one GPU.
    pub shared_devices: bool,
    /// What keeps this run from being reproduced bit for bit, if anything.
    pub reproducibility: Option<String>,
    /// GPU kernels launched per training step (GPU backends).
    pub launches_per_step: Option<f64>,
    /// What this process wrote to its checkpoint.
    pub checkpoints: CheckpointWrites,
}

impl Outcome {
    pub fn failed(error: String) -> Self {
        Self {
            ending: Ending::Failed(error),
            records: Vec::new(),
            parameters: 0,
            devices: Vec::new(),
            shared_devices: false,
            reproducibility: None,
            launches_per_step: None,
            checkpoints: CheckpointWrites::default(),
        }
    }
}

impl From<SetUpFailure> for Outcome {
    fn from(failure: SetUpFailure) -> Self {
        Outcome {
            parameters: failure.parameters,
            shared_devices: failure.shared_devices,
            ..Outcome::failed(failure.error)
        }
    }
}

/// Trains on `backend` with the devices the strategy uses (the first of `devices`, one per
/// replica or stage; on a CPU backend its one device, shared).
pub(super) fn dispatch(backend: BackendKind, devices: &[DeviceSpec], ctx: &RunContext) -> Outcome {
    // In a multi-process job each rank runs its share of the stages (replicas are per rank).
    let wanted = match (ctx.ranks, ctx.strategy.stages()) {
        (Some(ranks), Some(stages)) => stages / ranks.size(),
        _ => ctx.strategy.num_devices(),
    };
    let used = match devices_for(devices, wanted, backend.is_cpu()) {
        Ok(used) => used,
        Err(e) => return Outcome::failed(e),
    };
    let distinct = used.iter().enumerate().filter(|(i, d)| used.iter().position(|u| u == *d) == Some(*i)).count();
    let task = Training { ctx, cpu: backend.is_cpu(), distinct };
    with_backend(backend, &used, task).unwrap_or_else(Outcome::failed)
}

/// A run's training, on whichever backend it names.
struct Training<'a> {
    ctx: &'a RunContext<'a>,
    cpu: bool,
    /// Distinct devices among those used.
    distinct: usize,
}

impl BackendTask for Training<'_> {
    type Output = Outcome;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Outcome {
        match set_up::<B>(devices, self.cpu, self.distinct, self.ctx) {
            Ok(setup) => train_on(setup, self.ctx),
            Err(failure) => failure.into(),
        }
    }
}

/// Trains the set-up strategy from where the run stands, writing `epochs.jsonl` and checkpoints
/// as it goes, and saves the model (on the rank that writes results).
fn train_on<B: AutodiffBackend>(setup: Setup<B>, ctx: &RunContext) -> Outcome {
    let Setup { mut strategy, device, parameters, shared_devices } = setup;
    let (mut recorder, start) = Recorder::new(ctx);
    let (train, data) = (&ctx.train, ctx.data);
    let result = tandem_train::train(
        strategy.as_mut(),
        train,
        ctx.seed,
        &data.train,
        tandem_train::EvalSets { holdout: &data.holdout, validation: data.validation.as_ref() },
        &device,
        &mut recorder,
        start,
    );
    let saved = if ctx.writes_results { save_model(&strategy.model(), &ctx.dir.join("model.bin")) } else { Ok(()) };
    let ending = match (result, saved, recorder.signal()) {
        (Err(TrainError::Stopped(_) | TrainError::Paused { .. }), _, Some(signal)) => {
            Ending::Interrupted { signal, within: recorder.stopped_within }
        }
        (Ok(_), Ok(()), _) => {
            recorder.checkpoints.remove();
            Ending::Finished
        }
        (Ok(_), Err(e), _) => Ending::Failed(e),
        (Err(e), _, _) => Ending::Failed(e.to_string()),
    };
    Outcome {
        ending,
        parameters,
        devices: strategy.devices(),
        shared_devices,
        reproducibility: reproducibility(ctx),
        launches_per_step: recorder.launches.per_step(),
        checkpoints: recorder.checkpoints.writes,
        records: recorder.written,
    }
}

/// Saves the trained parameters to `path` (Burn's binary record, full precision, sealed with its
/// checksum), atomically.
fn save_model<B: AutodiffBackend>(model: &Classifier<B>, path: &Path) -> Result<(), String> {
    let bytes = tandem_train::checkpoint::model_bytes(model)
        .map_err(|e| format!("cannot save the model to {}: {e}", path.display()))?;
    results::write_sealed(path, &bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
