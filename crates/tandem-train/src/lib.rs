//! Training: the strategy seam, the sequential strategy, evaluation and metrics.
//!
//! The epoch loop ([`train`]) is the same for every strategy: it draws a fresh
//! seeded shuffle each epoch, hands the global batches to a [`Strategy`], then
//! evaluates the strategy's current model on the holdout set (and the validation
//! set, where there is one: [`EvalSets`]). In stream mode
//! ([`StreamConfig`]) the order is drawn once and replayed on every pass, and the
//! holdout set is evaluated every few batches. A strategy decides only *how* a
//! global batch turns into a parameter update (one device, replicas, stages…).

pub mod bytes;
pub mod checkpoint;
mod memory;
pub mod optim;
mod sequential;
mod step;

use std::ops::Range;
use std::time::Instant;

use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::{Deserialize, Serialize};
use tandem_data::Encoded;
use tandem_models::{positive, Classifier, Invalid};

pub use checkpoint::{number_parameters, StateError, StateParts};
pub use memory::keep_freed_memory;
pub use optim::{AnyOptimizer, EmbeddingUpdate, LrSchedule, OptimizerKind};
pub use sequential::Sequential;
pub use step::{
    correct_count, correct_predictions, evaluate, gradients, host_reads, loss, tested_gradients, Measured, Tally,
};
pub use tandem_results::metrics::{self, ClassMetrics, ClassificationMetrics, ConfusionMatrix};
pub use tandem_results::{EpochRecord, Evaluation, StrategyFigures, StreamPoint};

/// The `[train]` section of a manifest.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Epochs; in stream mode, passes over the stream.
    #[schemars(range(min = 1))]
    pub epochs: usize,
    /// Global batch size (split across replicas by data-parallel strategies).
    #[schemars(range(min = 1))]
    pub batch_size: usize,
    /// Batch size of holdout evaluation (no gradients: larger is faster, same results).
    #[schemars(range(min = 1))]
    pub eval_batch_size: usize,
    pub optimizer: OptimizerKind,
    /// Peak learning rate (after the warm-up); must be positive.
    pub learning_rate: f64,
    /// Weight decay: decoupled for `adamw`, added to the gradient as L2 for `adam`.
    #[schemars(range(min = 0.0))]
    pub weight_decay: f64,
    /// Adam's decay rate of the first moment (the gradient's running mean).
    pub beta1: f64,
    /// Adam's decay rate of the second moment (the squared gradient's running mean).
    pub beta2: f64,
    /// Adam's term added to the second moment's square root, for numerical stability.
    pub epsilon: f64,
    pub lr_schedule: LrSchedule,
    /// Optimizer steps of linear warm-up from 0 to `learning_rate` (0: none).
    pub warmup_steps: usize,
    /// Final learning rate of a decaying schedule, as a fraction of `learning_rate`.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_lr_fraction: f64,
    /// Clip the global L2 norm of the gradients to this value.
    pub grad_clip_norm: Option<f64>,
    /// Compute threads per device (on a CPU backend a device is this many cores).
    #[schemars(range(min = 1))]
    pub threads: usize,
    /// How Adam / AdamW update the token-embedding table: every row (`dense`, exact Adam), or only
    /// the rows that received gradient in the step (`lazy`).
    pub embedding_update: EmbeddingUpdate,
    /// Stream mode: the training rows arrive in one fixed order, pass after pass, and the
    /// holdout set is evaluated at fixed points of the stream (unset: epochs).
    pub stream: Option<StreamConfig>,
}

/// Stream mode (`[train] stream = { eval_every = N }`): the training rows are one stream, in
/// an order drawn once from the run's seed and replayed on every pass (`epochs` passes), so
/// every strategy of a seed sees the same batches in the same order. The holdout set is
/// evaluated every `eval_every` global batches of the stream and at the end of each pass.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    /// Evaluate the holdout set every this many global batches of the stream.
    #[schemars(range(min = 1))]
    pub eval_every: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 5,
            batch_size: 64,
            eval_batch_size: 256,
            optimizer: OptimizerKind::Adamw,
            learning_rate: 1e-3,
            weight_decay: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            lr_schedule: LrSchedule::Cosine,
            warmup_steps: 0,
            min_lr_fraction: 0.05,
            grad_clip_norm: Some(5.0),
            threads: 1,
            embedding_update: EmbeddingUpdate::Dense,
            stream: None,
        }
    }
}

impl TrainConfig {
    /// Most epochs (stream passes) a run may ask for. Every epoch adds a record that the run keeps
    /// in memory and rewrites to `epochs.jsonl`, so a run's bookkeeping grows with its epochs
    /// (the rewriting with their square); and 100,000 epochs over even a small dataset (1,000
    /// rows) are 10⁸ samples, a day or more of training on a CPU. A larger value is taken for a
    /// typo (a `--set train.epochs` with digits too many) and refused before anything allocates.
    pub const MAX_EPOCHS: usize = 100_000;

    /// Checks values serde cannot; the error names the field.
    pub fn validate(&self) -> Result<(), Invalid> {
        positive("epochs", self.epochs)?;
        if self.epochs > Self::MAX_EPOCHS {
            let message = format!(
                "`epochs` must be at most {} (each epoch keeps a record in memory and in epochs.jsonl), got {}",
                Self::MAX_EPOCHS,
                self.epochs
            );
            return Err(Invalid::at("epochs", message));
        }
        positive("batch_size", self.batch_size)?;
        positive("eval_batch_size", self.eval_batch_size)?;
        positive("threads", self.threads)?;
        let refuse =
            |field: &str, rule: &str, value: f64| Err(Invalid::at(field, format!("`{field}` {rule}, got {value}")));
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return refuse("learning_rate", "must be positive", self.learning_rate);
        }
        if !(0.0..=1.0).contains(&self.min_lr_fraction) {
            return refuse("min_lr_fraction", "must be in [0, 1]", self.min_lr_fraction);
        }
        if self.weight_decay < 0.0 {
            return refuse("weight_decay", "must not be negative", self.weight_decay);
        }
        if let Some(c) = self.grad_clip_norm.filter(|c| c.is_nan() || *c <= 0.0) {
            return refuse("grad_clip_norm", "must be positive", c);
        }
        if let Some(stream) = &self.stream {
            positive("stream.eval_every", stream.eval_every)?;
        }
        Ok(())
    }

    /// Optimizer steps in one epoch over `samples` training samples.
    pub fn steps_per_epoch(&self, samples: usize) -> usize {
        samples.div_ceil(self.batch_size)
    }
}

/// One epoch's work for a strategy: the global batches, in order.
pub struct EpochPlan<'a> {
    /// 0-based epoch number.
    pub epoch: usize,
    /// Sample indices of each global batch (the last one may be short).
    pub batches: Vec<Vec<usize>>,
    pub data: &'a Encoded,
    /// Optimizer steps taken before this epoch (for the learning-rate schedule).
    pub first_step: usize,
    /// Optimizer steps of the whole run.
    pub total_steps: usize,
    /// The run's seed of dropout masks: each worker (replica, device) draws those of step `s`
    /// from the stream [`tandem_ops::dropout::begin_step`]`(rng_seed, worker, s)`.
    pub rng_seed: u64,
    /// Called after each global batch with the number of samples it held.
    pub on_batch: &'a (dyn Fn(usize) + Sync),
    /// Whether the caller asks to stop early (a signal): a strategy that can ends the call
    /// after the step in progress, at the same step on every worker, and reports the steps
    /// done; one that cannot (a multi-process job) finishes the call.
    pub interrupt: &'a (dyn Fn() -> bool + Sync),
}

/// What a strategy reports about one training epoch.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TrainStats {
    /// Training loss summed over the tested samples (the mean is [`TrainStats::loss`]).
    pub loss_sum: f64,
    pub samples: usize,
    pub steps: usize,
    /// Test-then-train: training samples whose forward pass ran before the update that trains
    /// on them, and how many of them it classified correctly (a predicted step of predictive
    /// sync runs no forward pass, so its samples are not tested).
    pub tested: usize,
    pub correct: usize,
    /// The strategy's own figures (communication, stages, syncs…), recorded in the results.
    pub figures: StrategyFigures,
}

impl TrainStats {
    /// Mean training loss per tested sample.
    pub fn loss(&self) -> f64 {
        self.loss_sum / self.tested.max(1) as f64
    }

    /// These steps followed by `later`'s, as one call over both would have reported them.
    pub fn then(self, later: TrainStats) -> TrainStats {
        TrainStats {
            loss_sum: self.loss_sum + later.loss_sum,
            samples: self.samples + later.samples,
            steps: self.steps + later.steps,
            tested: self.tested + later.tested,
            correct: self.correct + later.correct,
            figures: self.figures.then(self.steps, later.figures, later.steps),
        }
    }
}

/// An evaluation point (epoch, or stretch of a stream) stopped part-way: what its first
/// `stats.steps` steps reported, to carry on from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PartialPoint {
    pub stats: TrainStats,
    pub train_seconds: f64,
}

/// Errors a training run can stop with.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("training diverged at epoch {epoch}: the loss is {loss}")]
    Diverged { epoch: usize, loss: f64 },
    #[error("{0}")]
    Strategy(String),
    /// The caller's [`Observer::point`] stopped the run.
    #[error(transparent)]
    Stopped(#[from] Halt),
    /// [`Observer::interrupted`] paused the run part-way through a point, after `steps` of its
    /// `of` steps (reported to the observer as [`Point::Paused`] first).
    #[error("stopped as asked after step {steps} of {of} of this point")]
    Paused { steps: usize, of: usize },
}

/// Why an observer stops the run at a point; its message is the observer's own.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Halt {
    /// A signal: the run continues later from the checkpoint just written.
    #[error("interrupted by signal {0}")]
    Signal(i32),
    /// What the observer does at a point failed (a results or checkpoint write, a word with the
    /// other ranks of a job).
    #[error("{0}")]
    Failed(String),
}

/// How a global batch becomes a parameter update: the seam the parallel strategies plug into.
pub trait Strategy<B: AutodiffBackend> {
    /// Name recorded in results (`sequential`, `data-parallel`, …).
    fn name(&self) -> &str;
    /// The devices the strategy computes on, as recorded in results.
    fn devices(&self) -> Vec<String>;
    /// Trains over one epoch's global batches.
    fn train_epoch(&mut self, plan: &EpochPlan) -> Result<TrainStats, TrainError>;
    /// The current parameters as one whole model on `device` (for evaluation and saving).
    fn model(&self) -> Classifier<B>;
    /// Everything needed to continue exactly from here (models, optimizer states, the
    /// strategy's own state), between two epochs or evaluation points.
    fn state(&self) -> Result<StateParts, StateError>;
    /// Continues from [`Strategy::state`]'s parts, taken from a strategy built the same way.
    fn restore(&mut self, state: &StateParts) -> Result<(), StateError>;
}

/// What the epoch loop hands its caller, with the strategy as it stands.
pub enum Point<'r> {
    /// An epoch or evaluation point is done.
    Recorded(&'r EpochRecord),
    /// Asked to stop, the strategy ended part-way through the point after `points_done`
    /// records: the run stops here, to be continued from this state.
    Paused { points_done: usize, partial: &'r PartialPoint },
}

/// What the epoch loop tells its caller as it goes, and asks it.
pub trait Observer<B: AutodiffBackend>: Sync {
    /// After each global batch, with the samples it held (progress); called from the
    /// strategy's workers.
    fn batch(&self, _samples: usize) {}
    /// Whether to stop after the step in progress (see [`EpochPlan::interrupt`]).
    fn interrupted(&self) -> bool {
        false
    }
    /// Each record as soon as it exists, and a pause, with the strategy as it stands (to write
    /// both to disk); an error stops the run.
    fn point(&mut self, point: Point, strategy: &dyn Strategy<B>) -> Result<(), Halt>;
}

/// A closure is an observer of points alone: no progress wanted, never interrupted.
impl<B: AutodiffBackend, F> Observer<B> for F
where
    F: FnMut(Point, &dyn Strategy<B>) -> Result<(), Halt> + Sync,
{
    fn point(&mut self, point: Point, strategy: &dyn Strategy<B>) -> Result<(), Halt> {
        self(point, strategy)
    }
}

/// Where the epoch loop starts, and the seed of the backend's random numbers (dropout).
#[derive(Clone, Debug, Default)]
pub struct Start {
    /// Records (epochs or stream evaluation points) already done: the loop continues after them.
    pub points_done: usize,
    /// The steps of the next point already done, when the run was stopped part-way through it.
    pub partial: Option<PartialPoint>,
    /// The backend is seeded from this and the step at the start of every epoch or evaluation
    /// point, so a resumed run draws the same random numbers as one never stopped.
    pub rng_seed: u64,
}

/// The seed of the backend's random numbers from optimizer step `step` on.
fn point_seed(rng_seed: u64, step: usize) -> u64 {
    (rng_seed ^ (step as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(0x632b_e59b_d9b4_e019)
}

/// The sets a run is evaluated on at each point.
#[derive(Clone, Copy)]
pub struct EvalSets<'a> {
    pub holdout: &'a Encoded,
    /// Carved from the training rows; what choices made by looking at results read.
    pub validation: Option<&'a Encoded>,
}

impl<'a> EvalSets<'a> {
    /// The holdout set alone.
    pub fn holdout(holdout: &'a Encoded) -> Self {
        Self { holdout, validation: None }
    }
}

/// Runs `config.epochs` epochs of `strategy` over `train`, evaluating on `eval`'s sets after
/// each epoch on `eval_device`, from `start`. `observer` receives each record as soon as it exists,
/// with the strategy (to write both to disk), and may stop the run by returning an error; an
/// interrupt pauses the run part-way through a point (reported, then [`TrainError::Paused`]). Returns the records made by this call.
#[allow(clippy::too_many_arguments)] // the epoch loop's inputs, each named at the call
pub fn train<B: AutodiffBackend>(
    strategy: &mut dyn Strategy<B>,
    config: &TrainConfig,
    seed: u64,
    train: &Encoded,
    eval: EvalSets,
    eval_device: &B::Device,
    observer: &mut dyn Observer<B>,
    mut start: Start,
) -> Result<Vec<EpochRecord>, TrainError> {
    let steps_per_epoch = config.steps_per_epoch(train.len());
    // Saturating, and records grown as they come, so that an unchecked `epochs` (validation is
    // the caller's) cannot overflow or reserve memory for epochs that never run.
    let total_steps = steps_per_epoch.saturating_mul(config.epochs);
    let mut records = Vec::new();
    let mut point = 0;
    // Wall clock since the previous record, whose checkpoint the observer writes after it.
    let mut since_record = Instant::now();
    for epoch in 0..config.epochs {
        // A stream replays the order of pass 0.
        let order = tandem_data::epoch_order(train.len(), seed, if config.stream.is_some() { 0 } else { epoch });
        let batches: Vec<Vec<usize>> = tandem_data::batches(&order, config.batch_size).map(<[usize]>::to_vec).collect();
        let pass_start = epoch.saturating_mul(steps_per_epoch);
        let every = config.stream.as_ref().map_or(batches.len(), |s| s.eval_every);
        for range in evaluation_ranges(pass_start, batches.len(), every) {
            point += 1;
            if point <= start.points_done {
                continue;
            }
            let point_start = pass_start + range.start;
            let before = if point == start.points_done + 1 { start.partial.take() } else { None };
            let done = before.as_ref().map_or(0, |b| b.stats.steps).min(range.len());
            let first_step = point_start + done;
            B::seed(eval_device, point_seed(start.rng_seed, first_step));
            let watching: &dyn Observer<B> = &*observer;
            let (on_batch, interrupt) = (|samples| watching.batch(samples), || watching.interrupted());
            let plan = EpochPlan {
                epoch,
                batches: batches[range.start + done..range.end].to_vec(),
                data: train,
                first_step,
                total_steps,
                rng_seed: start.rng_seed,
                on_batch: &on_batch,
                interrupt: &interrupt,
            };
            let started = Instant::now();
            let stats = strategy.train_epoch(&plan)?;
            let mut train_seconds = started.elapsed().as_secs_f64();
            // A point resumed part-way: the stopped process's training of it counts in the wall
            // clock too.
            let resumed_seconds = before.as_ref().map_or(0.0, |b| b.train_seconds);
            let stats = match before {
                Some(before) => {
                    train_seconds += before.train_seconds;
                    before.stats.then(stats)
                }
                None => stats,
            };
            if !stats.loss().is_finite() {
                return Err(TrainError::Diverged { epoch: epoch + 1, loss: stats.loss() });
            }
            if stats.steps < range.len() {
                let partial = PartialPoint { stats, train_seconds };
                observer.point(Point::Paused { points_done: point - 1, partial: &partial }, &*strategy)?;
                return Err(TrainError::Paused { steps: partial.stats.steps, of: range.len() });
            }

            let started = Instant::now();
            let model = burn::module::AutodiffModule::valid(&strategy.model());
            let on = |set: &Encoded| evaluate::<B::InnerBackend>(&model, set, config.eval_batch_size, eval_device);
            let (holdout, validation) = (on(eval.holdout), eval.validation.map(on));
            let record = EpochRecord {
                epoch: epoch + 1,
                stream: config.stream.as_ref().map(|_| StreamPoint {
                    batches: point_start + stats.steps,
                    pass_complete: range.end == batches.len(),
                }),
                train_loss: stats.loss(),
                holdout_loss: holdout.loss,
                holdout: holdout.metrics,
                validation,
                learning_rate: optim::learning_rate(config, point_start + stats.steps.saturating_sub(1), total_steps),
                train_seconds,
                eval_seconds: started.elapsed().as_secs_f64(),
                wall_seconds: Some(since_record.elapsed().as_secs_f64() + resumed_seconds),
                train_samples_per_second: stats.samples as f64 / train_seconds.max(1e-9),
                steps: stats.steps,
                prequential_accuracy: (stats.tested > 0).then(|| stats.correct as f64 / stats.tested as f64),
                prequential_samples: stats.tested,
                figures: stats.figures,
            };
            since_record = Instant::now();
            observer.point(Point::Recorded(&record), &*strategy)?;
            records.push(record);
        }
    }
    Ok(records)
}

/// The batches of a pass (`len` of them, starting at step `start` of the run) between
/// evaluation points: every `every` steps of the run, counted from its first step, and the end
/// of the pass.
fn evaluation_ranges(start: usize, len: usize, every: usize) -> Vec<Range<usize>> {
    let every = every.max(1);
    let mut ranges = Vec::new();
    let mut at = 0;
    while at < len {
        let end = (((start + at) / every + 1) * every - start).min(len);
        ranges.push(at..end);
        at = end;
    }
    if ranges.is_empty() {
        ranges.push(0..0);
    }
    ranges
}

/// Seeds the backend's random number generator on `device` (parameter init, dropout).
pub fn seed_backend<B: Backend>(device: &B::Device, seed: u64) {
    B::seed(device, seed);
}
