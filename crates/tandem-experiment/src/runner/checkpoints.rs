//! A run's checkpoint (one per process of a multi-process job), written at every epoch or
//! evaluation point and where a signal stops a run (keep-last: each replaces the one before, as
//! a patch of what changed since it: [`PatchedFile`]), and removed when the run finishes; and
//! what the summary says about reproducing a run bit for bit.

use burn::tensor::backend::AutodiffBackend;
use tandem_results::{CheckpointWrites, PatchedFile};
use tandem_train::{PartialPoint, Strategy};

use super::context::RunContext;
use super::resume::{checkpoint_bytes, checkpoint_file};

/// Writes a run's checkpoints.
pub(super) struct Checkpoints {
    file: PatchedFile,
    /// What was written so far.
    pub writes: CheckpointWrites,
    /// Said once that the strategy cannot be checkpointed.
    noted: bool,
}

impl Checkpoints {
    pub fn new(ctx: &RunContext) -> Self {
        let path = ctx.dir.join(checkpoint_file(ctx.ranks.map(|r| r.rank())));
        Self { file: PatchedFile::new(path), writes: CheckpointWrites::default(), noted: false }
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
        match strategy.state() {
            Ok(state) => {
                let bytes = checkpoint_bytes(points_done, partial, &state);
                let cost =
                    self.file.write(&bytes).map_err(|e| format!("cannot write {}: {e}", self.file.path().display()))?;
                self.writes.add(bytes.len(), cost);
                Ok(())
            }
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
    pub fn remove(&mut self) {
        let _ = self.file.remove();
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
