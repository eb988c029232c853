//! Parallel training strategies that plug into `tandem_train`'s [`Strategy`](tandem_train::Strategy) seam.
//!
//! [`DataParallel`] is PyTorch-DDP-style data parallelism: N replicas, one thread (and one
//! device) each, every global batch split into N disjoint shards, gradients **averaged** with
//! a burn-collective all-reduce, and the same optimizer step applied on every replica.

mod collective;
mod data_parallel;
mod exchange;
mod shard;

pub use collective::AllReduceKind;
pub use data_parallel::{DataParallel, DataParallelConfig};
pub use exchange::{CommStats, GradientExchange};
pub use shard::shard_ranges;
