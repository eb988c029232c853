//! A pipeline stage: *what* runs on one device — a contiguous slice of the model's blocks, its
//! optimizer, and the forward / backward pass of one micro-batch. When each pass runs is the
//! schedule's business ([`crate::schedule`]).
//!
//! The autodiff graph is cut at every stage boundary: a stage's input is a fresh leaf
//! (`require_grad`) holding the upstream stage's output values, and the upstream backward is
//! seeded with `(output · received_gradient).sum()`, whose gradient with respect to `output` is
//! exactly the received gradient. Chained, the stages compute the uncut model's gradients.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Bool, Int, Tensor};
use tandem_models::{Activation, Classifier};
use tandem_train::checkpoint::{load_model_bytes, model_bytes};
use tandem_train::optim::{self, AnyOptimizer};
use tandem_train::{StateError, StateParts, TrainConfig};

use super::wire::Wire;

const HELD: &str = "a stage holds its module between optimizer steps";

/// A micro-batch waiting for its backward pass.
struct Pending<B: AutodiffBackend> {
    /// The parameters this micro-batch's graph was built on (see [`fresh_leaves`]).
    module: Classifier<B>,
    /// The stage's input leaf (absent on the first stage, whose input is token ids).
    input: Option<Activation<B>>,
    /// What the backward pass starts from: the stage's output, or the loss on the last stage.
    output: Output<B>,
    /// The add-on's leaves and its weighted loss, when a real step trains it too.
    aux: Option<(Classifier<B>, Tensor<B, 1>)>,
}

/// A micro-batch as a stage sees it besides its input: the padding mask, the labels, and its
/// share of the global batch (its loss is scaled by it, so micro-batches add up to the batch).
pub struct MicroBatch<'a, B: AutodiffBackend> {
    pub mask_pad: &'a Tensor<B, 2, Bool>,
    pub labels: Tensor<B, 1, Int>,
    pub weight: f64,
}

/// What a stage's step on its own loss gives: the mean loss, the samples classified correctly,
/// and (before the last stage) the output to send on.
pub struct OwnStep<B: AutodiffBackend> {
    pub loss: f64,
    pub correct: usize,
    pub output: Option<Wire<B>>,
}

/// What a stage may carry besides its blocks and optimizer: a protocol's learning of its own,
/// such as local learning's auxiliary head and replay buffer (`tandem-sync`). The stage asks it
/// for a loss of its own, hands it its gradients, steps it and checkpoints it; the executor and
/// the schedules know nothing of what it holds. Its parameters, if any, are a [`Classifier`] (a
/// head on the stage's output), computed on fresh leaves at each pass.
pub trait StageAddOn<B: AutodiffBackend>: Send {
    /// Parameters of its own, reported with the stage's.
    fn parameters(&self) -> usize;
    /// Whether a real step's forward pass adds a loss of its own (which needs the labels).
    fn adds_loss_in_real_steps(&self) -> bool;
    /// In a real step, the loss it adds to the backward pass of the stage's `output`, already
    /// weighted (the micro-batch's share included), with the leaves it was computed on; `None`
    /// where it adds none.
    fn real_step_loss(&self, output: Activation<B>, batch: &MicroBatch<B>) -> Option<(Classifier<B>, Tensor<B, 1>)>;
    /// In a local step of a stage before the last, the logits its own loss is taken on, with
    /// the leaves they were computed on; `None` where it has no head.
    fn own_logits(&self, output: Activation<B>, batch: &MicroBatch<B>) -> Option<(Classifier<B>, Tensor<B, 2>)>;
    /// Takes its parameters' gradients from a backward pass through `leaves`.
    fn accumulate(&mut self, leaves: &Classifier<B>, grads: &mut B::Gradients);
    /// Squared L2 norm of the gradients it holds since its last step (0 without any).
    fn squared_gradient_norm(&mut self) -> f64;
    /// Applies its gradients, multiplied by `scale`, at learning rate `lr`, and clears them.
    fn step(&mut self, lr: f64, scale: f64);
    /// Drops half-finished gradients (after a failure elsewhere).
    fn reset(&mut self);
    /// An input the stage received (its `samples`), to keep if it replays.
    fn remember(&mut self, samples: &[usize], input: &Wire<B>);
    /// About `samples` kept inputs to train on again, with their sample indices.
    fn replay(&mut self, samples: usize) -> Option<(Vec<usize>, Wire<B>)>;
    /// Bytes of the inputs it keeps.
    fn held_bytes(&self) -> usize;
    /// Its state between steps, for a checkpoint.
    fn state(&self) -> Result<StateParts, StateError>;
    /// Continues from [`StageAddOn::state`]'s parts, with tensors on `device`.
    fn restore(&mut self, state: &StateParts, device: &B::Device) -> Result<(), StateError>;
}

enum Output<B: AutodiffBackend> {
    Activation(Activation<B>),
    Loss(Tensor<B, 1>),
}

/// One stage of a model-parallel pipeline.
pub struct Stage<B: AutodiffBackend> {
    /// `None` only while an optimizer step is in progress (or after it failed).
    module: Option<Classifier<B>>,
    optimizer: AnyOptimizer<Classifier<B>, B>,
    device: B::Device,
    pending: HashMap<usize, Pending<B>>,
    grads: GradientsAccumulator<Classifier<B>>,
    /// A protocol's learning of its own (absent: vanilla model parallelism).
    add_on: Option<Box<dyn StageAddOn<B>>>,
}

impl<B: AutodiffBackend> Stage<B> {
    /// A stage computing `module` on `device`, with its own optimizer state.
    pub fn new(module: Classifier<B>, train: &TrainConfig, device: B::Device) -> Self {
        Self {
            optimizer: AnyOptimizer::for_model(train, &module),
            module: Some(module.fork(&device)),
            device,
            pending: HashMap::new(),
            grads: GradientsAccumulator::new(),
            add_on: None,
        }
    }

    /// The stage carrying `add_on` (its tensors on the stage's device).
    pub fn with_add_on(mut self, add_on: Box<dyn StageAddOn<B>>) -> Self {
        self.add_on = Some(add_on);
        self
    }

    /// Parameters of the add-on (0 without one).
    pub fn add_on_parameters(&self) -> usize {
        self.add_on.as_ref().map_or(0, |a| a.parameters())
    }

    /// Whether real steps train the add-on too (it adds a loss), so the stage needs the labels.
    pub fn trains_add_on_in_real_steps(&self) -> bool {
        self.add_on.as_ref().is_some_and(|a| a.adds_loss_in_real_steps())
    }

    /// The device the stage computes on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The stage's blocks and parameters.
    pub fn module(&self) -> &Classifier<B> {
        self.module.as_ref().expect(HELD)
    }

    /// Forward pass of micro-batch `micro` on a stage that is not the last: `input` is the token
    /// ids (first stage) or the upstream stage's output; returns the output to send on. With an
    /// add-on that adds a loss in real steps, that loss joins this micro-batch's backward.
    pub fn forward(&mut self, micro: usize, input: Wire<B>, batch: &MicroBatch<B>) -> Wire<B> {
        let input = attach::<B>(input, &self.device);
        let module = fresh_leaves(self.module());
        let output = module.forward_activation(input.clone(), batch.mask_pad);
        let sent = detach::<B>(output.clone());
        let aux = self.add_on.as_ref().and_then(|a| a.real_step_loss(output.clone(), batch));
        self.pending
            .insert(micro, Pending { module, input: trainable(input), output: Output::Activation(output), aux });
        sent
    }

    /// Forward pass of micro-batch `micro` on the last stage, up to the loss. The loss is the
    /// micro-batch's mean cross-entropy scaled by its `weight` (its share of the global batch), so
    /// that the micro-batches' gradients add up to the global batch's. Returns the unscaled loss
    /// and how many samples the logits classify correctly.
    pub fn forward_loss(&mut self, micro: usize, input: Wire<B>, batch: &MicroBatch<B>) -> (f64, usize) {
        let input = attach::<B>(input, &self.device);
        let module = fresh_leaves(self.module());
        let logits = module.forward_activation(input.clone(), batch.mask_pad).into_features();
        let correct = tandem_train::correct_predictions(logits.clone(), batch.labels.clone());
        let loss = tandem_train::loss(logits, batch.labels.clone());
        let value: f64 = burn::tensor::ElementConversion::elem(loss.clone().into_scalar());
        let output = Output::Loss(loss.mul_scalar(batch.weight));
        self.pending.insert(micro, Pending { module, input: trainable(input), output, aux: None });
        (value, correct)
    }

    /// A step on the stage's own loss, with no gradient to or from another stage (local
    /// learning): the task loss on the last stage (`last`), the add-on's (its auxiliary head's)
    /// before it. Accumulates the gradients for [`Stage::step`].
    pub(crate) fn train_own(
        &mut self,
        input: Wire<B>,
        batch: &MicroBatch<B>,
        last: bool,
    ) -> Result<OwnStep<B>, String> {
        let input = attach_values::<B>(input, &self.device);
        let module = fresh_leaves(self.module());
        let output = module.forward_activation(input, batch.mask_pad);
        let (head, sent, logits) = match last {
            true => (None, None, output.into_features()),
            false => {
                let (leaves, logits) = self
                    .add_on
                    .as_ref()
                    .and_then(|a| a.own_logits(output.clone(), batch))
                    .ok_or("a stage before the last needs an auxiliary head to learn locally")?;
                (Some(leaves), Some(detach::<B>(output)), logits)
            }
        };
        let correct = tandem_train::correct_predictions(logits.clone(), batch.labels.clone());
        let loss = tandem_train::loss(logits, batch.labels.clone());
        let value: f64 = burn::tensor::ElementConversion::elem(loss.clone().into_scalar());
        let mut grads = loss.mul_scalar(batch.weight).backward();
        self.accumulate(&module, head.as_ref(), &mut grads);
        Ok(OwnStep { loss: value, correct, output: sent })
    }

    /// Adds a backward pass's gradients to the stage's (and its add-on's, through `leaves`).
    fn accumulate(&mut self, module: &Classifier<B>, leaves: Option<&Classifier<B>>, grads: &mut B::Gradients) {
        if let (Some(leaves), Some(add_on)) = (leaves, self.add_on.as_mut()) {
            add_on.accumulate(leaves, grads);
        }
        self.grads.accumulate(module, GradientsParams::from_module(grads, module));
    }

    /// Bytes of the inputs the stage's add-on keeps (for replay).
    pub fn held_bytes(&self) -> usize {
        self.add_on.as_ref().map_or(0, |a| a.held_bytes())
    }

    /// Keeps an input this stage received (its `samples`), if its add-on replays.
    pub fn remember(&mut self, samples: &[usize], input: &Wire<B>) {
        if let Some(add_on) = &mut self.add_on {
            add_on.remember(samples, input);
        }
    }

    /// About `samples` kept received samples to train on again, with their sample indices;
    /// `None` when nothing is kept.
    pub fn replay(&mut self, samples: usize) -> Option<(Vec<usize>, Wire<B>)> {
        self.add_on.as_mut()?.replay(samples)
    }

    /// Backward pass of micro-batch `micro`: `grad` is the gradient of the loss with respect to
    /// this stage's output (`None` on the last stage). Accumulates the parameters' gradients and
    /// returns the gradient with respect to the stage's input (`None` on the first stage).
    pub(crate) fn backward(&mut self, micro: usize, grad: Option<Wire<B>>) -> Result<Option<Wire<B>>, String> {
        let pending =
            self.pending.remove(&micro).ok_or_else(|| format!("backward of micro-batch {micro} before its forward"))?;
        let seed = match (pending.output, grad) {
            (Output::Loss(loss), None) => loss,
            (Output::Activation(output), Some(grad)) => seed::<B>(output, attach_values::<B>(grad, &self.device)),
            _ => return Err("a stage's backward got a gradient that does not match its place in the pipeline".into()),
        };
        let (head, seed) = match pending.aux {
            Some((head, aux_loss)) => (Some(head), seed + aux_loss),
            None => (None, seed),
        };
        let mut grads = seed.backward();
        let input_grad = pending.input.as_ref().map(|input| input_gradient::<B>(input, &grads)).transpose()?;
        self.accumulate(&pending.module, head.as_ref(), &mut grads);
        Ok(input_grad)
    }

    /// Micro-batches whose backward pass is still due.
    pub fn live(&self) -> usize {
        self.pending.len()
    }

    /// Squared L2 norm of the gradients accumulated so far (for global-norm clipping).
    pub fn squared_gradient_norm(&mut self) -> f64 {
        let module = self.module.as_ref().expect(HELD);
        let grads = self.grads.grads();
        let norm = optim::gradient_norm(module, &grads);
        self.grads.accumulate(module, grads);
        let add_on = self.add_on.as_mut().map_or(0.0, |a| a.squared_gradient_norm());
        norm * norm + add_on
    }

    /// Applies the accumulated gradients, multiplied by `scale` (global-norm clipping), with the
    /// learning rate of optimizer step `step` of `total_steps`, and clears them.
    pub fn step(&mut self, train: &TrainConfig, scale: f64, step: usize, total_steps: usize) {
        let module = self.module.take().expect(HELD);
        let mut grads = self.grads.grads();
        if scale != 1.0 {
            optim::scale_gradients(&module, &mut grads, scale);
        }
        let lr = optim::learning_rate(train, step, total_steps);
        self.module = Some(self.optimizer.step(lr, module, grads));
        if let Some(add_on) = self.add_on.as_mut() {
            add_on.step(lr, scale);
        }
    }

    /// Replaces the parameters through `mapper` between steps. Parameter ids are kept, so the
    /// optimizer state stays with its parameters.
    pub fn map_parameters(&mut self, mapper: &mut impl ModuleMapper<B>) {
        let module = self.module.take().expect(HELD);
        self.module = Some(module.map(mapper));
    }

    /// Sets the parameters to `values` (in [`Classifier::parameter_values`] order) between
    /// steps, keeping their ids.
    pub(crate) fn set_parameter_values(&mut self, values: &[f32]) {
        let module = self.module.take().expect(HELD);
        self.module = Some(module.with_parameter_values(values));
    }

    /// The stage's parameters and optimizer state, between steps.
    pub(crate) fn state(&self) -> Result<StateParts, StateError> {
        let mut state = StateParts::default();
        state.put("module", model_bytes(self.module())?);
        state.put("optimizer", self.optimizer.state()?.to_bytes());
        if let Some(add_on) = &self.add_on {
            state.put("local", add_on.state()?.to_bytes());
        }
        Ok(state)
    }

    /// Continues from [`Stage::state`]'s parts.
    pub(crate) fn restore(&mut self, state: &StateParts) -> Result<(), StateError> {
        let module = self.module.take().expect(HELD);
        self.module = Some(load_model_bytes(module, state.get("module")?, &self.device)?);
        self.optimizer.restore(&StateParts::from_bytes(state.get("optimizer")?)?, &self.device)?;
        match &mut self.add_on {
            Some(add_on) => add_on.restore(&StateParts::from_bytes(state.get("local")?)?, &self.device),
            None => Ok(()),
        }
    }

    /// Drops any half-finished micro-batches and gradients (after a failure elsewhere).
    pub fn reset(&mut self) {
        self.pending.clear();
        self.grads.grads();
        if let Some(add_on) = self.add_on.as_mut() {
            add_on.reset();
        }
    }
}

/// The stage's parameters as new autodiff leaves (same values, same parameter ids).
///
/// Each micro-batch's graph gets its own leaves, so graphs alive at the same time share no
/// node. burn-autodiff 0.21 loses steps when several live graphs share parameter leaves that an
/// optimizer step has replaced ("Node should have a step registered" on a later backward pass).
pub fn fresh_leaves<B: AutodiffBackend>(module: &Classifier<B>) -> Classifier<B> {
    struct Fresh;
    impl<B: AutodiffBackend> ModuleMapper<B> for Fresh {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            param.map(|t| if t.is_require_grad() { t.detach().require_grad() } else { t })
        }
    }
    module.clone().map(&mut Fresh)
}

/// The stage's input as an autodiff activation: token ids as they are, features as a fresh
/// leaf that records its gradient (the cut in the graph).
fn attach<B: AutodiffBackend>(value: Wire<B>, device: &B::Device) -> Activation<B> {
    match attach_values::<B>(value, device) {
        Activation::Sequence(t) => Activation::Sequence(t.require_grad()),
        Activation::Features(t) => Activation::Features(t.require_grad()),
        tokens => tokens,
    }
}

/// A wire value on `device` as an autodiff activation that records nothing.
fn attach_values<B: AutodiffBackend>(value: Wire<B>, device: &B::Device) -> Activation<B> {
    match value.to_device(device) {
        Activation::Tokens(t) => Activation::Tokens(Tensor::from_inner(t)),
        Activation::Sequence(t) => Activation::Sequence(Tensor::from_inner(t)),
        Activation::Features(t) => Activation::Features(Tensor::from_inner(t)),
    }
}

/// The values of an autodiff activation, for sending.
fn detach<B: AutodiffBackend>(value: Activation<B>) -> Wire<B> {
    match value {
        Activation::Tokens(t) => Activation::Tokens(t.inner()),
        Activation::Sequence(t) => Activation::Sequence(t.inner()),
        Activation::Features(t) => Activation::Features(t.inner()),
    }
}

/// The input leaf whose gradient goes upstream, if the input is differentiable.
fn trainable<B: AutodiffBackend>(input: Activation<B>) -> Option<Activation<B>> {
    match input {
        Activation::Tokens(_) => None,
        features => Some(features),
    }
}

/// `(output · grad).sum()`: its backward pass gives every upstream tensor the gradient it
/// would have had in the uncut graph.
fn seed<B: AutodiffBackend>(output: Activation<B>, grad: Activation<B>) -> Tensor<B, 1> {
    match (output, grad) {
        (Activation::Sequence(y), Activation::Sequence(g)) => (y * g).sum(),
        (Activation::Features(y), Activation::Features(g)) => (y * g).sum(),
        (y, g) => panic!("gradient of a {} for an output of a {}", g.kind(), y.kind()),
    }
}

fn input_gradient<B: AutodiffBackend>(input: &Activation<B>, grads: &B::Gradients) -> Result<Wire<B>, String> {
    let missing = || "the stage's input received no gradient".to_string();
    Ok(match input {
        Activation::Sequence(x) => Activation::Sequence(x.grad(grads).ok_or_else(missing)?),
        Activation::Features(x) => Activation::Features(x.grad(grads).ok_or_else(missing)?),
        Activation::Tokens(_) => return Err("token ids have no gradient".into()),
    })
}
