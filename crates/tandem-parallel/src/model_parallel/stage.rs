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

use super::local::Local;
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
    /// The auxiliary head's leaves and its weighted loss, when a real step trains it too.
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
    /// Local learning (absent: vanilla model parallelism).
    local: Option<Local<B>>,
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
            local: None,
        }
    }

    /// The stage with local learning: an auxiliary `head` (stages before the last) whose loss
    /// weighs `aux_weight` in real steps, and a replay buffer of `replay_samples` received
    /// samples (stages after the first; 0: none).
    pub fn with_local(
        mut self,
        head: Option<Classifier<B>>,
        aux_weight: f64,
        replay_samples: usize,
        train: &TrainConfig,
    ) -> Self {
        let head = head.map(|h| h.fork(&self.device));
        self.local = Some(Local::new(head, aux_weight, replay_samples, train));
        self
    }

    /// Parameters of the auxiliary head (0 without one).
    pub fn aux_parameters(&self) -> usize {
        self.head().map_or(0, |h| h.parameter_count())
    }

    /// Whether real steps train the auxiliary head too (its loss has a weight), so the stage
    /// needs the labels.
    pub fn trains_aux_in_real_steps(&self) -> bool {
        self.local.as_ref().and_then(|l| l.head.as_ref()).is_some_and(|h| h.weight != 0.0)
    }

    fn head(&self) -> Option<&Classifier<B>> {
        self.local.as_ref()?.head.as_ref()?.module.as_ref()
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
    /// auxiliary head whose loss has a weight, the head's loss joins this micro-batch's backward.
    pub fn forward(&mut self, micro: usize, input: Wire<B>, batch: &MicroBatch<B>) -> Wire<B> {
        let input = attach::<B>(input, &self.device);
        let module = fresh_leaves(self.module());
        let output = module.forward_activation(input.clone(), batch.mask_pad);
        let sent = detach::<B>(output.clone());
        let aux = match self.local.as_ref().and_then(|l| l.head.as_ref()).filter(|h| h.weight != 0.0) {
            Some(head) => {
                let leaves = fresh_leaves(head.module.as_ref().expect(HELD));
                let logits = leaves.forward_activation(output.clone(), batch.mask_pad).into_features();
                let loss = tandem_train::loss(logits, batch.labels.clone()).mul_scalar(batch.weight * head.weight);
                Some((leaves, loss))
            }
            None => None,
        };
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
    /// learning): the task loss on the last stage (`last`), the auxiliary head's loss before it.
    /// Accumulates the gradients for [`Stage::step`].
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
                let head = self.head().ok_or("a stage before the last needs an auxiliary head to learn locally")?;
                let leaves = fresh_leaves(head);
                let logits = leaves.forward_activation(output.clone(), batch.mask_pad).into_features();
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

    /// Adds a backward pass's gradients to the stage's (and its head's).
    fn accumulate(&mut self, module: &Classifier<B>, head: Option<&Classifier<B>>, grads: &mut B::Gradients) {
        if let (Some(leaves), Some(h)) = (head, self.local.as_mut().and_then(|l| l.head.as_mut())) {
            h.grads.accumulate(leaves, GradientsParams::from_module(grads, leaves));
            h.touched = true;
        }
        self.grads.accumulate(module, GradientsParams::from_module(grads, module));
    }

    /// Bytes of the inputs this stage keeps for replay.
    pub fn replay_bytes(&self) -> usize {
        self.local.as_ref().map_or(0, |local| local.held_bytes())
    }

    /// Keeps an input this stage received (its `samples`) for replay, if it replays.
    pub fn remember(&mut self, samples: &[usize], input: &Wire<B>) {
        if let Some(local) = &mut self.local {
            local.remember(samples, input);
        }
    }

    /// About `samples` buffered received samples to train on again, with their sample indices;
    /// `None` when nothing is buffered.
    pub fn replay(&mut self, samples: usize) -> Option<(Vec<usize>, Wire<B>)> {
        self.local.as_mut()?.replay(samples)
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
        let head = match self.local.as_mut().and_then(|l| l.head.as_mut()).filter(|h| h.touched) {
            Some(h) => {
                let (module, grads) = (h.module.as_ref().expect(HELD), h.grads.grads());
                let norm = optim::gradient_norm(module, &grads);
                h.grads.accumulate(module, grads);
                norm * norm
            }
            None => 0.0,
        };
        norm * norm + head
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
        if let Some(h) = self.local.as_mut().and_then(|l| l.head.as_mut()).filter(|h| h.touched) {
            let (module, mut grads) = (h.module.take().expect(HELD), h.grads.grads());
            if scale != 1.0 {
                optim::scale_gradients(&module, &mut grads, scale);
            }
            h.module = Some(h.optimizer.step(lr, module, grads));
            h.touched = false;
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
        if let Some(local) = &self.local {
            state.put("local", local.state()?.to_bytes());
        }
        Ok(state)
    }

    /// Continues from [`Stage::state`]'s parts.
    pub(crate) fn restore(&mut self, state: &StateParts) -> Result<(), StateError> {
        let module = self.module.take().expect(HELD);
        self.module = Some(load_model_bytes(module, state.get("module")?, &self.device)?);
        self.optimizer.restore(&StateParts::from_bytes(state.get("optimizer")?)?, &self.device)?;
        match &mut self.local {
            Some(local) => local.restore(&StateParts::from_bytes(state.get("local")?)?, &self.device),
            None => Ok(()),
        }
    }

    /// Drops any half-finished micro-batches and gradients (after a failure elsewhere).
    pub fn reset(&mut self) {
        self.pending.clear();
        self.grads.grads();
        if let Some(h) = self.local.as_mut().and_then(|l| l.head.as_mut()) {
            h.grads.grads();
            h.touched = false;
        }
    }
}

/// The stage's parameters as new autodiff leaves (same values, same parameter ids).
///
/// Each micro-batch's graph gets its own leaves, so graphs alive at the same time share no
/// node. burn-autodiff 0.21 loses steps when several live graphs share parameter leaves that an
/// optimizer step has replaced ("Node should have a step registered" on a later backward pass).
fn fresh_leaves<B: AutodiffBackend>(module: &Classifier<B>) -> Classifier<B> {
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
