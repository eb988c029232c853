//! Model parallelism: the model cut into stages, each device (one thread) running one stage or,
//! with an interleaved schedule, several; activations sent forward and gradients sent back over
//! counted (optionally slowed) links, in the order a [`Schedule`](crate::Schedule) prescribes.
//! In a multi-process job each rank runs its share of the devices, and a boundary between ranks
//! is relayed over MPI ([`relay`]).
//!
//! - [`config`]: the manifest's settings; [`balance`]: where to cut.
//! - [`stage`]: what runs — one stage's forward and backward passes and optimizer, and what a
//!   protocol may add to it ([`StageAddOn`]); [`wire`]: what crosses a boundary.
//! - [`executor`]: one device's timetable run for every batch; [`policy`]: the seam where a
//!   protocol (predictive sync) decides what each batch does.
//! - [`wiring`], [`relay`], [`scalar_sum`]: links, relays across ranks, and the scalar sums
//!   between devices.
//! - [`figures`]: what an epoch measured.

mod balance;
mod config;
mod executor;
mod figures;
mod payload;
mod policy;
mod relay;
mod scalar_sum;
mod stage;
mod wire;
mod wiring;

use std::sync::atomic::AtomicBool;
use std::thread::ScopedJoinHandle;
use std::time::Duration;

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Bool, Int, Tensor};
use tandem_data::Encoded;
use tandem_models::{Activation, Classifier};
use tandem_train::bytes::{Reader, Writer};
use tandem_train::{EpochPlan, StateError, StateParts, Strategy, TrainConfig, TrainError, TrainStats};

pub use balance::{balanced_cuts, profile_blocks};
pub use config::{Balance, ModelParallelConfig};
pub use executor::LABEL_BYTES;
pub use policy::{Peers, StepError, StepInput, StepPlan, StepPolicy};
pub use stage::{fresh_leaves, MicroBatch, OwnStep, Stage, StageAddOn};
pub use wire::{wire_bytes, Wire};

use balance::choose_cuts;
use executor::{DeviceWork, Shared};
use figures::gather_epoch;
use payload::StageCodecs;
use scalar_sum::ScalarSum;
use wiring::{wire_up, AcrossRanks, Placement};

use crate::kind::BuildError;
use crate::kind::StrategyKind;
use crate::ranks::{check_same_parameters, cross_rank_timeout, RankLink, Ranks};
use crate::supervisor::{thread_pools, Gate, Stopped, Supervisor};

/// Model-parallel training over `stages` devices (see the module docs).
pub struct ModelParallel<B: AutodiffBackend> {
    /// Every stage, in model order; in a multi-process job those of other ranks only receive their parameters
    /// at the end of each epoch (for evaluation and saving), on this rank's first device.
    stages: Vec<Stage<B>>,
    /// One per device this process runs.
    pools: Vec<rayon::ThreadPool>,
    cuts: Vec<usize>,
    config: ModelParallelConfig,
    train: TrainConfig,
    /// The stages' parameters after the last completed epoch, in case one fails mid-epoch.
    snapshot: Vec<Classifier<B>>,
    failed: bool,
    /// One per device, or none (vanilla).
    policies: Vec<Box<dyn StepPolicy<B>>>,
    placement: Placement,
    across: Option<AcrossRanks>,
    /// Each stage's boundary codecs (compression), kept from epoch to epoch.
    codecs: Vec<StageCodecs>,
}

/// Where an add-on goes: stage `stage` of `last + 1`, whose output has `output_width`
/// features, on `device`, in a run trained with `train`.
pub struct AddOnSite<'a, B: AutodiffBackend> {
    pub stage: usize,
    pub last: usize,
    pub output_width: usize,
    pub device: &'a B::Device,
    pub train: &'a TrainConfig,
}

impl<B: AutodiffBackend> ModelParallel<B> {
    /// Cuts `model` into stages on `devices` (stage `s` on device `s % devices`). `profile_data` is used only by
    /// `balance = "time"`, to time each block on a micro-batch.
    pub fn new(
        model: Classifier<B>,
        train: &TrainConfig,
        config: &ModelParallelConfig,
        devices: Vec<B::Device>,
        profile_data: &Encoded,
    ) -> Result<Self, BuildError> {
        config.validate()?;
        if devices.len() != config.stages {
            let message = format!("{} stages need {} devices, got {}", config.stages, config.stages, devices.len());
            return Err(BuildError::Mismatch(message));
        }
        let pools = thread_pools(config.stages, train.threads, "stage")?;
        let cuts = choose_cuts(&model, train, config, &pools[0], &devices[0], profile_data)?;
        let devices = (0..config.pieces()).map(|s| devices[s % config.stages].clone()).collect();
        Self::assemble(model, train, config, cuts, devices, pools, Placement::single(config.stages))
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
    ) -> Result<Self, BuildError> {
        config.validate()?;
        let (size, rank) = (ranks.size(), ranks.rank());
        if !config.stages.is_multiple_of(size) {
            return Err(BuildError::Mismatch(format!(
                "`stages` = {} cannot be spread evenly over the job's {size} ranks: make it a multiple of {size}",
                config.stages
            )));
        }
        let per_rank = config.stages / size;
        if local_devices.len() != per_rank {
            return Err(BuildError::Mismatch(format!(
                "{per_rank} stages per rank need {per_rank} devices on each rank, got {}",
                local_devices.len()
            )));
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
            .map_err(|e| BuildError::Mismatch(format!("rank 0's cut points {text:?}: {e}")))?;
        let local = rank * per_rank..(rank + 1) * per_rank;
        let placement = Placement { local, per_rank, ranks: size, devices: config.stages };
        let devices = (0..config.pieces())
            .map(|s| match placement.runs_stage(s) {
                true => local_devices[placement.device_of(s) - placement.local.start].clone(),
                false => local_devices[0].clone(),
            })
            .collect();
        let pieces = config.pieces();
        let mut links = ranks.links(2 * (pieces - 1) + 3)?.into_iter();
        let mut next = || links.next().expect("as many links as asked for");
        let boundaries = (1..pieces).map(|_| [next(), next()]).collect();
        let across = AcrossRanks { boundaries, norms: next(), votes: next(), gather: next() };
        let mut strategy = Self::assemble(model, train, config, cuts, devices, pools, placement)?;
        strategy.across = Some(across);
        Ok(strategy)
    }

    /// [`ModelParallel::new`] in one process, [`ModelParallel::across_ranks`] in a multi-process
    /// job (`ranks`; `devices` are then this rank's).
    pub fn for_job(
        model: Classifier<B>,
        train: &TrainConfig,
        config: &ModelParallelConfig,
        devices: Vec<B::Device>,
        profile_data: &Encoded,
        ranks: Option<&dyn Ranks>,
    ) -> Result<Self, BuildError> {
        match ranks {
            Some(ranks) => Self::across_ranks(model, train, config, devices, profile_data, ranks),
            None => Self::new(model, train, config, devices, profile_data),
        }
    }

    fn assemble(
        model: Classifier<B>,
        train: &TrainConfig,
        config: &ModelParallelConfig,
        cuts: Vec<usize>,
        devices: Vec<B::Device>,
        pools: Vec<rayon::ThreadPool>,
        placement: Placement,
    ) -> Result<Self, BuildError> {
        let modules = model.split(&cuts).map_err(|e| BuildError::Mismatch(format!("`cuts`: {e}")))?;
        let stages: Vec<Stage<B>> = modules.into_iter().zip(devices).map(|(m, d)| Stage::new(m, train, d)).collect();
        let snapshot = stages.iter().map(|s| s.module().clone()).collect();
        let codecs = stages.iter().map(|_| StageCodecs::new(&config.compression)).collect();
        let config = config.clone();
        Ok(Self {
            codecs,
            stages,
            pools,
            cuts,
            config,
            train: train.clone(),
            snapshot,
            failed: false,
            policies: Vec::new(),
            placement,
            across: None,
        })
    }

    /// Gives each device a [`StepPolicy`] (one per device, in device order).
    pub fn with_policies(mut self, policies: Vec<Box<dyn StepPolicy<B>>>) -> Result<Self, BuildError> {
        let devices = self.config.stages;
        if policies.len() != devices {
            let message = format!("{devices} stages need {devices} step policies, got {}", policies.len());
            return Err(BuildError::Mismatch(message));
        }
        self.policies = policies;
        Ok(self)
    }

    /// Gives every stage the add-on `make` returns for it, from the stage's place (`AddOnSite`).
    /// `seq`: the tokens of a sample (for the width of each stage's output).
    pub fn with_add_ons(mut self, seq: usize, make: impl Fn(AddOnSite<B>) -> Box<dyn StageAddOn<B>>) -> Self {
        let last = self.stages.len() - 1;
        let widths = self.output_widths(seq);
        let stages = std::mem::take(&mut self.stages);
        self.stages = stages
            .into_iter()
            .zip(widths)
            .enumerate()
            .map(|(s, (stage, width))| {
                let site =
                    AddOnSite { stage: s, last, output_width: width, device: stage.device(), train: &self.train };
                let add_on = make(site);
                stage.with_add_on(add_on)
            })
            .collect();
        self
    }

    /// The width of each stage's output (its last dimension), from a pass of one sample of
    /// `seq` tokens without dropout.
    fn output_widths(&self, seq: usize) -> Vec<usize> {
        let device = self.stages[0].device().clone();
        let tokens = Tensor::<B::InnerBackend, 2, Int>::zeros([1, seq], &device);
        let mask: Tensor<B::InnerBackend, 2, Bool> = tokens.clone().equal_elem(1);
        let mut x = Activation::Tokens(tokens);
        self.stages
            .iter()
            .map(|stage| {
                x = stage.module().valid().fork(&device).forward_activation(x.clone(), &mask);
                match &x {
                    Activation::Sequence(t) => t.dims()[2],
                    Activation::Features(t) => t.dims()[1],
                    Activation::Tokens(t) => t.dims()[1],
                }
            })
            .collect()
    }

    /// The cut points in use (block indices where each stage after the first begins).
    pub fn cuts(&self) -> &[usize] {
        &self.cuts
    }
}

impl<B: AutodiffBackend> Strategy<B> for ModelParallel<B> {
    fn name(&self) -> &str {
        "model-parallel"
    }

    fn devices(&self) -> Vec<String> {
        // Stage `d` (the first of device `d`) runs on device `d`.
        self.placement.local.clone().map(|d| format!("{:?}", self.stages[d].device())).collect()
    }

    fn train_epoch(&mut self, plan: &EpochPlan) -> Result<TrainStats, TrainError> {
        if self.failed {
            return Err(TrainError::Strategy("an earlier epoch failed; the stages are out of step".into()));
        }
        self.snapshot = self.stages.iter().map(|s| s.module().clone()).collect();
        let (train, config, placement) = (&self.train, &self.config, &self.placement);
        let local = placement.local.clone();
        let timeout = Duration::from_secs_f64(config.timeout_seconds);
        let gate = Gate::new(local.len(), plan.interrupt, self.across.is_none());
        let (boundaries, norms, votes) = match &mut self.across {
            Some(a) => (
                Some(&mut a.boundaries[..]),
                Some(a.norms.as_mut() as &mut dyn RankLink),
                Some(a.votes.as_mut() as &mut dyn RankLink),
            ),
            None => (None, None, None),
        };
        let norms = ScalarSum::new("gradient norms", local.clone(), config.stages, norms);
        let votes = ScalarSum::new("sync votes or loss", local.clone(), config.stages, votes);
        let (stop, done) = (AtomicBool::new(false), AtomicBool::new(false));
        let devices: Vec<B::Device> = self.stages.iter().map(|s| s.device().clone()).collect();
        let (ends, relays) = wire_up::<B>(&devices, config.interconnect, placement, boundaries);
        let mut work: Vec<DeviceWork<B>> = local
            .clone()
            .map(|device| DeviceWork {
                device,
                ids: Vec::new(),
                stages: Vec::new(),
                ends: Vec::new(),
                codecs: Vec::new(),
                policy: None,
            })
            .collect();
        for (id, ((stage, ends), codecs)) in self
            .stages
            .iter_mut()
            .zip(ends)
            .zip(self.codecs.iter_mut())
            .enumerate()
            .filter(|(id, _)| placement.runs_stage(*id))
        {
            let device = &mut work[placement.device_of(id) - local.start];
            device.ids.push(id);
            device.stages.push(stage);
            device.ends.push(ends);
            device.codecs.push(codecs);
        }
        for (device, policy) in self.policies.iter_mut().enumerate().filter(|(d, _)| local.contains(d)) {
            work[device - local.start].policy = Some(policy);
        }
        let shared = Shared { plan, train, config, placement, norms: &norms, votes: &votes, stop: &stop, gate: &gate };
        let supervisor = Supervisor {
            kind: "stage",
            // In a multi-process job, a quarter more: a stage's wait on another rank, which may
            // start a step's computation later, fails first and names the rank.
            watchdog: if placement.ranks > 1 { timeout.mul_f64(1.25) } else { timeout },
            stop: &stop,
            progress_from: local.end - 1,
            on_batch: plan.on_batch,
            on_stop: &|| {},
        };
        let pools = &self.pools;
        let run = |mut work: DeviceWork<B>, reporter: &_| {
            let result = pools[work.device - local.start].install(|| work.run(&shared, reporter));
            if result.is_err() {
                work.stages.iter_mut().for_each(|stage| stage.reset());
            }
            result
        };
        let (outcome, relayed) = std::thread::scope(|scope| {
            let relays: Vec<ScopedJoinHandle<_>> = relays
                .into_iter()
                .map(|relay| scope.spawn(|| relay.run(cross_rank_timeout(timeout), &done, &stop)))
                .collect();
            let workers = work.into_iter().map(|w| (w.device, w)).collect();
            let outcome = supervisor
                .run(scope, workers, &run)
                .map_err(|stopped| describe(stopped, placement, timeout, plan.epoch));
            done.store(true, std::sync::atomic::Ordering::SeqCst);
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
                let relayed = &mut epochs[self.placement.device_of(stage) - local.start].relayed;
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
            Ok(epochs) => Ok(self.epoch_stats(&epochs, gate.steps(plan.batches.len()))),
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

    /// Every stage's parameters and optimizer state, and every device's policy state. In a
    /// multi-process job this is the process's own view (its stages' optimizers and policies;
    /// the other stages' parameters as gathered after the point), which it resumes from.
    fn state(&self) -> Result<StateParts, StateError> {
        let mut state = StateParts::default();
        state.put(CUTS, Writer::default().counts(&self.cuts).0.clone());
        for (s, stage) in self.stages.iter().enumerate() {
            state.put(format!("stage.{s}"), stage.state()?.to_bytes());
        }
        for (d, policy) in self.policies.iter().enumerate() {
            state.put(format!("policy.{d}"), policy.state()?);
        }
        if !self.config.compression.is_lossless() {
            for (s, codecs) in self.codecs.iter().enumerate() {
                let mut parts = StateParts::default();
                codecs.state().into_iter().enumerate().for_each(|(i, bytes)| parts.put(i.to_string(), bytes));
                state.put(format!("codecs.{s}"), parts.to_bytes());
            }
        }
        Ok(state)
    }

    fn restore(&mut self, state: &StateParts) -> Result<(), StateError> {
        if let Some(cuts) = checkpoint_cuts(state)?.filter(|c| *c != self.cuts) {
            return Err(StateError::Mismatch(format!(
                "the checkpoint's stages are cut at {cuts:?}, this run's at {:?}",
                self.cuts
            )));
        }
        for (s, stage) in self.stages.iter_mut().enumerate() {
            stage.restore(&StateParts::from_bytes(state.get(&format!("stage.{s}"))?)?)?;
        }
        for (d, policy) in self.policies.iter_mut().enumerate() {
            policy.restore(state.get(&format!("policy.{d}"))?, self.stages[d].device())?;
        }
        if !self.config.compression.is_lossless() {
            for (s, codecs) in self.codecs.iter_mut().enumerate() {
                let parts = StateParts::from_bytes(state.get(&format!("codecs.{s}"))?)?;
                let bytes = (0..4).map(|i| parts.get(&i.to_string())).collect::<Result<Vec<_>, _>>()?;
                codecs.restore(&bytes)?;
            }
        }
        self.snapshot = self.stages.iter().map(|s| s.module().clone()).collect();
        Ok(())
    }
}

/// The part of a checkpoint that holds where the model was cut.
const CUTS: &str = "cuts";

/// Where a checkpointed model-parallel run cut its model (`None` in a checkpoint without the
/// part): a resumed run must cut there too (a balance by time measures anew, and may cut
/// elsewhere).
pub fn checkpoint_cuts(state: &StateParts) -> Result<Option<Vec<usize>>, StateError> {
    match state.get(CUTS) {
        Ok(bytes) => Reader(bytes).counts().map(Some),
        Err(_) => Ok(None),
    }
}

/// Why the epoch stopped, naming the stage (in a multi-process job, the rank of one that went
/// silent).
fn describe(stopped: Stopped, placement: &Placement, timeout: Duration, epoch: usize) -> String {
    let epoch = epoch + 1;
    match stopped {
        Stopped::Failed { worker, step, message } => format!("stage {worker} failed at step {step} of epoch {epoch}: {message}"),
        Stopped::Stalled { laggards, step, after } => {
            format!("stage(s) {laggards:?} made no progress for {} s (stuck at step {step})", after.as_secs_f64())
        }
        Stopped::WaitedInVain { waiter, peer, waiter_steps, peer_steps } => match placement.local.contains(&peer) {
            true => format!(
                "stage {peer} made no progress for {} s (stuck at step {} of epoch {epoch}; stage {waiter} was waiting for it)",
                timeout.as_secs_f64(),
                peer_steps + 1
            ),
            false => format!(
                "stage {peer}, on rank {}, sent nothing for {} s (stage {waiter} was waiting for it at step {} of epoch {epoch}); that rank is stuck or gone",
                peer / placement.per_rank,
                cross_rank_timeout(timeout).as_secs_f64(),
                waiter_steps + 1
            ),
        },
        Stopped::Unreported { worker } => format!("stage {worker} exited without a report"),
    }
}
