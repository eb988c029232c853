//! The figures of data parallelism: the exchange's shape and what it moved and cost.

use serde::{Deserialize, Serialize};

/// Data-parallel replicas over the batches of one record. Per-replica figures are means over
/// the replicas of this process.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DataParallelFigures {
    /// Replicas in this process.
    pub replicas: usize,
    /// The all-reduce algorithm's name.
    pub all_reduce: String,
    pub buckets_per_step: usize,
    /// Whether the embedding's gradient travels as the rows the batch touched.
    pub sparse_embedding: bool,
    pub all_reduce_calls_per_step: f64,
    pub bytes_sent_per_replica_per_step: f64,
    pub bytes_received_per_replica_per_step: f64,
    /// What a replica would send per step with every gradient dense.
    pub dense_bytes_per_replica_per_step: f64,
    /// Seconds a replica spent in all-reduces, and training in all.
    pub all_reduce_seconds: f64,
    pub step_seconds: f64,
    /// `all_reduce_seconds / step_seconds`.
    pub all_reduce_share: f64,
    /// Bytes every replica of every rank sent per step, within and across ranks.
    pub bytes_per_step: f64,
    /// The share of step time spent communicating: the all-reduce share.
    pub communication_share: f64,
    /// Largest difference between two replicas' parameters at the end (0: in sync).
    pub replica_max_abs_difference: f64,
    /// Processes in the job (1: a single-process run).
    pub ranks: usize,
    /// Seconds a replica spent in all-reduces between ranks.
    pub cross_rank_seconds: f64,
    /// Bytes a replica sent to other ranks per step.
    pub cross_rank_bytes_per_replica_per_step: f64,
}
