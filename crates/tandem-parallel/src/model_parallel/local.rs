//! What a stage keeps to learn between real (end-to-end) steps: an auxiliary head with its own
//! optimizer, so that a stage before the last has a loss of its own (local learning), and a
//! bounded buffer of the inputs a stage after the first received at real or transfer steps, to
//! train on them again later without a transfer (features replay).

use std::collections::VecDeque;

use burn::optim::GradientsAccumulator;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use tandem_models::{Activation, Classifier};
use tandem_train::bytes::{Reader, Writer};
use tandem_train::checkpoint::{load_model_bytes, model_bytes};
use tandem_train::optim::AnyOptimizer;
use tandem_train::{StateError, StateParts, TrainConfig};

use super::wire::Wire;

/// An auxiliary classifier on a stage's output, trained with the stage.
pub(super) struct AuxHead<B: AutodiffBackend> {
    /// `None` only during an optimizer step.
    pub module: Option<Classifier<B>>,
    pub optimizer: AnyOptimizer<Classifier<B>, B>,
    pub grads: GradientsAccumulator<Classifier<B>>,
    /// Whether `grads` holds anything since the last step.
    pub touched: bool,
    /// Weight of its loss in a real step's backward pass (0: the stage's gradients are vanilla's).
    pub weight: f64,
}

/// A stage's local learning (see the module docs).
pub(super) struct Local<B: AutodiffBackend> {
    pub head: Option<AuxHead<B>>,
    /// Received inputs and their samples, oldest first, holding at most `capacity` samples.
    buffer: VecDeque<(Vec<usize>, Wire<B>)>,
    capacity: usize,
    /// The next buffered input to replay.
    cursor: usize,
}

impl<B: AutodiffBackend> Local<B> {
    /// Local learning with an auxiliary `head` (stages before the last) whose loss weighs
    /// `weight` in real steps, and a replay buffer of `capacity` samples (0: none).
    pub fn new(head: Option<Classifier<B>>, weight: f64, capacity: usize, train: &TrainConfig) -> Self {
        let head = head.map(|module| AuxHead {
            optimizer: AnyOptimizer::for_model(train, &module),
            module: Some(module),
            grads: GradientsAccumulator::new(),
            touched: false,
            weight,
        });
        Self { head, buffer: VecDeque::new(), capacity, cursor: 0 }
    }

    /// Keeps a received input for replay (oldest first out when full).
    pub fn remember(&mut self, samples: &[usize], input: &Wire<B>) {
        if self.capacity == 0 {
            return;
        }
        self.buffer.push_back((samples.to_vec(), input.clone()));
        while self.buffered() > self.capacity {
            self.buffer.pop_front();
            self.cursor = self.cursor.saturating_sub(1);
        }
    }

    /// Bytes of the inputs buffered for replay.
    pub(super) fn held_bytes(&self) -> usize {
        self.buffer.iter().map(|(_, input)| input.num_elements() * size_of::<f32>()).sum()
    }

    fn buffered(&self) -> usize {
        self.buffer.iter().map(|(s, _)| s.len()).sum()
    }

    /// The next `samples` or so buffered samples (whole entries, in turn, from the oldest),
    /// joined into one input; `None` when the buffer is empty.
    pub fn replay(&mut self, samples: usize) -> Option<(Vec<usize>, Wire<B>)> {
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

    /// The head, the optimizer's state and the buffer, for a checkpoint.
    pub fn state(&self) -> Result<StateParts, StateError> {
        let mut state = StateParts::default();
        if let Some(head) = &self.head {
            state.put("head", model_bytes(head.module.as_ref().expect("held between steps"))?);
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

    /// Continues from [`Local::state`], on `device`.
    pub fn restore(&mut self, state: &StateParts, device: &B::Device) -> Result<(), StateError> {
        if let Some(head) = &mut self.head {
            let module = head.module.take().expect("held between steps");
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
