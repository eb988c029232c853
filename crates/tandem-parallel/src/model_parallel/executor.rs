//! The executor: runs one device's timetable ([`crate::schedule`]) for every global batch of an
//! epoch — the passes of its stages, the sends and receives between stages, global-norm
//! clipping and the optimizer step — and asks the device's [`StepPolicy`], if any, what each
//! batch does: a real step (the schedule's actions) or a local one (a [`LocalStep`]'s actions).
//! It runs any valid list of actions; what a schedule or a policy decides is not its business.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;
use tandem_models::Activation;
use tandem_train::optim::clip_factor;
use tandem_train::{EpochPlan, TrainConfig};

use super::config::ModelParallelConfig;
use super::figures::DeviceEpoch;
use super::payload::{pack, unpack, Payload, StageCodecs};
use super::policy::{Peers, StepInput, StepPlan, StepPolicy};
use super::relay::Message;
use super::scalar_sum::ScalarSum;
use super::stage::{MicroBatch, Stage};
use super::wire::Wire;
use super::wiring::{Ends, Placement};
use crate::compression::Codec;
use crate::link::{LinkReceiver, LinkSender, RecvError};
use crate::ranks::cross_rank_timeout;
#[cfg(doc)]
use crate::schedule::LocalStep;
use crate::schedule::{Action, OwnInput, Pass};
use crate::shard::shard_ranges;
use crate::supervisor::{Failure, Gate, Reporter};

/// What every device of the run shares.
pub(super) struct Shared<'a, 'l> {
    pub plan: &'a EpochPlan<'a>,
    pub train: &'a TrainConfig,
    pub config: &'a ModelParallelConfig,
    pub placement: &'a Placement,
    /// Squared gradient norms (clipping), and the policies' sums.
    pub norms: &'a ScalarSum<'l>,
    pub votes: &'a ScalarSum<'l>,
    pub stop: &'a AtomicBool,
    /// Where the call ends when asked to stop early.
    pub gate: &'a Gate<'a>,
}

/// One device's part: its stages (in model order, with their global indices, link ends and
/// codecs) and its policy.
pub(super) struct DeviceWork<'a, B: AutodiffBackend> {
    pub device: usize,
    pub ids: Vec<usize>,
    pub stages: Vec<&'a mut Stage<B>>,
    pub ends: Vec<Ends<B>>,
    pub codecs: Vec<&'a mut StageCodecs>,
    pub policy: Option<&'a mut Box<dyn StepPolicy<B>>>,
}

/// Bytes counted for one label sent to a stage that would not have it under vanilla model
/// parallelism (an `i32`, as token ids travel).
pub const LABEL_BYTES: u64 = 4;

/// Values waiting between a pass and a transfer, by (what, stage, micro-batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Slot {
    /// A stage's input, received.
    Input,
    /// A stage's output, to send.
    Output,
    /// The gradient of a stage's output, received.
    OutputGradient,
    /// The gradient of a stage's input, to send.
    InputGradient,
}

/// A global batch as the device runs it.
struct Running<'b> {
    number: usize,
    indices: &'b [usize],
    ranges: Vec<std::ops::Range<usize>>,
}

impl<B: AutodiffBackend> DeviceWork<'_, B> {
    /// Runs the device's part of every global batch of the epoch.
    pub fn run(&mut self, shared: &Shared, reporter: &Reporter<DeviceEpoch>) -> Result<DeviceEpoch, Failure> {
        let started = Instant::now();
        let (plan, config) = (shared.plan, shared.config);
        let mut epoch = DeviceEpoch::new(config.pieces().saturating_sub(1));
        let holds_last = self.ids.last() == Some(&(config.pieces() - 1));
        let mut mailbox = Mailbox::default();
        for (number, batch) in plan.batches.iter().enumerate() {
            if shared.stop.load(Ordering::SeqCst) {
                return Err(Failure::elsewhere("stopped"));
            }
            if !shared.gate.may_begin(self.device - shared.placement.local.start, number) {
                break;
            }
            tandem_ops::dropout::begin_step(plan.rng_seed, self.device, plan.first_step + number);
            let plan_of_step = match self.policy.as_mut() {
                None => StepPlan::Train { replayed: Vec::new() },
                Some(policy) => {
                    let input = StepInput { batch, data: plan.data, last_stage: holds_last, stages: &self.ids };
                    let peers = peers(shared, self.device);
                    let deciding = Instant::now();
                    let decision = policy.begin_step(&mut self.stages, &input, &peers);
                    epoch.add_policy_time(deciding.elapsed(), peers.waited.get());
                    decision.map_err(|e| e.0)?
                }
            };
            let replayed = match plan_of_step {
                StepPlan::Train { replayed } => replayed,
                StepPlan::Local(step) => {
                    let running = Running { number, indices: batch, ranges: shard_ranges(batch.len(), 1) };
                    for action in step.actions(&config.layout(1), self.device) {
                        self.execute(action, &running, &mut mailbox, shared, &mut epoch, reporter)?;
                    }
                    let losses = std::mem::take(&mut mailbox.own_losses);
                    if let Some(policy) = self.policy.as_mut() {
                        policy.after_local(&losses);
                    }
                    // A transfer brings the batch to the last stage, which trains on it.
                    if holds_last && !step.transfer {
                        epoch.skipped_samples += batch.len();
                    }
                    reporter.step(batch.len());
                    continue;
                }
                StepPlan::Skip => {
                    if holds_last {
                        epoch.skipped_samples += batch.len();
                    }
                    reporter.step(batch.len());
                    continue;
                }
            };
            if holds_last {
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
            let loss_before = epoch.loss_sum;
            let micro = config.micro_batches_for(indices.len());
            let running = Running { number, indices, ranges: shard_ranges(indices.len(), micro) };
            for action in config.schedule.actions(&config.layout(micro), self.device) {
                self.execute(action, &running, &mut mailbox, shared, &mut epoch, reporter)?;
            }
            self.update(shared, plan.first_step + number, &mut epoch)?;
            if let Some(policy) = self.policy.as_mut() {
                let loss = holds_last.then(|| (epoch.loss_sum - loss_before) / indices.len() as f64);
                let peers = peers(shared, self.device);
                let recording = Instant::now();
                let recorded = policy.after_update(&self.stages, loss, &peers);
                epoch.add_policy_time(recording.elapsed(), peers.waited.get());
                recorded.map_err(|e| e.0)?;
            }
            reporter.step(batch.len());
        }
        epoch.wall = started.elapsed();
        epoch.control_bytes = self.policy.as_ref().map_or(0, |p| p.control_bytes());
        for (&id, ends) in self.ids.iter().zip(&self.ends) {
            if let Some(link) = &ends.to_next {
                epoch.forward[id] = link.traffic();
            }
            if let Some(link) = &ends.to_previous {
                epoch.backward[id - 1] = link.traffic();
            }
        }
        Ok(epoch)
    }

    /// Where stage `id` sits among the device's stages.
    fn local(&self, id: usize) -> Result<usize, Failure> {
        self.ids.iter().position(|&s| s == id).ok_or_else(|| Failure::own(format!("stage {id} does not run here")))
    }

    /// Runs `action`, unless the run was stopped.
    fn execute(
        &mut self,
        action: Action,
        batch: &Running,
        mailbox: &mut Mailbox<B>,
        shared: &Shared,
        epoch: &mut DeviceEpoch,
        reporter: &Reporter<DeviceEpoch>,
    ) -> Result<(), Failure> {
        if shared.stop.load(Ordering::SeqCst) {
            return Err(Failure::elsewhere("stopped"));
        }
        let last = shared.config.pieces() - 1;
        match action {
            Action::Run(Pass::Forward { stage: id, micro }) => {
                let input = match id {
                    0 => None,
                    _ => Some(mailbox.take(Slot::Input, id, micro)?),
                };
                let rows = &batch.indices[batch.ranges[micro].clone()];
                let k = self.local(id)?;
                let computing = Instant::now();
                let stage = &mut self.stages[k];
                let data = shared.plan.data.batch::<B>(rows, stage.device());
                if let Some(input) = &input {
                    stage.remember(rows, input);
                }
                let input = input.unwrap_or_else(|| Activation::Tokens(data.tokens.inner()));
                let weight = rows.len() as f64 / batch.indices.len() as f64;
                let micro_batch = MicroBatch { mask_pad: &data.mask_pad, labels: data.labels, weight };
                if id == last {
                    let (loss, correct) = stage.forward_loss(micro, input, &micro_batch);
                    epoch.loss_sum += loss * rows.len() as f64;
                    epoch.correct += correct;
                    epoch.samples += rows.len();
                } else {
                    if stage.trains_add_on_in_real_steps() {
                        epoch.label_bytes += rows.len() as u64 * LABEL_BYTES;
                    }
                    let output = stage.forward(micro, input, &micro_batch);
                    mailbox.put(Slot::Output, id, micro, output);
                }
                epoch.compute += computing.elapsed();
                epoch.peak_live = epoch.peak_live.max(self.stages.iter().map(|s| s.live()).sum());
            }
            Action::Run(Pass::Backward { stage: id, micro }) => {
                let grad = match id == last {
                    true => None,
                    false => Some(mailbox.take(Slot::OutputGradient, id, micro)?),
                };
                let k = self.local(id)?;
                let computing = Instant::now();
                let input_grad = self.stages[k].backward(micro, grad).map_err(Failure::own)?;
                epoch.compute += computing.elapsed();
                if let Some(grad) = input_grad {
                    mailbox.put(Slot::InputGradient, id, micro, grad);
                }
            }
            Action::SendActivation { stage: id, micro } => {
                let (value, k) = (mailbox.take(Slot::Output, id, micro)?, self.local(id)?);
                let samples = &batch.indices[batch.ranges[micro].clone()];
                let payload = self.pack(k, true, value, samples, epoch);
                send::<B>(&mut self.ends[k].to_next, batch.number, micro, payload)?;
            }
            Action::SendGradient { stage: id, micro } => {
                let (value, k) = (mailbox.take(Slot::InputGradient, id, micro)?, self.local(id)?);
                let samples = &batch.indices[batch.ranges[micro].clone()];
                let payload = self.pack(k, false, value, samples, epoch);
                send::<B>(&mut self.ends[k].to_previous, batch.number, micro, payload)?;
            }
            Action::ReceiveActivation { stage: id, micro } => {
                let k = self.local(id)?;
                let (link, codec) = (&self.ends[k].from_previous, &mut self.codecs[k].from_previous);
                let device = self.stages[k].device();
                let on = Receiving { link, reporter, codec, device, peer: id - 1, slot: Slot::Input, stage: id };
                let value = mailbox.receive(on, batch, micro, shared, epoch)?;
                mailbox.put(Slot::Input, id, micro, value);
            }
            Action::ReceiveGradient { stage: id, micro } => {
                let k = self.local(id)?;
                let (link, codec) = (&self.ends[k].from_next, &mut self.codecs[k].from_next);
                let device = self.stages[k].device();
                let on =
                    Receiving { link, reporter, codec, device, peer: id + 1, slot: Slot::OutputGradient, stage: id };
                let value = mailbox.receive(on, batch, micro, shared, epoch)?;
                mailbox.put(Slot::OutputGradient, id, micro, value);
            }
            Action::TrainOwn { stage: id, input, sends } => {
                if let Some(output) = self.train_own(id, input, batch, mailbox, shared, epoch)?.filter(|_| sends) {
                    mailbox.put(Slot::Output, id, 0, output);
                }
            }
        }
        Ok(())
    }

    /// `value` as stage `k`'s codec sends it forward (activations) or back (gradients); the
    /// encoding counts as the stage's compute.
    fn pack(
        &mut self,
        k: usize,
        forward: bool,
        value: Wire<B>,
        samples: &[usize],
        epoch: &mut DeviceEpoch,
    ) -> Payload<B> {
        let codec = match forward {
            true => &mut self.codecs[k].to_next,
            false => &mut self.codecs[k].to_previous,
        };
        let encoding = Instant::now();
        let payload = pack::<B>(codec, value, samples);
        epoch.compute += encoding.elapsed();
        payload
    }

    /// Stage `id`'s step on its own loss (see [`Action::TrainOwn`]): on the batch, on the
    /// input just received (kept for replay), or on replayed inputs (none buffered: nothing to
    /// do). Clips by the stage's own gradient norm and applies its update; returns its output
    /// before the last stage.
    fn train_own(
        &mut self,
        id: usize,
        input: OwnInput,
        batch: &Running,
        mailbox: &mut Mailbox<B>,
        shared: &Shared,
        epoch: &mut DeviceEpoch,
    ) -> Result<Option<Wire<B>>, Failure> {
        let (last, k) = (shared.config.pieces() - 1, self.local(id)?);
        let fresh = input != OwnInput::Replayed;
        let (samples, input) = match input {
            OwnInput::Batch => (batch.indices.to_vec(), None),
            OwnInput::Received => {
                let input = mailbox.take(Slot::Input, id, 0)?;
                self.stages[k].remember(batch.indices, &input);
                (batch.indices.to_vec(), Some(input))
            }
            OwnInput::Replayed => match self.stages[k].replay(batch.indices.len()) {
                Some((samples, input)) => (samples, Some(input)),
                None => return Ok(None),
            },
        };
        let computing = Instant::now();
        let stage = &mut self.stages[k];
        let data = shared.plan.data.batch::<B>(&samples, stage.device());
        let input = input.unwrap_or_else(|| Activation::Tokens(data.tokens.inner()));
        let micro_batch = MicroBatch { mask_pad: &data.mask_pad, labels: data.labels, weight: 1.0 };
        let own = stage.train_own(input, &micro_batch, id == last).map_err(Failure::own)?;
        mailbox.own_losses.push((id, own.loss));
        let scale = match shared.train.grad_clip_norm {
            Some(max_norm) => clip_factor(stage.squared_gradient_norm().sqrt(), max_norm),
            None => 1.0,
        };
        stage.step(shared.train, scale, shared.plan.first_step + batch.number, shared.plan.total_steps);
        epoch.compute += computing.elapsed();
        match (id == last, fresh) {
            (true, true) => {
                epoch.loss_sum += own.loss * samples.len() as f64;
                epoch.correct += own.correct;
                epoch.samples += samples.len();
            }
            (true, false) => epoch.own_replayed += samples.len(),
            // Counted at every use, replays included: the most a stage could need to receive.
            (false, _) => epoch.label_bytes += samples.len() as u64 * LABEL_BYTES,
        }
        Ok(own.output)
    }

    /// Clips by the global norm over every device's gradients and applies them.
    fn update(&mut self, shared: &Shared, step: usize, epoch: &mut DeviceEpoch) -> Result<(), Failure> {
        let scale = match shared.train.grad_clip_norm {
            None => 1.0,
            Some(max_norm) => {
                let computing = Instant::now();
                let squared: f64 = self.stages.iter_mut().map(|s| s.squared_gradient_norm()).sum();
                epoch.compute += computing.elapsed();
                let waiting = Instant::now();
                let total = shared.norms.sum(self.device, squared, timeout(shared), shared.stop)?;
                epoch.idle += waiting.elapsed();
                clip_factor(total.sqrt(), max_norm)
            }
        };
        if let Some(policy) = self.policy.as_mut() {
            let predicting = Instant::now();
            policy.before_update(&self.stages);
            epoch.predict += predicting.elapsed();
        }
        let computing = Instant::now();
        for stage in &mut self.stages {
            stage.step(shared.train, scale, step, shared.plan.total_steps);
        }
        epoch.compute += computing.elapsed();
        Ok(())
    }
}

/// The policies' line to the other devices.
fn peers<'a, 'l>(shared: &Shared<'a, 'l>, device: usize) -> Peers<'a, 'l> {
    Peers { sum: shared.votes, device, timeout: timeout(shared), stop: shared.stop, waited: Cell::new(Duration::ZERO) }
}

fn timeout(shared: &Shared) -> Duration {
    Duration::from_secs_f64(shared.config.timeout_seconds)
}

fn send<B: AutodiffBackend>(
    link: &mut Option<LinkSender<Message<B>>>,
    batch: usize,
    micro: usize,
    payload: Payload<B>,
) -> Result<(), Failure> {
    let link = link.as_mut().ok_or_else(|| Failure::own("send on a link that does not exist"))?;
    let bytes = payload.bytes();
    link.send((batch, micro, payload), bytes).map_err(|e| Failure::elsewhere(e.to_string()))
}

/// Where a receive comes from: a stage's link end and codec, the stage that sends on it, and
/// the slot the value fills.
struct Receiving<'r, B: AutodiffBackend> {
    link: &'r Option<LinkReceiver<Message<B>>>,
    /// Told while the receive waits (a waiting stage is not the one to blame for a stall).
    reporter: &'r Reporter<DeviceEpoch>,
    codec: &'r mut Codec,
    device: &'r B::Device,
    peer: usize,
    slot: Slot,
    stage: usize,
}

/// The values between passes and transfers, messages that arrived before they were due, and
/// the losses of a local step's stages (in model order, for the policy).
struct Mailbox<B: AutodiffBackend> {
    slots: HashMap<(Slot, usize, usize), Wire<B>>,
    early: HashMap<(Slot, usize, usize), Wire<B>>,
    own_losses: Vec<(usize, f64)>,
}

impl<B: AutodiffBackend> Default for Mailbox<B> {
    fn default() -> Self {
        Self { slots: HashMap::new(), early: HashMap::new(), own_losses: Vec::new() }
    }
}

impl<B: AutodiffBackend> Mailbox<B> {
    fn put(&mut self, slot: Slot, stage: usize, micro: usize, value: Wire<B>) {
        self.slots.insert((slot, stage, micro), value);
    }

    fn take(&mut self, slot: Slot, stage: usize, micro: usize) -> Result<Wire<B>, Failure> {
        self.slots.remove(&(slot, stage, micro)).ok_or_else(|| {
            Failure::own(format!("the schedule uses {slot:?} of stage {stage}, micro-batch {micro}, before it exists"))
        })
    }

    /// The message for (`batch`, `micro`) from the stage `on` names, decoded, adding the wait to
    /// `epoch`. Messages of the same batch for later micro-batches are decoded as they arrive
    /// (in the order they were encoded) and kept until asked for.
    fn receive(
        &mut self,
        on: Receiving<B>,
        batch: &Running,
        micro: usize,
        shared: &Shared,
        epoch: &mut DeviceEpoch,
    ) -> Result<Wire<B>, Failure> {
        let Receiving { link, reporter, codec, device, peer, slot, stage } = on;
        if let Some(value) = self.early.remove(&(slot, stage, micro)) {
            return Ok(value);
        }
        let link = link.as_ref().ok_or_else(|| Failure::own("receive on a link that does not exist"))?;
        let peer_device = shared.placement.device_of(peer);
        let timeout = match shared.placement.local.contains(&peer_device) {
            true => timeout(shared),
            false => cross_rank_timeout(timeout(shared)),
        };
        loop {
            reporter.waiting_for(Some(peer_device));
            let received = link.recv(timeout, shared.stop);
            reporter.waiting_for(None);
            let ((b, m, payload), wait) = received.map_err(|e| Failure {
                waited_for: matches!(e, RecvError::Timeout(_)).then_some(peer_device),
                ..Failure::elsewhere(format!("{e} from stage {peer}"))
            })?;
            epoch.idle += wait.idle;
            epoch.transfer += wait.transfer;
            if b != batch.number || m >= batch.ranges.len() {
                return Err(Failure::own(format!(
                    "expected micro-batch {micro} of batch {}, received {m} of {b}",
                    batch.number
                )));
            }
            let decoding = Instant::now();
            let samples = &batch.indices[batch.ranges[m].clone()];
            let value = unpack::<B>(codec, payload, samples, device)
                .map_err(|e| Failure::own(format!("a message from stage {peer}: {e}")))?;
            epoch.compute += decoding.elapsed();
            if m == micro {
                return Ok(value);
            }
            self.early.insert((slot, stage, m), value);
        }
    }
}
