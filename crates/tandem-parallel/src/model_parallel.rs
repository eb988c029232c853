//! Model parallelism: the model cut into stages, one device and one thread per stage,
//! activations sent forward and gradients sent back over counted (optionally slowed) links,
//! in the order a [`Schedule`] prescribes. In a multi-process job each rank runs its share of
//! the stages, and a boundary between ranks is relayed over MPI ([`crate::relay`]).

use std::collections::VecDeque;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Condvar, Mutex};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use tandem_data::Encoded;
use tandem_models::{Activation, Classifier};
use tandem_results::{LinkFigures, PipelineFigures, PipelineRanks, StrategyFigures, SyncFigures, TrafficPerStep};
use tandem_train::optim::clip_factor;
use tandem_train::{EpochPlan, Strategy, TrainConfig, TrainError, TrainStats};

use crate::link::{link, Interconnect, LinkReceiver, LinkSender, RecvError, Traffic};
use crate::ranks::{check_same_parameters, cross_rank_timeout, RankLink, Ranks};
use crate::relay::{self, Message, Relayed};
use crate::schedule::{theoretical_bubble, Action, Schedule};
use crate::shard::shard_ranges;
use crate::stage::{wire_bytes, Stage, Wire};
use crate::worker::{panic_message, thread_pools};

/// Decides, stage by stage, whether a global batch is a real model-parallel step or is skipped
/// with a local parameter update (predictive synchronisation, crate `tandem-sync`). Without
/// policies every step is real: vanilla model parallelism. Calls come from the stage's thread.
pub trait StepPolicy<B: AutodiffBackend>: Send {
    /// This stage's vote for the coming step; the step is real when any stage votes for it.
    fn wants_sync(&mut self, stage: &Stage<B>) -> bool;
    /// A real step's gradients are ready; the optimizer update comes next.
    fn before_update(&mut self, stage: &Stage<B>);
    /// A real step is done; `loss` is the global batch's mean loss (from the last stage).
    fn after_update(&mut self, stage: &Stage<B>, loss: f64, last_stage: bool);
    /// The step is skipped: advance the stage's parameters locally, exchanging nothing.
    fn skip(&mut self, stage: &mut Stage<B>);
    /// Bytes of control messages this stage sent in the current epoch.
    fn control_bytes(&self) -> u64;
    /// The epoch's protocol figures (names, step counts, horizons, forecast error); starts a new
    /// epoch. The pipeline fills in the figures over all stages (control bytes, prediction time,
    /// replayed samples).
    fn take_epoch_figures(&mut self) -> SyncFigures;
}

/// How cut points are chosen when the manifest gives none.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Balance {
    /// Stages with parameter counts as even as possible.
    Params,
    /// Stages with training-step times as even as possible, from a short profiling pass.
    Time,
}

/// `[strategy] kind = "model-parallel"`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ModelParallelConfig {
    /// Number of stages: one device and one thread each (on a CPU, `[train] threads` cores each).
    pub stages: usize,
    /// Explicit cut points (block indices, strictly increasing); overrides `balance`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuts: Option<Vec<usize>>,
    pub balance: Balance,
    pub schedule: Schedule,
    /// Micro-batches per global batch (`gpipe`, `1f1b`; the naive schedule uses 1).
    pub micro_batches: usize,
    /// Simulated interconnect on every stage boundary.
    pub interconnect: Interconnect,
    /// A stage that waits this long for a message, or a run where no stage reports progress for
    /// this long, fails.
    pub timeout_seconds: f64,
}

impl Default for ModelParallelConfig {
    fn default() -> Self {
        Self {
            stages: 2,
            cuts: None,
            balance: Balance::Time,
            schedule: Schedule::GPipe,
            micro_batches: 8,
            interconnect: Interconnect::default(),
            timeout_seconds: 600.0,
        }
    }
}

impl ModelParallelConfig {
    /// Checks values serde cannot; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.stages == 0 {
            return Err("`stages` must be at least 1".into());
        }
        if self.micro_batches == 0 {
            return Err("`micro_batches` must be at least 1".into());
        }
        if let Some(cuts) = &self.cuts {
            if cuts.len() + 1 != self.stages {
                return Err(format!("`cuts` {cuts:?} make {} stages but `stages` is {}", cuts.len() + 1, self.stages));
            }
        }
        if !(self.timeout_seconds > 0.0 && self.timeout_seconds <= 1e6) {
            return Err(format!("`timeout_seconds` must be in (0, 1e6], got {}", self.timeout_seconds));
        }
        self.interconnect.validate()
    }

    /// Short label for run names, e.g. `model-parallel-2s-gpipe-8m`, `model-parallel-2s-naive-1gbe`
    /// or `model-parallel-3s-cuts1-3-1f1b-4m`.
    pub fn label(&self) -> String {
        let mut label = format!("model-parallel-{}s", self.stages);
        match (&self.cuts, self.balance) {
            (Some(cuts), _) => {
                label += &format!("-cuts{}", cuts.iter().map(usize::to_string).collect::<Vec<_>>().join("-"))
            }
            (None, Balance::Params) => label += "-params",
            (None, Balance::Time) => {}
        }
        label += &format!("-{}", self.schedule.name());
        if self.schedule != Schedule::Naive {
            label += &format!("-{}m", self.micro_batches);
        }
        if self.interconnect.figures().is_some() {
            label += &format!("-{}", self.interconnect.name());
        }
        label
    }
}

/// Cut points that split blocks of the given costs into `stages` contiguous stages whose
/// largest total cost is as small as possible (the pipeline runs at the pace of its slowest stage).
pub fn balanced_cuts(costs: &[f64], stages: usize) -> Vec<usize> {
    fn search(
        costs: &[f64],
        start: usize,
        stages: usize,
        cuts: &mut Vec<usize>,
        best: &mut (f64, Vec<usize>),
        worst: f64,
    ) {
        if stages == 1 {
            let worst = worst.max(costs[start..].iter().sum());
            if worst < best.0 {
                *best = (worst, cuts.clone());
            }
            return;
        }
        for cut in start + 1..=costs.len() - (stages - 1) {
            cuts.push(cut);
            search(costs, cut, stages - 1, cuts, best, worst.max(costs[start..cut].iter().sum()));
            cuts.pop();
        }
    }
    let mut best = (f64::INFINITY, Vec::new());
    if (1..=costs.len()).contains(&stages) {
        search(costs, 0, stages, &mut Vec::new(), &mut best, 0.0);
    }
    best.1
}

/// Seconds each block of `model` takes for a training step (forward, backward and optimizer
/// update) on `micro_size` samples of `data`: the mean of 3 steps after a warm-up, each block
/// run as its own stage on `device`.
pub fn profile_blocks<B: AutodiffBackend>(
    model: &Classifier<B>,
    train: &TrainConfig,
    data: &Encoded,
    micro_size: usize,
    device: &B::Device,
) -> Result<Vec<f64>, String> {
    let n = model.num_blocks();
    let blocks = model.clone().split(&(1..n).collect::<Vec<_>>()).map_err(|e| e.to_string())?;
    let mut stages: Vec<Stage<B>> = blocks.into_iter().map(|b| Stage::new(b, train, device.clone())).collect();
    let indices: Vec<usize> = (0..micro_size.min(data.len())).collect();
    if indices.is_empty() {
        return Err("cannot balance stages by time without training data".into());
    }
    let mut seconds = vec![0.0; n];
    for rep in 0..4 {
        let batch = data.batch::<B>(&indices, device);
        let mut elapsed = vec![Duration::ZERO; n];
        let mut x = Activation::Tokens(batch.tokens.inner());
        // On a GPU, work is queued: wait for it before every clock reading.
        let sync = || B::sync(device).map_err(|e| format!("profiling the blocks: {e:?}"));
        for (i, stage) in stages.iter_mut().enumerate() {
            sync()?;
            let started = Instant::now();
            if i + 1 == n {
                stage.forward_loss(0, x.clone(), &batch.mask_pad, batch.labels.clone(), 1.0);
            } else {
                x = stage.forward(0, x, &batch.mask_pad);
            }
            sync()?;
            elapsed[i] += started.elapsed();
        }
        let mut grad = None;
        for (i, stage) in stages.iter_mut().enumerate().rev() {
            sync()?;
            let started = Instant::now();
            grad = stage.backward(0, grad)?;
            stage.step(train, 1.0, 0, 1);
            sync()?;
            elapsed[i] += started.elapsed();
        }
        // The first repetition warms up (allocations, caches) and is not counted.
        if rep > 0 {
            seconds.iter_mut().zip(elapsed).for_each(|(s, e)| *s += e.as_secs_f64() / 3.0);
        }
    }
    Ok(seconds)
}

/// One stage's ends of its links (absent at the ends of the pipeline).
struct Ends<B: AutodiffBackend> {
    from_previous: Option<LinkReceiver<Message<B>>>,
    to_next: Option<LinkSender<Message<B>>>,
    from_next: Option<LinkReceiver<Message<B>>>,
    to_previous: Option<LinkSender<Message<B>>>,
}

/// What a stage reports to the coordinator.
enum Report {
    Step { stage: usize, samples: usize },
    Done { stage: usize, result: Result<StageEpoch, StageFailure> },
}

/// Why a stage stopped: its own fault, or a consequence of another stage stopping or stalling.
struct StageFailure {
    message: String,
    caused_elsewhere: bool,
    /// The neighbour this stage waited for in vain (a timeout).
    waited_for: Option<usize>,
}

impl StageFailure {
    fn own(message: impl Into<String>) -> Self {
        Self { message: message.into(), caused_elsewhere: false, waited_for: None }
    }
    fn elsewhere(message: impl Into<String>) -> Self {
        Self { message: message.into(), caused_elsewhere: true, waited_for: None }
    }
}

/// One stage's epoch figures.
#[derive(Default)]
struct StageEpoch {
    loss_sum: f64,
    /// Samples trained on (last stage), samples of skipped steps, and samples of skipped steps
    /// trained on later (replay).
    samples: usize,
    skipped_samples: usize,
    replayed_samples: usize,
    /// Samples trained on that the last stage's forward pass classified correctly.
    correct: usize,
    predict: Duration,
    compute: Duration,
    transfer: Duration,
    idle: Duration,
    wall: Duration,
    peak_live: usize,
    forward_traffic: Traffic,
    backward_traffic: Traffic,
    /// Bytes of the step policy's control messages.
    control_bytes: u64,
    /// Across ranks: what the relays of this stage's links to other ranks moved (the bytes it
    /// sent, the time spent in sends and receives).
    relayed: Relayed,
}

impl StageEpoch {
    /// Number of figures in [`to_figures`](Self::to_figures).
    const FIGURES: usize = 18;

    /// The figures as numbers, to sum across ranks (counts stay exact in `f64`).
    fn to_figures(&self) -> [f64; Self::FIGURES] {
        let s = |d: Duration| d.as_secs_f64();
        let (f, b) = (self.forward_traffic, self.backward_traffic);
        [
            self.loss_sum,
            self.samples as f64,
            self.skipped_samples as f64,
            s(self.predict),
            s(self.compute),
            s(self.transfer),
            s(self.idle),
            s(self.wall),
            self.peak_live as f64,
            f.messages as f64,
            f.bytes as f64,
            b.messages as f64,
            b.bytes as f64,
            self.control_bytes as f64,
            self.relayed.bytes as f64,
            s(self.relayed.busy),
            self.replayed_samples as f64,
            self.correct as f64,
        ]
    }

    fn from_figures(v: &[f64]) -> Self {
        let d = |x: f64| Duration::from_secs_f64(x.max(0.0));
        let traffic = |messages: f64, bytes: f64| Traffic { messages: messages as u64, bytes: bytes as u64 };
        Self {
            loss_sum: v[0],
            samples: v[1] as usize,
            skipped_samples: v[2] as usize,
            predict: d(v[3]),
            compute: d(v[4]),
            transfer: d(v[5]),
            idle: d(v[6]),
            wall: d(v[7]),
            peak_live: v[8] as usize,
            forward_traffic: traffic(v[9], v[10]),
            backward_traffic: traffic(v[11], v[12]),
            control_bytes: v[13] as u64,
            relayed: Relayed { bytes: v[14] as u64, busy: d(v[15]) },
            replayed_samples: v[16] as usize,
            correct: v[17] as usize,
        }
    }
}

/// A scalar all-reduce between the stages (the squared gradient norms, for clipping by the
/// global norm; the sync votes). Values are summed in stage order, so every run sums them
/// identically, across ranks too: there each rank fills its own stages' slots of a vector that
/// an all-reduce sums (one non-zero value per slot, so exactly), and then sums it in order.
struct ScalarSum<'l> {
    state: Mutex<(u64, Vec<Option<f64>>, f64)>,
    changed: Condvar,
    /// The stages this process runs, and the link summing in the other ranks' stages.
    local: Range<usize>,
    across: Option<(usize, Mutex<&'l mut dyn RankLink>)>,
    /// What is summed, for error messages.
    what: &'static str,
}

impl<'l> ScalarSum<'l> {
    /// A sum of `what` over `stages` stages, of which this process runs `local`; `across` links
    /// the other ranks when they run the rest.
    fn new(what: &'static str, local: Range<usize>, stages: usize, across: Option<&'l mut dyn RankLink>) -> Self {
        Self {
            state: Mutex::new((0, vec![None; local.len()], 0.0)),
            changed: Condvar::new(),
            local,
            across: across.map(|link| (stages, Mutex::new(link))),
            what,
        }
    }

    fn sum(&self, stage: usize, value: f64, timeout: Duration, stop: &AtomicBool) -> Result<f64, StageFailure> {
        let started = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let round = state.0;
        state.1[stage - self.local.start] = Some(value);
        if state.1.iter().all(Option::is_some) {
            let mut values: Vec<f64> = state.1.iter_mut().map(|v| v.take().unwrap_or(0.0)).collect();
            if let Some((stages, link)) = &self.across {
                // The other local stages wait for this round's result meanwhile.
                drop(state);
                let mut slots = vec![0.0; *stages];
                slots[self.local.clone()].copy_from_slice(&values);
                link.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .all_reduce_sum_f64(&mut slots, cross_rank_timeout(timeout), stop)
                    .map_err(|e| StageFailure::own(format!("summing {}: {e}", self.what)))?;
                values = slots;
                state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            }
            state.2 = values.iter().sum();
            state.0 += 1;
            self.changed.notify_all();
            return Ok(state.2);
        }
        loop {
            state = self.changed.wait_timeout(state, Duration::from_millis(20)).unwrap_or_else(|e| e.into_inner()).0;
            if state.0 != round {
                return Ok(state.2);
            }
            if stop.load(Ordering::SeqCst) {
                return Err(StageFailure::elsewhere("stopped"));
            }
            if started.elapsed() >= timeout {
                return Err(StageFailure::elsewhere(format!(
                    "waited {} s for the other stages' {}",
                    timeout.as_secs_f64(),
                    self.what
                )));
            }
        }
    }
}

/// Which stages this process runs: all of them, or in a multi-process job of `ranks` ranks the
/// `per_rank` consecutive stages of its rank (stage `s` runs on rank `s / per_rank`).
#[derive(Clone, Debug)]
struct Placement {
    local: Range<usize>,
    per_rank: usize,
    ranks: usize,
}

impl Placement {
    fn rank_of(&self, stage: usize) -> usize {
        stage / self.per_rank
    }
}

/// The links of a model-parallel run spread over ranks.
struct AcrossRanks {
    /// Per stage boundary `s` (between stages `s` and `s + 1`): the forward and the backward link.
    boundaries: Vec<[Box<dyn RankLink>; 2]>,
    /// The clipping norms, the sync votes, and the epoch's figures and parameters.
    norms: Box<dyn RankLink>,
    votes: Box<dyn RankLink>,
    gather: Box<dyn RankLink>,
}

/// Model-parallel training over `stages` devices (see the module docs).
pub struct ModelParallel<B: AutodiffBackend> {
    /// Every stage; in a multi-process job those of other ranks only receive their parameters
    /// at the end of each epoch (for evaluation and saving), on this rank's first device.
    stages: Vec<Stage<B>>,
    /// One per stage this process runs.
    pools: Vec<rayon::ThreadPool>,
    cuts: Vec<usize>,
    config: ModelParallelConfig,
    train: TrainConfig,
    /// The stages' parameters after the last completed epoch, in case one fails mid-epoch.
    snapshot: Vec<Classifier<B>>,
    failed: bool,
    /// One per stage, or none (vanilla).
    policies: Vec<Box<dyn StepPolicy<B>>>,
    /// Skipped batches replayed at the next real step, at most.
    replay: usize,
    placement: Placement,
    across: Option<AcrossRanks>,
}

impl<B: AutodiffBackend> ModelParallel<B> {
    /// Cuts `model` into stages on `devices` (one per stage). `profile_data` is used only by
    /// `balance = "time"`, to time each block on a micro-batch.
    pub fn new(
        model: Classifier<B>,
        train: &TrainConfig,
        config: &ModelParallelConfig,
        devices: Vec<B::Device>,
        profile_data: &Encoded,
    ) -> Result<Self, String> {
        config.validate()?;
        if devices.len() != config.stages {
            return Err(format!("{} stages need {} devices, got {}", config.stages, config.stages, devices.len()));
        }
        let pools = thread_pools(config.stages, train.threads, "stage")?;
        let cuts = choose_cuts(&model, train, config, &pools[0], &devices[0], profile_data)?;
        let placement = Placement { local: 0..config.stages, per_rank: config.stages, ranks: 1 };
        Self::assemble(model, train, config, cuts, devices, pools, placement)
    }

    /// Spreads the stages over the ranks of a multi-process job: rank `r` runs the
    /// `stages / ranks` consecutive stages from `r · stages / ranks` on `local_devices` (one per
    /// stage). A boundary between ranks is a link over MPI point-to-point messages, counted like
    /// every link. Every rank cuts where rank 0 does, and checks that all start from the same
    /// parameters.
    pub fn across_ranks(
        model: Classifier<B>,
        train: &TrainConfig,
        config: &ModelParallelConfig,
        local_devices: Vec<B::Device>,
        profile_data: &Encoded,
        ranks: &dyn Ranks,
    ) -> Result<Self, String> {
        config.validate()?;
        let (size, rank) = (ranks.size(), ranks.rank());
        if config.stages % size != 0 {
            return Err(format!(
                "`stages` = {} cannot be spread evenly over the job's {size} ranks: make it a multiple of {size}",
                config.stages
            ));
        }
        let per_rank = config.stages / size;
        if local_devices.len() != per_rank {
            return Err(format!(
                "{per_rank} stages per rank need {per_rank} devices on each rank, got {}",
                local_devices.len()
            ));
        }
        check_same_parameters(ranks, &model)?;
        let pools = thread_pools(per_rank, train.threads, "stage")?;
        // A time balance measures differently on every rank: rank 0's cuts hold for all.
        let mine = match rank {
            0 => choose_cuts(&model, train, config, &pools[0], &local_devices[0], profile_data)?,
            _ => Vec::new(),
        };
        let text = ranks.broadcast_text(&mine.iter().map(usize::to_string).collect::<Vec<_>>().join(","))?;
        let cuts = text
            .split(',')
            .filter(|c| !c.is_empty())
            .map(str::parse)
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|e| format!("rank 0's cut points {text:?}: {e}"))?;
        let local = rank * per_rank..(rank + 1) * per_rank;
        let devices = (0..config.stages)
            .map(|s| local_devices[if local.contains(&s) { s - local.start } else { 0 }].clone())
            .collect();
        let mut links = ranks.links(2 * (config.stages - 1) + 3)?.into_iter();
        let mut next = || links.next().expect("as many links as asked for");
        let boundaries = (1..config.stages).map(|_| [next(), next()]).collect();
        let across = AcrossRanks { boundaries, norms: next(), votes: next(), gather: next() };
        let mut strategy =
            Self::assemble(model, train, config, cuts, devices, pools, Placement { local, per_rank, ranks: size })?;
        strategy.across = Some(across);
        Ok(strategy)
    }

    fn assemble(
        model: Classifier<B>,
        train: &TrainConfig,
        config: &ModelParallelConfig,
        cuts: Vec<usize>,
        devices: Vec<B::Device>,
        pools: Vec<rayon::ThreadPool>,
        placement: Placement,
    ) -> Result<Self, String> {
        let modules = model.split(&cuts).map_err(|e| format!("`cuts`: {e}"))?;
        let stages: Vec<Stage<B>> = modules.into_iter().zip(devices).map(|(m, d)| Stage::new(m, train, d)).collect();
        let snapshot = stages.iter().map(|s| s.module().clone()).collect();
        let config = config.clone();
        Ok(Self {
            stages,
            pools,
            cuts,
            config,
            train: train.clone(),
            snapshot,
            failed: false,
            policies: Vec::new(),
            replay: 0,
            placement,
            across: None,
        })
    }

    /// Gives each stage a [`StepPolicy`] (one per stage, in stage order).
    pub fn with_policies(mut self, policies: Vec<Box<dyn StepPolicy<B>>>) -> Result<Self, String> {
        if policies.len() != self.stages.len() {
            return Err(format!(
                "{} stages need {} step policies, got {}",
                self.stages.len(),
                self.stages.len(),
                policies.len()
            ));
        }
        self.policies = policies;
        Ok(self)
    }

    /// With step policies: trains each real step also on the last `batches` batches skipped
    /// before it (a replay buffer, an ablation of predictive sync; 0, the default, replays none).
    pub fn with_replay(mut self, batches: usize) -> Self {
        self.replay = batches;
        self
    }

    /// The cut points in use (block indices where each stage after the first begins).
    pub fn cuts(&self) -> &[usize] {
        &self.cuts
    }
}

/// The manifest's cut points, or balanced ones (`balance`; a time balance profiles the blocks
/// on `device` in `pool`).
fn choose_cuts<B: AutodiffBackend>(
    model: &Classifier<B>,
    train: &TrainConfig,
    config: &ModelParallelConfig,
    pool: &rayon::ThreadPool,
    device: &B::Device,
    profile_data: &Encoded,
) -> Result<Vec<usize>, String> {
    if config.stages > model.num_blocks() {
        return Err(format!("cannot cut a model of {} blocks into {} stages", model.num_blocks(), config.stages));
    }
    Ok(match (&config.cuts, config.balance) {
        (Some(cuts), _) => cuts.clone(),
        _ if config.stages == 1 => Vec::new(),
        (None, Balance::Params) => {
            let costs: Vec<f64> = model.blocks().iter().map(|b| b.num_params() as f64).collect();
            balanced_cuts(&costs, config.stages)
        }
        (None, Balance::Time) => {
            let micro_size = train.batch_size.div_ceil(config.schedule.micro_batches(config.micro_batches));
            let costs = pool.install(|| profile_blocks(model, train, profile_data, micro_size, device))?;
            balanced_cuts(&costs, config.stages)
        }
    })
}

/// Everything a stage thread needs besides its stage.
struct StageContext<'a, 'l> {
    index: usize,
    stages: usize,
    plan: &'a EpochPlan<'a>,
    train: &'a TrainConfig,
    config: &'a ModelParallelConfig,
    placement: &'a Placement,
    /// Skipped batches to train on at the next real step, at most (0: none).
    replay: usize,
    norms: &'a ScalarSum<'l>,
    /// Sync votes and the shared loss (with step policies only).
    votes: &'a ScalarSum<'l>,
    stop: &'a AtomicBool,
    reports: Sender<Report>,
}

impl StageContext<'_, '_> {
    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.config.timeout_seconds)
    }

    /// Receives the message for (`batch`, `micro`) from stage `peer` on `link`, adding the wait to `epoch`.
    fn receive<B: AutodiffBackend>(
        &self,
        link: &Option<LinkReceiver<Message<B>>>,
        peer: usize,
        batch: usize,
        micro: usize,
        epoch: &mut StageEpoch,
    ) -> Result<Wire<B>, StageFailure> {
        let link = link.as_ref().ok_or_else(|| StageFailure::own("receive on a link that does not exist"))?;
        let timeout =
            if self.placement.local.contains(&peer) { self.timeout() } else { cross_rank_timeout(self.timeout()) };
        let ((b, m, value), wait) = link.recv(timeout, self.stop).map_err(|e| StageFailure {
            waited_for: matches!(e, RecvError::Timeout(_)).then_some(peer),
            ..StageFailure::elsewhere(format!("{e} from stage {peer}"))
        })?;
        epoch.idle += wait.idle;
        epoch.transfer += wait.transfer;
        if (b, m) != (batch, micro) {
            return Err(StageFailure::own(format!(
                "expected micro-batch {micro} of batch {batch}, received {m} of {b}"
            )));
        }
        Ok(value)
    }

    fn send<B: AutodiffBackend>(
        &self,
        link: &mut Option<LinkSender<Message<B>>>,
        batch: usize,
        micro: usize,
        value: Wire<B>,
    ) -> Result<(), StageFailure> {
        let link = link.as_mut().ok_or_else(|| StageFailure::own("send on a link that does not exist"))?;
        let bytes = wire_bytes::<B>(&value);
        link.send((batch, micro, value), bytes).map_err(StageFailure::elsewhere)
    }

    /// Runs this stage's passes of every global batch of the epoch, in schedule order.
    fn run<B: AutodiffBackend>(
        &self,
        stage: &mut Stage<B>,
        mut ends: Ends<B>,
        mut policy: Option<&mut Box<dyn StepPolicy<B>>>,
    ) -> Result<StageEpoch, StageFailure> {
        let started = Instant::now();
        let mut epoch = StageEpoch::default();
        let last = self.index + 1 == self.stages;
        // Batches skipped since the last real step, kept for replay (at most `replay`).
        let mut skipped: VecDeque<&[usize]> = VecDeque::new();
        for (b, batch) in self.plan.batches.iter().enumerate() {
            if self.stop.load(Ordering::SeqCst) {
                return Err(StageFailure::elsewhere("stopped"));
            }
            if let Some(policy) = policy.as_mut() {
                let voting = Instant::now();
                let vote = policy.wants_sync(stage);
                epoch.predict += voting.elapsed();
                let waiting = Instant::now();
                let votes = self.votes.sum(self.index, if vote { 1.0 } else { 0.0 }, self.timeout(), self.stop)?;
                epoch.idle += waiting.elapsed();
                if votes == 0.0 {
                    let predicting = Instant::now();
                    policy.skip(stage);
                    epoch.predict += predicting.elapsed();
                    if last {
                        epoch.skipped_samples += batch.len();
                    }
                    if self.replay > 0 {
                        if skipped.len() == self.replay {
                            skipped.pop_front();
                        }
                        skipped.push_back(batch);
                    }
                    let _ = self.reports.send(Report::Step { stage: self.index, samples: batch.len() });
                    continue;
                }
            }
            // Replay: the kept skipped batches are trained on with this one, as one global batch.
            let replayed: Vec<usize> = skipped.drain(..).flatten().copied().collect();
            if last {
                epoch.replayed_samples += replayed.len();
            }
            let joined: Vec<usize>;
            let indices: &[usize] = match replayed.is_empty() {
                true => batch,
                false => {
                    joined = replayed.into_iter().chain(batch.iter().copied()).collect();
                    &joined
                }
            };
            let batch_loss_before = epoch.loss_sum;
            let micro = self.config.schedule.micro_batches(self.config.micro_batches).min(indices.len()).max(1);
            let ranges = shard_ranges(indices.len(), micro);
            for action in self.config.schedule.actions(self.index, self.stages, micro) {
                if self.stop.load(Ordering::SeqCst) {
                    return Err(StageFailure::elsewhere("stopped"));
                }
                match action {
                    Action::Forward(m) => {
                        let rows = &indices[ranges[m].clone()];
                        let input = match self.index {
                            0 => None,
                            _ => Some(self.receive::<B>(&ends.from_previous, self.index - 1, b, m, &mut epoch)?),
                        };
                        let computing = Instant::now();
                        let batch = self.plan.data.batch::<B>(rows, stage.device());
                        let input = input.unwrap_or_else(|| Activation::Tokens(batch.tokens.inner()));
                        if last {
                            let weight = rows.len() as f64 / indices.len() as f64;
                            let (loss, correct) = stage.forward_loss(m, input, &batch.mask_pad, batch.labels, weight);
                            epoch.loss_sum += loss * rows.len() as f64;
                            epoch.correct += correct;
                            epoch.samples += rows.len();
                            epoch.compute += computing.elapsed();
                            epoch.peak_live = epoch.peak_live.max(stage.live());
                        } else {
                            let output = stage.forward(m, input, &batch.mask_pad);
                            epoch.compute += computing.elapsed();
                            epoch.peak_live = epoch.peak_live.max(stage.live());
                            self.send::<B>(&mut ends.to_next, b, m, output)?;
                        }
                    }
                    Action::Backward(m) => {
                        let grad = match last {
                            true => None,
                            false => Some(self.receive::<B>(&ends.from_next, self.index + 1, b, m, &mut epoch)?),
                        };
                        let computing = Instant::now();
                        let input_grad = stage.backward(m, grad).map_err(StageFailure::own)?;
                        epoch.compute += computing.elapsed();
                        if let Some(g) = input_grad {
                            self.send::<B>(&mut ends.to_previous, b, m, g)?;
                        }
                    }
                }
            }
            let scale = match self.train.grad_clip_norm {
                None => 1.0,
                Some(max_norm) => {
                    let computing = Instant::now();
                    let squared = stage.squared_gradient_norm();
                    epoch.compute += computing.elapsed();
                    let waiting = Instant::now();
                    let total = self.norms.sum(self.index, squared, self.timeout(), self.stop)?;
                    epoch.idle += waiting.elapsed();
                    clip_factor(total.sqrt(), max_norm)
                }
            };
            if let Some(policy) = policy.as_mut() {
                let predicting = Instant::now();
                policy.before_update(stage);
                epoch.predict += predicting.elapsed();
            }
            let computing = Instant::now();
            stage.step(self.train, scale, self.plan.first_step + b, self.plan.total_steps);
            epoch.compute += computing.elapsed();
            if let Some(policy) = policy.as_mut() {
                let batch_loss = if last { (epoch.loss_sum - batch_loss_before) / indices.len() as f64 } else { 0.0 };
                let waiting = Instant::now();
                let loss = self.votes.sum(self.index, batch_loss, self.timeout(), self.stop)?;
                epoch.idle += waiting.elapsed();
                let predicting = Instant::now();
                policy.after_update(stage, loss, last);
                epoch.predict += predicting.elapsed();
            }
            let _ = self.reports.send(Report::Step { stage: self.index, samples: batch.len() });
        }
        epoch.wall = started.elapsed();
        epoch.control_bytes = policy.map_or(0, |p| p.control_bytes());
        epoch.forward_traffic = ends.to_next.as_ref().map(LinkSender::traffic).unwrap_or_default();
        epoch.backward_traffic = ends.to_previous.as_ref().map(LinkSender::traffic).unwrap_or_default();
        Ok(epoch)
    }
}

/// A relay thread's work: one direction of a stage boundary between this rank and another.
enum Relay<'l, B: AutodiffBackend> {
    /// Carries what local stage `stage` sends to a stage of rank `to`.
    Out { stage: usize, from_stage: LinkReceiver<Message<B>>, link: &'l mut dyn RankLink, to: usize },
    /// Carries what a stage of rank `from` sends to local stage `stage`, on its `device`.
    In { stage: usize, to_stage: LinkSender<Message<B>>, link: &'l mut dyn RankLink, from: usize, device: B::Device },
}

impl<B: AutodiffBackend> Relay<'_, B> {
    fn stage(&self) -> usize {
        match self {
            Relay::Out { stage, .. } | Relay::In { stage, .. } => *stage,
        }
    }

    /// Runs the relay until its stage's epoch is over; on failure (a panic too) it stops the run.
    fn run(self, timeout: Duration, done: &AtomicBool, stop: &AtomicBool) -> (usize, Result<Relayed, String>) {
        let stage = self.stage();
        let result = catch_unwind(AssertUnwindSafe(|| match self {
            Relay::Out { from_stage, link, to, .. } => relay::send_out::<B>(from_stage, link, to, timeout, stop),
            Relay::In { to_stage, link, from, device, .. } => {
                relay::receive_in::<B>(to_stage, link, from, &device, timeout, done, stop)
            }
        }))
        .unwrap_or_else(|panic| Err(format!("its relay panicked: {}", panic_message(&panic))));
        match result {
            // The run was stopped elsewhere: that failure explains this one.
            Err(_) if stop.load(Ordering::SeqCst) => (stage, Ok(Relayed::default())),
            Err(e) => {
                stop.store(true, Ordering::SeqCst);
                (stage, Err(e))
            }
            relayed => (stage, relayed),
        }
    }
}

/// The link ends of every stage: stage `s` sends forward to `s + 1` and back to `s − 1`. In a
/// multi-process job (`boundaries`), a direction between one of this process's stages and
/// another rank's gets a relay; directions between two other ranks get nothing.
fn wire_up<'l, B: AutodiffBackend>(
    devices: &[B::Device],
    interconnect: Interconnect,
    placement: &Placement,
    boundaries: Option<&'l mut [[Box<dyn RankLink>; 2]]>,
) -> (Vec<Ends<B>>, Vec<Relay<'l, B>>) {
    let k = devices.len();
    let mut ends: Vec<Ends<B>> =
        (0..k).map(|_| Ends { from_previous: None, to_next: None, from_next: None, to_previous: None }).collect();
    let mut relays = Vec::new();
    let links: Vec<[Option<&'l mut dyn RankLink>; 2]> = match boundaries {
        Some(boundaries) => boundaries
            .iter_mut()
            .map(|[f, b]| [Some(&mut **f as &mut dyn RankLink), Some(&mut **b as &mut dyn RankLink)])
            .collect(),
        None => (1..k).map(|_| [None, None]).collect(),
    };
    // One direction, `from` → `to`: the sender's and the receiver's ends where they are local.
    let mut connect = |from: usize, to: usize, rank_link: Option<&'l mut dyn RankLink>| {
        let local = |s: usize| placement.local.contains(&s);
        match (local(from), local(to), rank_link) {
            (true, true, _) | (_, _, None) => {
                let (tx, rx) = link(interconnect);
                (Some(tx), Some(rx))
            }
            (true, false, Some(rank_link)) => {
                let (tx, rx) = link(Interconnect::default());
                relays.push(Relay::Out { stage: from, from_stage: rx, link: rank_link, to: placement.rank_of(to) });
                (Some(tx), None)
            }
            (false, true, Some(rank_link)) => {
                // A simulated interconnect delays the message on the receiving rank, whose stage
                // counts the delay as transfer time (as in one process).
                let (tx, rx) = link(interconnect);
                relays.push(Relay::In {
                    stage: to,
                    to_stage: tx,
                    link: rank_link,
                    from: placement.rank_of(from),
                    device: devices[to].clone(),
                });
                (None, Some(rx))
            }
            (false, false, Some(_)) => (None, None),
        }
    };
    for (s, [forward, backward]) in (1..k).zip(links) {
        (ends[s - 1].to_next, ends[s].from_previous) = connect(s - 1, s, forward);
        (ends[s].to_previous, ends[s - 1].from_next) = connect(s, s - 1, backward);
    }
    (ends, relays)
}

impl<B: AutodiffBackend> Strategy<B> for ModelParallel<B> {
    fn name(&self) -> &str {
        "model-parallel"
    }

    fn devices(&self) -> Vec<String> {
        self.stages[self.placement.local.clone()].iter().map(|s| format!("{:?}", s.device())).collect()
    }

    fn train_epoch(&mut self, plan: &EpochPlan) -> Result<TrainStats, TrainError> {
        if self.failed {
            return Err(TrainError::Strategy("an earlier epoch failed; the stages are out of step".into()));
        }
        self.snapshot = self.stages.iter().map(|s| s.module().clone()).collect();
        let k = self.stages.len();
        let (train, config, placement, replay) = (&self.train, &self.config, &self.placement, self.replay);
        let local = placement.local.clone();
        let timeout = Duration::from_secs_f64(config.timeout_seconds);
        let (boundaries, norms, votes) = match &mut self.across {
            Some(a) => (
                Some(&mut a.boundaries[..]),
                Some(a.norms.as_mut() as &mut dyn RankLink),
                Some(a.votes.as_mut() as &mut dyn RankLink),
            ),
            None => (None, None, None),
        };
        let norms = ScalarSum::new("gradient norms", local.clone(), k, norms);
        let votes = ScalarSum::new("sync votes or loss", local.clone(), k, votes);
        let (stop, done) = (AtomicBool::new(false), AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let devices: Vec<B::Device> = self.stages.iter().map(|s| s.device().clone()).collect();
        let (ends, relays) = wire_up::<B>(&devices, config.interconnect, placement, boundaries);
        let mut policies: Vec<Option<&mut Box<dyn StepPolicy<B>>>> = match self.policies.is_empty() {
            true => (0..k).map(|_| None).collect(),
            false => self.policies.iter_mut().map(Some).collect(),
        };
        let (outcome, relayed) = std::thread::scope(|scope| {
            let relays: Vec<ScopedJoinHandle<_>> = relays
                .into_iter()
                .map(|relay| scope.spawn(|| relay.run(cross_rank_timeout(timeout), &done, &stop)))
                .collect();
            let stages = self
                .stages
                .iter_mut()
                .zip(policies.drain(..))
                .zip(ends)
                .enumerate()
                .filter(|(index, _)| local.contains(index));
            for ((index, ((stage, policy), ends)), pool) in stages.zip(&self.pools) {
                let context = StageContext {
                    index,
                    stages: k,
                    plan,
                    train,
                    config,
                    placement,
                    replay,
                    norms: &norms,
                    votes: &votes,
                    stop: &stop,
                    reports: tx.clone(),
                };
                scope.spawn(move || {
                    let result = catch_unwind(AssertUnwindSafe(|| pool.install(|| context.run(stage, ends, policy))))
                        .unwrap_or_else(|panic| Err(StageFailure::own(format!("panicked: {}", panic_message(&panic)))));
                    if result.is_err() {
                        stage.reset();
                    }
                    let _ = context.reports.send(Report::Done { stage: index, result });
                });
            }
            drop(tx);
            let outcome = coordinate(config, placement, rx, plan, &stop);
            done.store(true, Ordering::SeqCst);
            // A relay catches its own panics: joining cannot fail.
            let relayed: Vec<_> = relays.into_iter().filter_map(|h| h.join().ok()).collect();
            (outcome, relayed)
        });
        drop((norms, votes));
        // A relay that failed by itself stopped the run: its error is the cause.
        let relay_failure = relayed.iter().find_map(|(stage, r)| r.as_ref().err().map(|e| (*stage, e.clone())));
        let outcome = match relay_failure {
            Some((stage, e)) => {
                Err(format!("the link of stage {stage} to another rank failed in epoch {}: {e}", plan.epoch + 1))
            }
            None => outcome,
        };
        let outcome = outcome.and_then(|mut epochs| {
            for (stage, relay) in relayed.into_iter().filter_map(|(stage, r)| Some((stage, r.ok()?))) {
                let relayed = &mut epochs[stage - local.start].relayed;
                (relayed.bytes, relayed.busy) = (relayed.bytes + relay.bytes, relayed.busy + relay.busy);
            }
            match &mut self.across {
                Some(across) => gather_epoch(
                    &mut self.stages,
                    &self.placement,
                    across.gather.as_mut(),
                    cross_rank_timeout(timeout),
                    epochs,
                ),
                None => Ok(epochs),
            }
        });
        match outcome {
            Ok(epochs) => Ok(self.epoch_stats(&epochs, plan.batches.len())),
            Err(message) => {
                self.failed = true;
                Err(TrainError::Strategy(message))
            }
        }
    }

    fn model(&self) -> Classifier<B> {
        let device = self.stages[0].device();
        let parts: Vec<Classifier<B>> = match self.failed {
            true => self.snapshot.clone(),
            false => self.stages.iter().map(|s| s.module().clone()).collect(),
        };
        Classifier::join(parts.into_iter().map(|m| m.fork(device)).collect())
    }
}

/// Waits for the stages' reports, forwarding progress. The first stage to fail by itself (not
/// because a neighbour stopped) names the error; when no stage reports for `timeout_seconds`
/// (a quarter more in a multi-process job, so that a stage's wait on another rank, which may
/// start a step's computation later, fails first and names the rank), the run stops and the
/// stages furthest behind are named.
fn coordinate(
    config: &ModelParallelConfig,
    placement: &Placement,
    reports: mpsc::Receiver<Report>,
    plan: &EpochPlan,
    stop: &AtomicBool,
) -> Result<Vec<StageEpoch>, String> {
    let timeout = Duration::from_secs_f64(config.timeout_seconds);
    let watchdog = if placement.ranks > 1 { timeout.mul_f64(1.25) } else { timeout };
    let local = placement.local.clone();
    let mut done: Vec<Option<StageEpoch>> = local.clone().map(|_| None).collect();
    // Steps done per stage, by stage number (only this process's stages report).
    let mut steps = vec![0usize; local.end];
    let mut failures: Vec<(usize, StageFailure)> = Vec::new();
    let mut stalled: Option<String> = None;
    let mut finished = 0;
    while finished < local.len() {
        match reports.recv_timeout(watchdog) {
            Ok(Report::Step { stage, samples }) => {
                steps[stage] += 1;
                if stage + 1 == local.end {
                    (plan.on_batch)(samples);
                }
            }
            Ok(Report::Done { stage, result }) => {
                finished += 1;
                match result {
                    Ok(epoch) => done[stage - local.start] = Some(epoch),
                    Err(failure) => {
                        stop.store(true, Ordering::SeqCst);
                        failures.push((stage, failure));
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) if stop.load(Ordering::SeqCst) => break,
            Err(RecvTimeoutError::Timeout) => {
                let behind = local.clone().map(|s| steps[s]).min().unwrap_or(0);
                let laggards: Vec<usize> =
                    local.clone().filter(|&s| done[s - local.start].is_none() && steps[s] == behind).collect();
                stalled = Some(format!(
                    "stage(s) {laggards:?} made no progress for {} s (stuck at step {})",
                    watchdog.as_secs_f64(),
                    behind + 1
                ));
                stop.store(true, Ordering::SeqCst);
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let failed = |(stage, failure): &(usize, StageFailure)| {
        format!("stage {stage} failed at step {} of epoch {}: {}", steps[*stage] + 1, plan.epoch + 1, failure.message)
    };
    if let Some(own) = failures.iter().find(|(_, f)| !f.caused_elsewhere) {
        return Err(failed(own));
    }
    if let Some(message) = stalled {
        return Err(message);
    }
    if let Some((waiter, peer)) = failures.iter().find_map(|(waiter, f)| f.waited_for.map(|peer| (*waiter, peer))) {
        let seconds = timeout.as_secs_f64();
        return Err(match local.contains(&peer) {
            true => format!("stage {peer} made no progress for {seconds} s (stuck at step {} of epoch {}; stage {waiter} was waiting for it)", steps[peer] + 1, plan.epoch + 1),
            false => format!(
                "stage {peer}, on rank {}, sent nothing for {} s (stage {waiter} was waiting for it at step {} of epoch {}); that rank is stuck or gone",
                placement.rank_of(peer),
                cross_rank_timeout(timeout).as_secs_f64(),
                steps[waiter] + 1,
                plan.epoch + 1
            ),
        });
    }
    if let Some(first) = failures.first() {
        return Err(failed(first));
    }
    done.into_iter().zip(local).map(|(d, s)| d.ok_or(format!("stage {s} exited without a report"))).collect()
}

/// Across ranks, at the end of an epoch: every stage's figures and parameters on every rank
/// (the figures for the results, the parameters for evaluating and saving the whole model).
fn gather_epoch<B: AutodiffBackend>(
    stages: &mut [Stage<B>],
    placement: &Placement,
    link: &mut dyn RankLink,
    timeout: Duration,
    local: Vec<StageEpoch>,
) -> Result<Vec<StageEpoch>, String> {
    const F: usize = StageEpoch::FIGURES;
    let mut figures = vec![0.0; stages.len() * F];
    for (s, epoch) in placement.local.clone().zip(&local) {
        figures[s * F..(s + 1) * F].copy_from_slice(&epoch.to_figures());
    }
    link.all_reduce_sum_f64(&mut figures, timeout, &AtomicBool::new(false))
        .map_err(|e| format!("gathering the epoch's figures: {e}"))?;
    // Each rank fills its own stages' values; the sum puts every stage's everywhere.
    let mut offsets = vec![0];
    for stage in stages.iter() {
        offsets.push(offsets.last().copied().unwrap_or(0) + stage.module().parameter_count());
    }
    let mut values = vec![0f32; offsets[stages.len()]];
    for s in placement.local.clone() {
        values[offsets[s]..offsets[s + 1]].copy_from_slice(&stages[s].module().parameter_values());
    }
    link.all_reduce_sum(&mut values, timeout).map_err(|e| format!("gathering the stages' parameters: {e}"))?;
    for (s, stage) in stages.iter_mut().enumerate().filter(|(s, _)| !placement.local.contains(s)) {
        stage.set_parameter_values(&values[offsets[s]..offsets[s + 1]]);
    }
    Ok(figures.chunks(F).map(StageEpoch::from_figures).collect())
}

impl<B: AutodiffBackend> ModelParallel<B> {
    /// The stages' epochs as the strategy's figures: per stage time split and activations kept,
    /// per boundary traffic per step, and the bubble against the ideal pipeline's.
    fn epoch_stats(&mut self, epochs: &[StageEpoch], steps: usize) -> TrainStats {
        let last = epochs.last().expect("at least one stage");
        let seconds = |f: fn(&StageEpoch) -> Duration| epochs.iter().map(|e| f(e).as_secs_f64()).collect::<Vec<f64>>();
        let bubble: Vec<f64> = epochs.iter().map(|e| e.idle.as_secs_f64() / e.wall.as_secs_f64().max(1e-12)).collect();
        let per_step = |t: Traffic| TrafficPerStep {
            messages: t.messages as f64 / steps.max(1) as f64,
            bytes: t.bytes as f64 / steps.max(1) as f64,
        };
        let links: Vec<LinkFigures> = (1..epochs.len())
            .map(|s| LinkFigures {
                forward: per_step(epochs[s - 1].forward_traffic),
                backward: per_step(epochs[s].backward_traffic),
            })
            .collect();
        let control: u64 = epochs.iter().map(|e| e.control_bytes).sum();
        let bytes: u64 =
            epochs.iter().map(|e| e.forward_traffic.bytes + e.backward_traffic.bytes).sum::<u64>() + control;
        let transfer_share =
            epochs.iter().map(|e| e.transfer.as_secs_f64() / e.wall.as_secs_f64().max(1e-12)).sum::<f64>()
                / epochs.len() as f64;
        // As run: a batch smaller than `micro_batches` runs one micro-batch per sample.
        let micro = self.config.schedule.micro_batches(self.config.micro_batches).min(self.train.batch_size);
        // This process's first stage's policy speaks for the protocol (sync counts are the same
        // on every stage); control bytes and prediction time are summed or listed per stage.
        let policies: Vec<SyncFigures> = self.policies.iter_mut().map(|p| p.take_epoch_figures()).collect();
        let sync = policies.into_iter().nth(self.placement.local.start).map(|protocol| SyncFigures {
            control_bytes_per_step: control as f64 / steps.max(1) as f64,
            predict_seconds: seconds(|e| e.predict),
            replayed_samples: last.replayed_samples,
            ..protocol
        });
        let across_ranks = self.across.as_ref().map(|_| PipelineRanks {
            ranks: self.placement.ranks,
            stages_per_rank: self.placement.per_rank,
            cross_rank_bytes_per_step: epochs.iter().map(|e| e.relayed.bytes).sum::<u64>() as f64 / steps.max(1) as f64,
            cross_rank_seconds: epochs.iter().map(|e| e.relayed.busy.as_secs_f64()).sum::<f64>(),
        });
        let figures = PipelineFigures {
            stages: epochs.len(),
            cuts: self.cuts.clone(),
            schedule: self.config.schedule.name().into(),
            micro_batches: micro,
            interconnect: self.config.interconnect.name().into(),
            stage_parameters: self.stages.iter().map(|s| s.module().parameter_count()).collect(),
            compute_seconds: seconds(|e| e.compute),
            transfer_seconds: seconds(|e| e.transfer),
            idle_seconds: seconds(|e| e.idle),
            bubble_fraction_mean: bubble.iter().sum::<f64>() / bubble.len() as f64,
            bubble_fraction: bubble,
            bubble_fraction_theory: theoretical_bubble(epochs.len(), micro),
            peak_live_activations: epochs.iter().map(|e| e.peak_live).collect(),
            links_per_step: links,
            bytes_per_step: bytes as f64 / steps.max(1) as f64,
            communication_share: transfer_share,
            sync,
            across_ranks,
        };
        // Loss over the samples trained on; samples over all the epoch consumed.
        TrainStats {
            loss: last.loss_sum / last.samples.max(1) as f64,
            samples: last.samples + last.skipped_samples - last.replayed_samples,
            steps,
            tested: last.samples,
            correct: last.correct,
            figures: StrategyFigures::Pipeline(figures),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_cuts_minimise_the_slowest_stage() {
        assert_eq!(balanced_cuts(&[1.0, 1.0, 1.0, 1.0], 2), vec![2]);
        assert_eq!(balanced_cuts(&[10.0, 1.0, 1.0, 1.0], 2), vec![1]);
        assert_eq!(balanced_cuts(&[1.0, 1.0, 1.0, 9.0], 2), vec![3]);
        assert_eq!(balanced_cuts(&[3.0, 1.0, 1.0, 1.0, 3.0], 3), vec![1, 4]);
        assert_eq!(balanced_cuts(&[1.0, 2.0], 2), vec![1]);
        assert_eq!(balanced_cuts(&[5.0], 1), Vec::<usize>::new());
        assert!(balanced_cuts(&[1.0, 2.0], 3).is_empty(), "more stages than blocks");
    }

    #[test]
    fn labels_name_the_schedule_and_a_simulated_interconnect() {
        let naive = ModelParallelConfig { schedule: Schedule::Naive, ..Default::default() };
        assert_eq!(naive.label(), "model-parallel-2s-naive");
        let cut = ModelParallelConfig {
            stages: 3,
            cuts: Some(vec![1, 3]),
            schedule: Schedule::OneFOneB,
            micro_batches: 4,
            ..Default::default()
        };
        assert_eq!(cut.label(), "model-parallel-3s-cuts1-3-1f1b-4m");
        let slow = ModelParallelConfig {
            interconnect: Interconnect::Preset(crate::link::Preset::OneGbE),
            ..Default::default()
        };
        assert_eq!(slow.label(), "model-parallel-2s-gpipe-8m-1gbe");
        assert!(ModelParallelConfig { timeout_seconds: 0.0, ..Default::default() }.validate().is_err());
    }
}
