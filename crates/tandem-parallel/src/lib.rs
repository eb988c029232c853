//! Parallel training strategies that plug into `tandem_train`'s [`Strategy`](tandem_train::Strategy) seam.
//!
//! - [`DataParallel`] is PyTorch-DDP-style data parallelism: N replicas, one thread (and one
//!   device) each, every global batch split into N disjoint shards, gradients **averaged** with
//!   a burn-collective all-reduce, and the same optimizer step applied on every replica.
//! - [`ModelParallel`] cuts the model into stages, one thread (and one device) each, connected by
//!   counted [links](link) that can simulate an interconnect. A [`Stage`] says *what* runs (a
//!   micro-batch's forward or backward pass); a [`Schedule`] says *when* (naive, GPipe, 1F1B).

mod collective;
mod data_parallel;
mod exchange;
pub mod link;
mod model_parallel;
mod schedule;
mod shard;
mod stage;
mod worker;

pub use collective::AllReduceKind;
pub use data_parallel::{DataParallel, DataParallelConfig};
pub use exchange::{CommStats, GradientExchange};
pub use link::{Interconnect, Preset};
pub use model_parallel::{balanced_cuts, profile_blocks, Balance, ModelParallel, ModelParallelConfig, StepPolicy};
pub use schedule::{theoretical_bubble, Action, Schedule};
pub use shard::shard_ranges;
pub use stage::{wire_bytes, Stage, Wire};
