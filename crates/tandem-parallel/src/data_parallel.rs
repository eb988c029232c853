//! DDP-style data parallelism: replicas on threads, gradients averaged by all-reduce.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use tandem_models::{positive, Classifier, Invalid};
use tandem_results::{DataParallelFigures, StrategyFigures};
use tandem_train::checkpoint::{load_model_bytes, model_bytes};
use tandem_train::optim::AnyOptimizer;
use tandem_train::{
    tested_gradients, EpochPlan, StateError, StateParts, Strategy, Tally, TrainConfig, TrainError, TrainStats,
};

use crate::collective::{self, AllReduceKind, GroupLock};
use crate::exchange::{touched_rows, CommStats, GradientExchange};
use crate::kind::{check_timeout, BuildError, Ingredients, StrategyKind};
use crate::ranks::{check_same_parameters, cross_rank_timeout, CrossRank, Ranks};
use crate::shard::shard_ranges;
use crate::supervisor::{thread_pools, Failure, Gate, Reporter, Stopped, Supervisor};

/// `[strategy] kind = "data-parallel"`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DataParallelConfig {
    /// Number of replicas: one device and one thread each (on a CPU, `[train] threads` cores each).
    #[schemars(range(min = 1))]
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
    /// Which batch `[train] batch_size` is: the global batch, split into a shard per replica
    /// (`global`), or each replica's own, as PyTorch's DDP runs it (`per-replica`).
    pub batch: BatchSemantics,
    /// How the learning rate follows a `per-replica` global batch `k` times `[train] batch_size`.
    pub lr_scaling: LrScaling,
}

/// Which batch `[train] batch_size` is in data-parallel training.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BatchSemantics {
    /// The global batch, split into one shard per replica: each step trains on the rows a
    /// sequential step trains on, with the same result.
    #[default]
    Global,
    /// Each replica's batch: a step trains on replicas × `batch_size` rows (every replica of
    /// every process), so an epoch has 1/replicas of the steps; the same as sequential training
    /// at that global batch.
    PerReplica,
}

/// How the learning rate follows a global batch `k` times `[train] batch_size` ("Accurate,
/// Large Minibatch SGD: Training ImageNet in 1 Hour", Goyal et al., 2017, with `[train]
/// warmup_steps` for the warm-up it pairs with the linear rule).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LrScaling {
    /// The learning rate as `[train]` sets it.
    #[default]
    None,
    /// Times `k`.
    Linear,
    /// Times √`k`.
    Sqrt,
}

impl LrScaling {
    /// The learning rate's factor for a global batch `k` times the manifest's.
    pub fn factor(self, k: usize) -> f64 {
        match self {
            Self::None => 1.0,
            Self::Linear => k as f64,
            Self::Sqrt => (k as f64).sqrt(),
        }
    }
}

impl Default for DataParallelConfig {
    fn default() -> Self {
        Self {
            replicas: 2,
            all_reduce: AllReduceKind::Tree,
            bucket_mb: 25.0,
            sparse_embedding: true,
            timeout_seconds: 600.0,
            batch: BatchSemantics::Global,
            lr_scaling: LrScaling::None,
        }
    }
}

impl DataParallelConfig {
    fn bucket_bytes(&self) -> usize {
        (self.bucket_mb * 1024.0 * 1024.0) as usize
    }
}

impl StrategyKind for DataParallelConfig {
    fn name(&self) -> &'static str {
        "data-parallel"
    }

    /// E.g. `data-parallel-2x-tree`, `data-parallel-2x-tree-per-replica-lr-sqrt`.
    fn label(&self) -> String {
        let batch = match self.batch {
            BatchSemantics::Global => "",
            BatchSemantics::PerReplica => "-per-replica",
        };
        let lr = match self.lr_scaling {
            LrScaling::None => "",
            LrScaling::Linear => "-lr-linear",
            LrScaling::Sqrt => "-lr-sqrt",
        };
        format!("data-parallel-{}x-{}{batch}{lr}", self.replicas, self.all_reduce.name())
    }

    fn validate(&self) -> Result<(), Invalid> {
        positive("replicas", self.replicas)?;
        if self.lr_scaling != LrScaling::None && self.batch == BatchSemantics::Global {
            return Err(Invalid::at(
                "lr_scaling",
                "`lr_scaling` follows a larger global batch: it needs `batch = \"per-replica\"` (with `global` the batch is `[train] batch_size`)".to_string(),
            ));
        }
        if !(self.bucket_mb > 0.0 && self.bucket_mb.is_finite()) {
            return Err(Invalid::at("bucket_mb", format!("`bucket_mb` must be positive, got {}", self.bucket_mb)));
        }
        check_timeout(self.timeout_seconds)
    }

    fn devices(&self) -> usize {
        self.replicas
    }

    fn model_copies(&self) -> usize {
        self.replicas
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_seconds)
    }

    /// With a batch per replica: a global batch of every replica's (of every process), and the
    /// learning rate scaled for it.
    fn train_for(&self, train: &TrainConfig, ranks: usize) -> TrainConfig {
        match self.batch {
            BatchSemantics::Global => train.clone(),
            BatchSemantics::PerReplica => {
                let k = self.replicas * ranks.max(1);
                TrainConfig {
                    batch_size: train.batch_size * k,
                    learning_rate: train.learning_rate * self.lr_scaling.factor(k),
                    ..train.clone()
                }
            }
        }
    }

    fn build<B: AutodiffBackend>(&self, with: Ingredients<B>) -> Result<Box<dyn Strategy<B>>, BuildError> {
        let replicas = DataParallel::new(with.model, with.train, self, with.devices)?;
        Ok(Box::new(match with.ranks {
            Some(ranks) => replicas.across_ranks(ranks)?,
            None => replicas,
        }))
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
    ) -> Result<Self, BuildError> {
        config.validate()?;
        if devices.len() != config.replicas {
            return Err(BuildError::Mismatch(format!(
                "{} replicas need {} devices, got {}",
                config.replicas,
                config.replicas,
                devices.len()
            )));
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
    pub fn across_ranks(mut self, ranks: &dyn Ranks) -> Result<Self, BuildError> {
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
        reports: &Reporter<ReplicaEpoch>,
        stop: &AtomicBool,
        gate: &Gate,
    ) -> Result<ReplicaEpoch, String> {
        collective::join::<B::InnerBackend>(self.rank, group.peers, group.kind, &self.device)?;
        let result = self.steps(plan, train, group.shards, reports, stop, gate);
        let left = collective::leave::<B::InnerBackend>(self.rank);
        let epoch = result?;
        left.map(|()| epoch)
    }

    fn steps(
        &mut self,
        plan: &EpochPlan,
        train: &TrainConfig,
        shards: usize,
        reports: &Reporter<ReplicaEpoch>,
        stop: &AtomicBool,
        gate: &Gate,
    ) -> Result<ReplicaEpoch, String> {
        let mut epoch = ReplicaEpoch::default();
        let mut tally = Tally::default();
        for (i, indices) in plan.batches.iter().enumerate() {
            if stop.load(Ordering::SeqCst) {
                return Err("stopped because another replica failed".into());
            }
            if !gate.may_begin(self.rank, i) {
                break;
            }
            let started = Instant::now();
            tandem_ops::dropout::begin_step(plan.rng_seed, self.shard, plan.first_step + i);
            let model = self.model.take().ok_or("this replica lost its parameters in an earlier failure")?;
            let shard = &indices[shard_ranges(indices.len(), shards)[self.shard].clone()];
            let local = (!shard.is_empty()).then(|| {
                let (measured, grads) = tested_gradients(&model, plan.data.batch::<B>(shard, &self.device));
                tally.add(measured, shard.len());
                grads
            });
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
            epoch.samples += shard.len();
            epoch.step_seconds += started.elapsed().as_secs_f64();
            epoch.comm.add(&comm);
            reports.step(indices.len());
        }
        (epoch.loss_sum, epoch.correct) = tally.read();
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
        let stop = AtomicBool::new(false);
        let gate = Gate::new(peers, plan.interrupt, self.totals.is_none());
        let train = &self.train;
        let supervisor = Supervisor {
            kind: "replica",
            watchdog: Duration::from_secs_f64(self.config.timeout_seconds),
            stop: &stop,
            progress_from: 0,
            on_batch: plan.on_batch,
            // Replicas blocked in an all-reduce return once the collective is aborted.
            on_stop: &|| collective::abort::<B::InnerBackend>(),
        };
        let work = |(replica, pool): (&mut Replica<B>, &rayon::ThreadPool), reporter: &Reporter<ReplicaEpoch>| {
            pool.install(|| replica.run_epoch(plan, train, group, reporter, &stop, &gate)).map_err(|e| {
                match stop.load(Ordering::SeqCst) {
                    // Stopped because another replica failed or stalled: that explains this failure.
                    true => Failure::elsewhere(e),
                    false => Failure::own(e),
                }
            })
        };
        let workers = self.replicas.iter_mut().zip(&self.pools).enumerate().collect();
        let outcome = std::thread::scope(|scope| supervisor.run(scope, workers, &work));
        let outcome = outcome.map_err(|stopped| self.describe(stopped, plan.epoch));
        let epochs = outcome.map_err(TrainError::Strategy)?;
        let mut stats = self.epoch_stats(&epochs);
        if let Some(totals) = &mut self.totals {
            // Loss and samples of every rank's shards, not just this rank's (f32: sample counts
            // are exact up to 2^24 per epoch).
            let mut sums = [stats.loss_sum as f32, stats.samples as f32, stats.correct as f32];
            totals.link.all_reduce_sum(&mut sums, totals.timeout).map_err(|e| TrainError::Strategy(e.to_string()))?;
            stats.loss_sum = f64::from(sums[0]);
            stats.samples = sums[1].round() as usize;
            (stats.tested, stats.correct) = (stats.samples, sums[2].round() as usize);
        }
        Ok(stats)
    }

    fn model(&self) -> Classifier<B> {
        self.replicas[0].model.clone().unwrap_or_else(|| self.snapshot.clone())
    }

    /// Replica 0's parameters and optimizer state: every replica applies the same averaged
    /// gradients, so they all hold the same.
    fn state(&self) -> Result<StateParts, StateError> {
        let mut state = StateParts::default();
        state.put("model", model_bytes(&self.model())?);
        state.put("optimizer", self.replicas[0].optimizer.state()?.to_bytes());
        Ok(state)
    }

    fn restore(&mut self, state: &StateParts) -> Result<(), StateError> {
        let optimizer = StateParts::from_bytes(state.get("optimizer")?)?;
        for replica in &mut self.replicas {
            let model = replica.model.take().unwrap_or_else(|| self.snapshot.clone());
            replica.model = Some(load_model_bytes(model, state.get("model")?, &replica.device)?);
            replica.optimizer.restore(&optimizer, &replica.device)?;
        }
        self.snapshot = self.model();
        Ok(())
    }
}

impl<B: AutodiffBackend> DataParallel<B> {
    /// Why the epoch stopped, naming the replica.
    fn describe(&self, stopped: Stopped, epoch: usize) -> String {
        match stopped {
            Stopped::Failed { worker, step, message } => {
                format!("replica {worker} failed at step {step} of epoch {}: {message}", epoch + 1)
            }
            Stopped::Stalled { laggards, step, after } => {
                format!("replica(s) {laggards:?} made no progress for {} s (stuck at step {step})", after.as_secs_f64())
            }
            Stopped::WaitedInVain { waiter, peer, .. } => format!("replica {waiter} waited in vain for replica {peer}"),
            Stopped::Unreported { worker } => format!("replica {worker} exited without a report"),
        }
    }

    /// Sums the replicas' epochs into the strategy's figures (communication per replica per step).
    fn epoch_stats(&self, epochs: &[ReplicaEpoch]) -> TrainStats {
        let n = epochs.len().max(1) as f64;
        let samples: usize = epochs.iter().map(|e| e.samples).sum();
        let correct: usize = epochs.iter().map(|e| e.correct).sum();
        let loss_sum = epochs.iter().map(|e| e.loss_sum).sum::<f64>();
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
        TrainStats {
            loss_sum,
            samples,
            steps,
            tested: samples,
            correct,
            figures: StrategyFigures::DataParallel(figures),
        }
    }
}
