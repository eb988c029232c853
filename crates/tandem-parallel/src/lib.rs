//! Parallel training strategies that plug into `tandem_train`'s [`Strategy`](tandem_train::Strategy) seam.
//!
//! - [`DataParallel`] is PyTorch-DDP-style data parallelism: N replicas, one thread (and one
//!   device) each, every global batch split into N disjoint shards, gradients **averaged** with
//!   a burn-collective all-reduce, and the same optimizer step applied on every replica.
//! - [`ModelParallel`] cuts the model into stages on devices (one thread each; several stages per
//!   device with an interleaved schedule), connected by counted [links](link) that can simulate an
//!   interconnect. A [`Stage`] says *what* runs (a micro-batch's forward or backward pass); a
//!   [`Schedule`] says *when*, as a list of [`Action`]s per device (naive, GPipe, 1F1B,
//!   interleaved 1F1B) that one executor runs. A [`StepPolicy`] per device may turn a global
//!   batch into something other than a real step (predictive synchronisation).
//! - Across processes and machines, [`DataParallel::across_ranks`] adds a second level of
//!   all-reduce over the [`Ranks`] of a job (MPI: `MpiRanks`, feature `mpi`), and
//!   [`ModelParallel::across_ranks`] runs each rank's share of the stages, with the boundaries
//!   between ranks relayed over MPI point-to-point messages.

mod collective;
pub mod compression;
mod data_parallel;
mod exchange;
mod kind;
pub mod link;
mod model_parallel;
#[cfg(feature = "mpi")]
mod mpi_ranks;
mod ranks;
pub mod schedule;
mod shard;
mod supervisor;

pub use collective::AllReduceKind;
pub use compression::{CompressionConfig, Scheme};
pub use data_parallel::{BatchSemantics, DataParallel, DataParallelConfig, LrScaling};
pub use exchange::{CommStats, GradientExchange};
pub use kind::{BuildError, Ingredients, StrategyKind};
pub use link::{Interconnect, Preset};
pub use model_parallel::{
    balanced_cuts, checkpoint_cuts, fresh_leaves, profile_blocks, wire_bytes, AddOnSite, Balance, MicroBatch,
    ModelParallel, ModelParallelConfig, OwnStep, Peers, Stage, StageAddOn, StepError, StepInput, StepPlan, StepPolicy,
    Wire, LABEL_BYTES,
};
#[cfg(feature = "mpi")]
pub use mpi_ranks::MpiRanks;
pub use ranks::{
    cross_rank_timeout, fingerprint, launched_by_mpi, launched_job_size, local_ranks_command, RankError, RankLink,
    Ranks,
};
pub use schedule::{theoretical_bubble, Action, Layout, LocalStep, OwnInput, Pass, PipelineSchedule, Schedule};
pub use shard::shard_ranges;
pub use supervisor::{on_stuck_worker, StuckHandler};
