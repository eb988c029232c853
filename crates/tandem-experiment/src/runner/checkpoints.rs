//! A run's checkpoint file (one per process of a multi-process job), written atomically at
//! every epoch or evaluation point and where a signal stops a run (keep-last: each replaces
//! the one before), and removed when the run finishes; and what the summary says
//! about reproducing a run bit for bit.

use std::path::PathBuf;

use burn::tensor::backend::AutodiffBackend;
use tandem_train::{PartialPoint, Strategy};

use super::context::RunContext;
use super::resume::{checkpoint_bytes, checkpoint_file};
use crate::results;

/// Writes a run's checkpoints.
pub(super) struct Checkpoints {
    path: PathBuf,
    /// Said once that the strategy cannot be checkpointed.
    noted: bool,
}

impl Checkpoints {
    pub fn new(ctx: &RunContext) -> Self {
        Self { path: ctx.dir.join(checkpoint_file(ctx.ranks.map(|r| r.rank()))), noted: false }
    }

    /// Replaces the checkpoint by `strategy`'s state after `points_done` records and, when
    /// stopped part-way through the next one, `partial`. A strategy that cannot be
    /// checkpointed is noted once (an interrupted run of it starts over).
    pub fn write<B: AutodiffBackend>(
        &mut self,
        strategy: &dyn Strategy<B>,
        points_done: usize,
        partial: Option<&PartialPoint>,
    ) -> Result<(), String> {
        let path = &self.path;
        match strategy.state() {
            Ok(state) => results::write_sealed(path, &checkpoint_bytes(points_done, partial, &state))
                .map_err(|e| format!("cannot write {}: {e}", path.display())),
            Err(e) => {
                if !self.noted {
                    eprintln!("note: no checkpoints for this run ({e}): if stopped, it starts over");
                    self.noted = true;
                }
                Ok(())
            }
        }
    }

    /// Removes the checkpoint of a finished run.
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Why a run may not be reproduced bit for bit. Every replica or device draws its dropout masks
/// from its own stream (seed, worker, step), on the CPU and GPU backends alike: nothing, unless
/// the model runs Burn's own encoder layers, whose masks come from the backend's one generator,
/// which several replicas or stages share in an order that varies.
pub(super) fn reproducibility(ctx: &RunContext) -> Option<String> {
    let workers = ctx.strategy.num_devices();
    (ctx.entry.config.draws_backend_dropout() && workers > 1).then(|| {
        "dropout on several replicas or stages drawn from the backend's one random generator (Burn's own encoder \
         layers with `fused = false`): they draw concurrently, so repeated runs may differ"
            .to_string()
    })
}
