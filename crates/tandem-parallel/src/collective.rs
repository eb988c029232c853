//! A thin layer over burn-collective's *local* (threads of one process) all-reduce.
//!
//! burn-collective runs one collective server per backend type per process, and its calls
//! block without a timeout. So: one data-parallel group at a time holds [`GroupLock`], and
//! when a replica fails the coordinator calls [`abort`], which drops every pending operation
//! so the replicas blocked in an all-reduce return an error instead of waiting forever.

use std::sync::{Mutex, MutexGuard};

use burn::collective::{self, AllReduceStrategy, CollectiveConfig, PeerId, ReduceOperation};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use serde::{Deserialize, Serialize};

/// burn-collective's local all-reduce algorithms.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AllReduceKind {
    /// Reduce-scatter then all-gather around a ring of peers.
    Ring,
    /// Reduce up a binary tree, broadcast the sum back down.
    #[default]
    Tree,
    /// Every peer sends to peer 0, which sums and sends the result back.
    Centralized,
}

impl AllReduceKind {
    /// Name as written in manifests and results.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Tree => "tree",
            Self::Centralized => "centralized",
        }
    }

    fn strategy(self) -> AllReduceStrategy {
        match self {
            Self::Ring => AllReduceStrategy::Ring,
            Self::Tree => AllReduceStrategy::Tree(2),
            Self::Centralized => AllReduceStrategy::Centralized,
        }
    }

    /// Bytes peer `rank` of `peers` sends (= receives) in one all-reduce of `bytes` bytes,
    /// as the algorithm moves data (burn-collective does not count them itself).
    pub fn bytes_per_peer(self, bytes: u64, rank: usize, peers: usize) -> u64 {
        if peers < 2 {
            return 0;
        }
        match self {
            // Each peer passes on (peers - 1) chunks of bytes/peers in each of the two phases.
            Self::Ring => 2 * (peers as u64 - 1) * bytes.div_ceil(peers as u64),
            // Up: children send to their parent; down: the parent sends to each child.
            Self::Tree => {
                let children = [2 * rank + 1, 2 * rank + 2].iter().filter(|&&c| c < peers).count() as u64;
                (children + u64::from(rank != 0)) * bytes
            }
            Self::Centralized => {
                if rank == 0 {
                    (peers as u64 - 1) * bytes
                } else {
                    bytes
                }
            }
        }
    }
}

static GROUP: Mutex<()> = Mutex::new(());

/// Held by the coordinator while a data-parallel group runs (one group per process at a time).
pub(crate) struct GroupLock(#[allow(dead_code)] MutexGuard<'static, ()>);

impl GroupLock {
    pub(crate) fn acquire() -> Self {
        // A poisoned lock only means an earlier group panicked; the server was reset then.
        Self(GROUP.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }
}

/// Joins the group of `peers` replicas as peer `rank`; blocks until every peer has joined.
pub(crate) fn join<B: Backend>(
    rank: usize,
    peers: usize,
    kind: AllReduceKind,
    device: &B::Device,
) -> Result<(), String> {
    let config = CollectiveConfig::default().with_num_devices(peers).with_local_all_reduce_strategy(kind.strategy());
    collective::register::<B>(peer(rank), device.clone(), config)
        .map_err(|e| format!("cannot join the all-reduce group: {e:?}"))
}

/// Leaves the group.
pub(crate) fn leave<B: Backend>(rank: usize) -> Result<(), String> {
    collective::finish_collective::<B>(peer(rank)).map_err(|e| format!("cannot leave the all-reduce group: {e:?}"))
}

/// Sums `tensor` over all peers; every peer gets the same result.
pub(crate) fn all_reduce_sum<B: Backend, const D: usize>(
    rank: usize,
    tensor: Tensor<B, D>,
) -> Result<Tensor<B, D>, String> {
    let primitive = tensor.into_primitive().tensor();
    let summed = collective::all_reduce::<B>(peer(rank), primitive, ReduceOperation::Sum)
        .map_err(|e| format!("all-reduce aborted: {e:?}"))?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(summed)))
}

/// Drops every pending collective operation of backend `B`: blocked peers return an error.
pub(crate) fn abort<B: Backend>() {
    collective::reset_collective::<B>();
}

fn peer(rank: usize) -> PeerId {
    PeerId(rank as u32)
}
