//! DDP-style data parallelism: replicas on threads, gradients averaged by all-reduce.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use tandem_models::Classifier;
use tandem_results::{DataParallelFigures, StrategyFigures};
use tandem_train::optim::AnyOptimizer;
use tandem_train::{tested_gradients, EpochPlan, Strategy, TrainConfig, TrainError, TrainStats};

use crate::collective::{self, AllReduceKind, GroupLock};
use crate::exchange::{touched_rows, CommStats, GradientExchange};
use crate::ranks::{check_same_parameters, cross_rank_timeout, CrossRank, Ranks};
use crate::shard::shard_ranges;
use crate::worker::{panic_message, thread_pools};

/// `[strategy] kind = "data-parallel"`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DataParallelConfig {
    /// Number of replicas: one device and one thread each (on a CPU, `[train] threads` cores each).
    pub replicas: usize,
    /// burn-collective's all-reduce algorithm.
    pub all_reduce: AllReduceKind,
    /// Dense gradients travel in flat buckets of at most this many MiB (PyTorch DDP: 25).
    pub bucket_mb: f64,
    /// Exchange only the embedding rows of tokens in the global batch instead of the whole
    /// table. Exact: every other row's gradient is zero on every replica.
    pub sparse_embedding: bool,
    /// A run where no replica reports progress for this long fails, naming the laggards. In a
    /// multi-process job an all-reduce across ranks gives up sooner, after 90 % of it, so that
    /// the error names the wait.
    pub timeout_seconds: f64,
}

impl Default for DataParallelConfig {
    fn default() -> Self {
        Self {
            replicas: 2,
            all_reduce: AllReduceKind::Tree,
            bucket_mb: 25.0,
            sparse_embedding: true,
            timeout_seconds: 600.0,
        }
    }
}

impl DataParallelConfig {
    /// Checks values serde cannot; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.replicas == 0 {
            return Err("`replicas` must be at least 1".into());
        }
        if !(self.bucket_mb > 0.0 && self.bucket_mb.is_finite()) {
            return Err(format!("`bucket_mb` must be positive, got {}", self.bucket_mb));
        }
        if !(self.timeout_seconds > 0.0 && self.timeout_seconds <= 1e6) {
            return Err(format!("`timeout_seconds` must be in (0, 1e6], got {}", self.timeout_seconds));
        }
        Ok(())
    }

    /// Short label for run names, e.g. `data-parallel-2x-tree`.
    pub fn label(&self) -> String {
        format!("data-parallel-{}x-{}", self.replicas, self.all_reduce.name())
    }

    fn bucket_bytes(&self) -> usize {
        (self.bucket_mb * 1024.0 * 1024.0) as usize
    }
}

/// One replica: its own model copy, optimizer state, device and gradient exchange.
struct Replica<B: AutodiffBackend> {
    /// Index among this process's replicas.
    rank: usize,
    /// Which shard of every global batch it computes: `rank` in a single process; in a
    /// multi-process job, `process rank × replicas per process + rank`.
    shard: usize,
    /// `None` only after a failure in the middle of a step.
    model: Option<Classifier<B>>,
    optimizer: AnyOptimizer<Classifier<B>, B>,
    device: B::Device,
    exchange: GradientExchange,
}

/// The all-reduce group of this process's replicas, and the shards of every global batch.
#[derive(Clone, Copy)]
struct Group {
    peers: usize,
    kind: AllReduceKind,
    shards: usize,
}

/// What a replica reports to the coordinator.
enum Report {
    /// Finished one global batch (replica 0 also reports its size for progress).
    Step {
        rank: usize,
        samples: usize,
    },
    Done {
        rank: usize,
        result: Result<ReplicaEpoch, String>,
    },
}

/// One replica's epoch figures.
#[derive(Default)]
struct ReplicaEpoch {
    loss_sum: f64,
    samples: usize,
    /// Samples of the shards the forward pass classified correctly (before the update).
    correct: usize,
    step_seconds: f64,
    comm: CommStats,
}

/// Data-parallel training over `replicas` devices (see the crate docs).
pub struct DataParallel<B: AutodiffBackend> {
    replicas: Vec<Replica<B>>,
    pools: Vec<rayon::ThreadPool>,
    config: DataParallelConfig,
    train: TrainConfig,
    /// The parameters after the last completed epoch, in case a replica fails mid-epoch.
    snapshot: Classifier<B>,
    /// Shards per global batch: every replica of every rank.
    shards: usize,
    /// Ranks of the multi-process job (1 in a single process).
    ranks: usize,
    /// Sums each epoch's loss and sample count over the ranks.
    totals: Option<CrossRank>,
}

impl<B: AutodiffBackend> DataParallel<B> {
    /// Replicates `model` onto `devices` (one per replica). Every replica computes with
    /// `train.threads` threads of its own.
    pub fn new(
        model: Classifier<B>,
        train: &TrainConfig,
        config: &DataParallelConfig,
        devices: Vec<B::Device>,
    ) -> Result<Self, String> {
        config.validate()?;
        if devices.len() != config.replicas {
            return Err(format!(
                "{} replicas need {} devices, got {}",
                config.replicas,
                config.replicas,
                devices.len()
            ));
        }
        let replicas = devices
            .into_iter()
            .enumerate()
            .map(|(rank, device)| Replica {
                rank,
                shard: rank,
                exchange: GradientExchange::new(
                    &model,
                    rank,
                    config.replicas,
                    config.all_reduce,
                    config.bucket_bytes(),
                    config.sparse_embedding,
                ),
                model: Some(model.clone().fork(&device)),
                optimizer: AnyOptimizer::for_model(train, &model),
                device,
            })
            .collect();
        let pools = thread_pools(config.replicas, train.threads, "replica")?;
        Ok(Self {
            replicas,
            pools,
            config: config.clone(),
            train: train.clone(),
            snapshot: model,
            shards: config.replicas,
            ranks: 1,
            totals: None,
        })
    }

    /// Spreads training over the ranks of a multi-process job, each running these replicas:
    /// every global batch is cut into `ranks × replicas` shards, this rank's replicas compute
    /// theirs, and each local sum of gradients is summed over the ranks, so every replica of
    /// every rank applies the same averaged gradient. Checks that all ranks start from the same
    /// parameters.
    pub fn across_ranks(mut self, ranks: &dyn Ranks) -> Result<Self, String> {
        check_same_parameters(ranks, &self.snapshot)?;
        let local = self.replicas.len();
        let timeout = cross_rank_timeout(Duration::from_secs_f64(self.config.timeout_seconds));
        let mut links =
            ranks.links(local + 1)?.into_iter().map(|link| CrossRank { link, ranks: ranks.size(), timeout });
        for (replica, link) in self.replicas.iter_mut().zip(links.by_ref()) {
            replica.shard = ranks.rank() * local + replica.rank;
            replica.exchange.set_cross_rank(link);
        }
        self.totals = links.next();
        (self.shards, self.ranks) = (ranks.size() * local, ranks.size());
        Ok(self)
    }

    /// Largest absolute difference between any parameter of any replica and replica 0's
    /// (0 when the replicas are in sync, as they must be after every step).
    pub fn max_replica_difference(&self) -> f64 {
        let values = |r: &Replica<B>| r.model.as_ref().map(Classifier::parameter_values).unwrap_or_default();
        let first = values(&self.replicas[0]);
        self.replicas[1..]
            .iter()
            .map(|r| values(r).iter().zip(&first).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max))
            .fold(0.0, f64::max)
    }
}

impl<B: AutodiffBackend> Replica<B> {
    /// Joins the all-reduce group, trains on this replica's shard of every global batch, leaves.
    fn run_epoch(
        &mut self,
        plan: &EpochPlan,
        train: &TrainConfig,
        group: Group,
        reports: &Sender<Report>,
        stop: &AtomicBool,
    ) -> Result<ReplicaEpoch, String> {
        collective::join::<B::InnerBackend>(self.rank, group.peers, group.kind, &self.device)?;
        let result = self.steps(plan, train, group.shards, reports, stop);
        let left = collective::leave::<B::InnerBackend>(self.rank);
        let epoch = result?;
        left.map(|()| epoch)
    }

    fn steps(
        &mut self,
        plan: &EpochPlan,
        train: &TrainConfig,
        shards: usize,
        reports: &Sender<Report>,
        stop: &AtomicBool,
    ) -> Result<ReplicaEpoch, String> {
        let mut epoch = ReplicaEpoch::default();
        for (i, indices) in plan.batches.iter().enumerate() {
            if stop.load(Ordering::SeqCst) {
                return Err("stopped because another replica failed".into());
            }
            let started = Instant::now();
            let model = self.model.take().ok_or("this replica lost its parameters in an earlier failure")?;
            let shard = &indices[shard_ranges(indices.len(), shards)[self.shard].clone()];
            let (loss, correct, local) = if shard.is_empty() {
                (0.0, 0, None)
            } else {
                let (loss, correct, grads) = tested_gradients(&model, plan.data.batch::<B>(shard, &self.device));
                (loss, correct, Some(grads))
            };
            let rows = if self.exchange.is_row_sparse() { touched_rows(plan.data, indices) } else { Vec::new() };
            let weight = shard.len() as f64 / indices.len() as f64;
            let (grads, comm) = match self.exchange.average(&model, local, weight, &rows, &self.device) {
                Ok(averaged) => averaged,
                Err(e) => {
                    self.model = Some(model);
                    return Err(e);
                }
            };
            self.model = Some(self.optimizer.update(train, model, grads, plan.first_step + i, plan.total_steps));
            epoch.loss_sum += loss * shard.len() as f64;
            epoch.samples += shard.len();
            epoch.correct += correct;
            epoch.step_seconds += started.elapsed().as_secs_f64();
            epoch.comm.add(&comm);
            let _ = reports.send(Report::Step { rank: self.rank, samples: indices.len() });
        }
        Ok(epoch)
    }
}

impl<B: AutodiffBackend> Strategy<B> for DataParallel<B> {
    fn name(&self) -> &str {
        "data-parallel"
    }

    fn devices(&self) -> Vec<String> {
        self.replicas.iter().map(|r| format!("{:?}", r.device)).collect()
    }

    fn train_epoch(&mut self, plan: &EpochPlan) -> Result<TrainStats, TrainError> {
        let _group = GroupLock::acquire();
        if let Some(model) = &self.replicas[0].model {
            self.snapshot = model.clone();
        }
        let peers = self.replicas.len();
        let group = Group { peers, kind: self.config.all_reduce, shards: self.shards };
        let (tx, rx) = mpsc::channel();
        let stop = AtomicBool::new(false);
        let train = &self.train;
        let outcome = std::thread::scope(|scope| {
            for (replica, pool) in self.replicas.iter_mut().zip(&self.pools) {
                let (tx, stop) = (tx.clone(), &stop);
                scope.spawn(move || {
                    let rank = replica.rank;
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        pool.install(|| replica.run_epoch(plan, train, group, &tx, stop))
                    }))
                    .unwrap_or_else(|panic| Err(format!("panicked: {}", panic_message(&panic))));
                    let _ = tx.send(Report::Done { rank, result });
                });
            }
            drop(tx);
            coordinate::<B>(&self.config, peers, rx, plan, &stop)
        });
        let epochs = outcome.map_err(TrainError::Strategy)?;
        let mut stats = self.epoch_stats(&epochs);
        if let Some(totals) = &mut self.totals {
            // Loss and samples of every rank's shards, not just this rank's (f32: sample counts
            // are exact up to 2^24 per epoch).
            let mut sums = [(stats.loss * stats.samples as f64) as f32, stats.samples as f32, stats.correct as f32];
            totals.link.all_reduce_sum(&mut sums, totals.timeout).map_err(TrainError::Strategy)?;
            stats.loss = f64::from(sums[0]) / f64::from(sums[1]).max(1.0);
            stats.samples = sums[1].round() as usize;
            (stats.tested, stats.correct) = (stats.samples, sums[2].round() as usize);
        }
        Ok(stats)
    }

    fn model(&self) -> Classifier<B> {
        self.replicas[0].model.clone().unwrap_or_else(|| self.snapshot.clone())
    }
}

/// Waits for the replicas' reports, forwarding progress. On the first failure (or when no
/// replica reports for `timeout_seconds`) it stops the others and aborts the collective so
/// that none stays blocked, and returns the error naming the replica.
fn coordinate<B: AutodiffBackend>(
    config: &DataParallelConfig,
    n: usize,
    reports: mpsc::Receiver<Report>,
    plan: &EpochPlan,
    stop: &AtomicBool,
) -> Result<Vec<ReplicaEpoch>, String> {
    let timeout = Duration::from_secs_f64(config.timeout_seconds);
    let mut done: Vec<Option<ReplicaEpoch>> = (0..n).map(|_| None).collect();
    let mut steps = vec![0usize; n];
    let mut finished = 0;
    let mut failure: Option<String> = None;
    let fail = |message: String, failure: &mut Option<String>| {
        if failure.is_none() {
            *failure = Some(message);
            stop.store(true, Ordering::SeqCst);
            collective::abort::<B::InnerBackend>();
        }
    };
    while finished < n {
        match reports.recv_timeout(timeout) {
            Ok(Report::Step { rank, samples }) => {
                steps[rank] += 1;
                if rank == 0 {
                    (plan.on_batch)(samples);
                }
            }
            Ok(Report::Done { rank, result }) => {
                finished += 1;
                match result {
                    Ok(epoch) => done[rank] = Some(epoch),
                    Err(e) => fail(
                        format!("replica {rank} failed at step {} of epoch {}: {e}", steps[rank] + 1, plan.epoch + 1),
                        &mut failure,
                    ),
                }
            }
            // Replicas blocked in an all-reduce return once the collective is aborted; if they
            // are still silent one timeout after that, report rather than wait forever.
            Err(RecvTimeoutError::Timeout) if failure.is_some() => break,
            Err(RecvTimeoutError::Timeout) => {
                let behind = steps.iter().copied().min().unwrap_or(0);
                let laggards: Vec<usize> = (0..n).filter(|&r| done[r].is_none() && steps[r] == behind).collect();
                fail(
                    format!(
                        "replica(s) {laggards:?} made no progress for {} s (stuck at step {})",
                        timeout.as_secs_f64(),
                        behind + 1
                    ),
                    &mut failure,
                );
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    match failure {
        Some(message) => Err(message),
        None => {
            done.into_iter().enumerate().map(|(r, d)| d.ok_or(format!("replica {r} exited without a report"))).collect()
        }
    }
}

impl<B: AutodiffBackend> DataParallel<B> {
    /// Sums the replicas' epochs into the strategy's figures (communication per replica per step).
    fn epoch_stats(&self, epochs: &[ReplicaEpoch]) -> TrainStats {
        let n = epochs.len().max(1) as f64;
        let samples: usize = epochs.iter().map(|e| e.samples).sum();
        let correct: usize = epochs.iter().map(|e| e.correct).sum();
        let loss = epochs.iter().map(|e| e.loss_sum).sum::<f64>() / samples.max(1) as f64;
        let steps = epochs.first().map_or(0, |e| e.comm.steps) as usize;
        let per_step =
            |f: fn(&CommStats) -> u64| epochs.iter().map(|e| f(&e.comm) as f64).sum::<f64>() / n / steps.max(1) as f64;
        let all_reduce_seconds = epochs.iter().map(|e| e.comm.seconds).sum::<f64>() / n;
        let cross_rank_seconds = epochs.iter().map(|e| e.comm.cross_rank_seconds).sum::<f64>() / n;
        let step_seconds = epochs.iter().map(|e| e.step_seconds).sum::<f64>() / n;
        let figures = DataParallelFigures {
            replicas: self.replicas.len(),
            all_reduce: self.config.all_reduce.name().into(),
            buckets_per_step: self.replicas[0].exchange.num_buckets(),
            sparse_embedding: self.replicas[0].exchange.is_row_sparse(),
            all_reduce_calls_per_step: per_step(|c| c.all_reduce_calls),
            bytes_sent_per_replica_per_step: per_step(|c| c.bytes_sent),
            bytes_received_per_replica_per_step: per_step(|c| c.bytes_received),
            dense_bytes_per_replica_per_step: per_step(|c| c.dense_bytes),
            all_reduce_seconds,
            step_seconds,
            all_reduce_share: all_reduce_seconds / step_seconds.max(1e-12),
            // Bytes every replica of every rank sent, within and across ranks.
            bytes_per_step: per_step(|c| c.bytes_sent + c.cross_rank_bytes) * n * self.ranks as f64,
            communication_share: all_reduce_seconds / step_seconds.max(1e-12),
            replica_max_abs_difference: self.max_replica_difference(),
            ranks: self.ranks,
            cross_rank_seconds,
            cross_rank_bytes_per_replica_per_step: per_step(|c| c.cross_rank_bytes),
        };
        TrainStats { loss, samples, steps, tested: samples, correct, figures: StrategyFigures::DataParallel(figures) }
    }
}
