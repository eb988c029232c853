//! What a stage keeps to learn between real (end-to-end) steps, as its add-on
//! ([`tandem_parallel::StageAddOn`]): an auxiliary head with its own optimizer, so that a stage
//! before the last has a loss of its own (local learning), and a bounded buffer of the inputs a
//! stage after the first received at real or transfer steps, to train on them again later
//! without a transfer (features replay).

use std::collections::VecDeque;

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use tandem_models::{Activation, AuxHeadConfig, Classifier};
use tandem_parallel::{fresh_leaves, AddOnSite, MicroBatch, StageAddOn, Wire};
use tandem_train::bytes::{Reader, Writer};
use tandem_train::checkpoint::{load_model_bytes, model_bytes};
use tandem_train::optim::{self, AnyOptimizer};
use tandem_train::{StateError, StateParts};

const HELD: &str = "a head holds its module between optimizer steps";

/// An auxiliary classifier on a stage's output, trained with the stage.
struct AuxHead<B: AutodiffBackend> {
    /// `None` only during an optimizer step.
    module: Option<Classifier<B>>,
    optimizer: AnyOptimizer<Classifier<B>, B>,
    grads: GradientsAccumulator<Classifier<B>>,
    /// Whether `grads` holds anything since the last step.
    touched: bool,
    /// Weight of its loss in a real step's backward pass (0: the stage's gradients are vanilla's).
    weight: f64,
}

/// A stage's local learning (see the module docs).
pub struct LocalStage<B: AutodiffBackend> {
    head: Option<AuxHead<B>>,
    /// Received inputs and their samples, oldest first, holding at most `capacity` samples.
    buffer: VecDeque<(Vec<usize>, Wire<B>)>,
    capacity: usize,
    /// The next buffered input to replay.
    cursor: usize,
}

impl<B: AutodiffBackend> LocalStage<B> {
    /// Local learning at `site`: an auxiliary head (`aux_head`, stages before the last) whose
    /// loss weighs `aux_weight` in real steps, and a replay buffer of `replay_samples` received
    /// samples (stages after the first; 0: none).
    pub fn new(site: AddOnSite<B>, aux_head: &AuxHeadConfig, aux_weight: f64, replay_samples: usize) -> Self {
        let head = (site.stage < site.last).then(|| {
            let module = aux_head.init(site.output_width, tandem_data::NUM_CLASSES, site.device);
            let module = tandem_train::number_parameters(module).fork(site.device);
            AuxHead {
                optimizer: AnyOptimizer::for_model(site.train, &module),
                module: Some(module),
                grads: GradientsAccumulator::new(),
                touched: false,
                weight: aux_weight,
            }
        });
        let capacity = if site.stage > 0 { replay_samples } else { 0 };
        Self { head, buffer: VecDeque::new(), capacity, cursor: 0 }
    }

    fn head_module(&self) -> Option<&Classifier<B>> {
        self.head.as_ref()?.module.as_ref()
    }

    fn buffered(&self) -> usize {
        self.buffer.iter().map(|(s, _)| s.len()).sum()
    }
}

impl<B: AutodiffBackend> StageAddOn<B> for LocalStage<B> {
    fn parameters(&self) -> usize {
        self.head_module().map_or(0, |h| h.parameter_count())
    }

    fn adds_loss_in_real_steps(&self) -> bool {
        self.head.as_ref().is_some_and(|h| h.weight != 0.0)
    }

    fn real_step_loss(&self, output: Activation<B>, batch: &MicroBatch<B>) -> Option<(Classifier<B>, Tensor<B, 1>)> {
        let head = self.head.as_ref().filter(|h| h.weight != 0.0)?;
        let leaves = fresh_leaves(head.module.as_ref().expect(HELD));
        let logits = leaves.forward_activation(output, batch.mask_pad).into_features();
        let loss = tandem_train::loss(logits, batch.labels.clone()).mul_scalar(batch.weight * head.weight);
        Some((leaves, loss))
    }

    fn own_logits(&self, output: Activation<B>, batch: &MicroBatch<B>) -> Option<(Classifier<B>, Tensor<B, 2>)> {
        let leaves = fresh_leaves(self.head_module()?);
        let logits = leaves.forward_activation(output, batch.mask_pad).into_features();
        Some((leaves, logits))
    }

    fn accumulate(&mut self, leaves: &Classifier<B>, grads: &mut B::Gradients) {
        if let Some(h) = self.head.as_mut() {
            h.grads.accumulate(leaves, GradientsParams::from_module(grads, leaves));
            h.touched = true;
        }
    }

    fn squared_gradient_norm(&mut self) -> f64 {
        match self.head.as_mut().filter(|h| h.touched) {
            Some(h) => {
                let (module, grads) = (h.module.as_ref().expect(HELD), h.grads.grads());
                let norm = optim::gradient_norm(module, &grads);
                h.grads.accumulate(module, grads);
                norm * norm
            }
            None => 0.0,
        }
    }

    fn step(&mut self, lr: f64, scale: f64) {
        if let Some(h) = self.head.as_mut().filter(|h| h.touched) {
            let (module, mut grads) = (h.module.take().expect(HELD), h.grads.grads());
            if scale != 1.0 {
                optim::scale_gradients(&module, &mut grads, scale);
            }
            h.module = Some(h.optimizer.step(lr, module, grads));
            h.touched = false;
        }
    }

    fn reset(&mut self) {
        if let Some(h) = self.head.as_mut() {
            h.grads.grads();
            h.touched = false;
        }
    }

    fn remember(&mut self, samples: &[usize], input: &Wire<B>) {
        if self.capacity == 0 {
            return;
        }
        self.buffer.push_back((samples.to_vec(), input.clone()));
        while self.buffered() > self.capacity {
            self.buffer.pop_front();
            self.cursor = self.cursor.saturating_sub(1);
        }
    }

    /// The next `samples` or so buffered samples (whole entries, in turn, from the oldest),
    /// joined into one input; `None` when the buffer is empty.
    fn replay(&mut self, samples: usize) -> Option<(Vec<usize>, Wire<B>)> {
        let mut taken: Vec<(Vec<usize>, Wire<B>)> = Vec::new();
        while taken.iter().map(|(s, _)| s.len()).sum::<usize>() < samples.max(1) && taken.len() < self.buffer.len() {
            self.cursor %= self.buffer.len();
            taken.push(self.buffer[self.cursor].clone());
            self.cursor += 1;
        }
        let ids: Vec<usize> = taken.iter().flat_map(|(s, _)| s.iter().copied()).collect();
        let mut values = taken.into_iter().map(|(_, v)| v);
        let first = values.next()?;
        Some((ids, values.fold(first, join::<B>)))
    }

    fn held_bytes(&self) -> usize {
        self.buffer.iter().map(|(_, input)| input.num_elements() * size_of::<f32>()).sum()
    }

    /// The head, the optimizer's state and the buffer.
    fn state(&self) -> Result<StateParts, StateError> {
        let mut state = StateParts::default();
        if let Some(head) = &self.head {
            state.put("head", model_bytes(head.module.as_ref().expect(HELD))?);
            state.put("head.optimizer", head.optimizer.state()?.to_bytes());
        }
        let mut buffer = Writer::default();
        buffer.count(self.cursor).count(self.buffer.len());
        for (samples, value) in &self.buffer {
            buffer.counts(samples);
            match value {
                Activation::Sequence(t) => buffer.tensor(t),
                Activation::Features(t) => buffer.tensor(t),
                Activation::Tokens(_) => unreachable!("token ids are never a received input"),
            };
        }
        state.put("buffer", buffer.0);
        Ok(state)
    }

    fn restore(&mut self, state: &StateParts, device: &B::Device) -> Result<(), StateError> {
        if let Some(head) = &mut self.head {
            let module = head.module.take().expect(HELD);
            head.module = Some(load_model_bytes(module, state.get("head")?, device)?);
            head.optimizer.restore(&StateParts::from_bytes(state.get("head.optimizer")?)?, device)?;
        }
        let mut input = Reader(state.get("buffer")?);
        let cursor = input.count()?;
        let buffer = (0..input.count()?)
            .map(|_| {
                let samples = input.counts()?;
                let value = Activation::from_data(input.tensor_data()?, device)
                    .map_err(|e| StateError::Damaged(e.to_string()))?;
                Ok((samples, value))
            })
            .collect::<Result<VecDeque<_>, StateError>>()?;
        input.end()?;
        (self.buffer, self.cursor) = (buffer, cursor);
        Ok(())
    }
}

/// Two inputs of the same kind, one after the other along the batch.
fn join<B: AutodiffBackend>(a: Wire<B>, b: Wire<B>) -> Wire<B> {
    match (a, b) {
        (Activation::Sequence(a), Activation::Sequence(b)) => Activation::Sequence(Tensor::cat(vec![a, b], 0)),
        (Activation::Features(a), Activation::Features(b)) => Activation::Features(Tensor::cat(vec![a, b], 0)),
        (a, b) => panic!("replayed inputs of different kinds: {} and {}", a.kind(), b.kind()),
    }
}
