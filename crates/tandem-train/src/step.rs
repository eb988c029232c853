//! The pieces of a training step every strategy shares: gradients of a batch, and evaluation.

use std::sync::atomic::{AtomicU64, Ordering};

use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Element, Int, Tensor, TensorData, Transaction};
use tandem_data::{Batch, Encoded};
use tandem_models::Classifier;

use crate::metrics::{ClassificationMetrics, ConfusionMatrix};
use crate::Evaluation;

/// Mean cross-entropy loss of a batch (one kernel each way on the GPU backends).
pub fn loss<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    tandem_ops::cross_entropy(logits, labels)
}

/// Forward + backward on one batch: the mean loss and the gradients of `model`'s parameters.
/// Reads the loss back from the device (a convenience for tests and tools; training steps use
/// [`tested_gradients`], which reads nothing).
pub fn gradients<B: AutodiffBackend>(model: &Classifier<B>, batch: Batch<B>) -> (f64, GradientsParams) {
    let (measured, grads) = tested_gradients(model, batch);
    (read_scalar(measured.loss), grads)
}

/// [`gradients`], with the batch's mean loss and how many of its samples the forward pass
/// classified correctly (test-then-train: the model is the one before the batch's update) left on
/// the device, for a [`Tally`]: the step never waits for the device.
pub fn tested_gradients<B: AutodiffBackend>(
    model: &Classifier<B>,
    batch: Batch<B>,
) -> (Measured<B::InnerBackend>, GradientsParams) {
    let logits = model.forward(batch.tokens, &batch.mask_pad);
    let correct = correct_count(logits.clone().inner(), batch.labels.clone().inner());
    let loss = loss(logits, batch.labels);
    let measured = Measured { loss: loss.clone().inner(), correct };
    let grads = GradientsParams::from_grads(loss.backward(), model);
    (measured, grads)
}

/// What a training step's forward pass measured, still on the device: the batch's mean loss `[1]`
/// and how many of its samples were classified correctly `[1]`.
#[derive(Clone, Debug)]
pub struct Measured<B: Backend> {
    pub loss: Tensor<B, 1>,
    pub correct: Tensor<B, 1, Int>,
}

/// The training steps' measures of an epoch (or of the stretch between evaluation points), kept
/// on the device and read back in one go by [`Tally::read`], so that no step waits for the device
/// to finish its forward pass. The loss sum is added up on the host in f64, step by step, exactly
/// as reading each step's loss would.
#[derive(Debug)]
pub struct Tally<B: Backend> {
    losses: Vec<(Tensor<B, 1>, usize)>,
    correct: Vec<Tensor<B, 1, Int>>,
}

impl<B: Backend> Default for Tally<B> {
    fn default() -> Self {
        Self { losses: Vec::new(), correct: Vec::new() }
    }
}

impl<B: Backend> Tally<B> {
    /// Adds a step's measures over `samples` samples.
    pub fn add(&mut self, measured: Measured<B>, samples: usize) {
        self.losses.push((measured.loss, samples));
        self.correct.push(measured.correct);
    }

    /// The loss summed over the samples (each step's mean loss times its samples) and the correct
    /// count: one read from the device, none when nothing was added.
    pub fn read(self) -> (f64, usize) {
        if self.losses.is_empty() {
            return (0.0, 0);
        }
        // One transaction reads every value: no launch to gather them first, one wait.
        HOST_READS.fetch_add(1, Ordering::Relaxed);
        let (losses, samples): (Vec<_>, Vec<_>) = self.losses.into_iter().unzip();
        let steps = losses.len();
        let transaction = losses.into_iter().fold(Transaction::default(), Transaction::register);
        let data = self.correct.into_iter().fold(transaction, Transaction::register).execute();
        let value = |d: &TensorData| d.clone().convert::<f64>().to_vec::<f64>().expect("converted to f64")[0];
        let loss_sum = data[..steps].iter().zip(samples).map(|(d, n)| value(d) * n as f64).sum();
        let correct = data[steps..].iter().map(|d| value(d) as usize).sum();
        (loss_sum, correct)
    }
}

/// Host reads of device values through this crate since the process started: the figure a
/// benchmark divides by its steps (Burn's and CubeCL's own reads are not counted; a training step
/// on the GPU backends makes none).
pub fn host_reads() -> u64 {
    HOST_READS.load(Ordering::Relaxed)
}

static HOST_READS: AtomicU64 = AtomicU64::new(0);

/// A tensor's data, read from the device (and counted), as values of `E`.
fn read_values<E: Element>(data: TensorData) -> Vec<E> {
    HOST_READS.fetch_add(1, Ordering::Relaxed);
    data.convert::<E>().to_vec().expect("converted to its own type")
}

/// A one-value tensor's value, read (and counted).
fn read_scalar<B: Backend>(tensor: Tensor<B, 1>) -> f64 {
    read_values::<f64>(tensor.into_data())[0]
}

/// How many rows of `logits` have their largest value at their label.
pub fn correct_predictions<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> usize {
    read_values::<i64>(correct_count(logits, labels).into_data())[0] as usize
}

/// [`correct_predictions`] on the device, `[1]`.
pub fn correct_count<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1, Int> {
    logits.argmax(1).squeeze_dim::<1>(1).equal(labels).int().sum()
}

/// Evaluates `model` on every sample of `data` exactly once, in order.
pub fn evaluate<B: Backend>(
    model: &Classifier<B>,
    data: &Encoded,
    batch_size: usize,
    device: &B::Device,
) -> Evaluation {
    let mut confusion = ConfusionMatrix::new(tandem_data::NUM_CLASSES);
    let mut loss_sum = 0.0;
    let order: Vec<usize> = (0..data.len()).collect();
    for indices in tandem_data::batches(&order, batch_size.max(1)) {
        let batch = data.batch::<B>(indices, device);
        let logits = model.forward(batch.tokens, &batch.mask_pad);
        let predicted: Vec<usize> =
            read_values::<i64>(logits.clone().argmax(1).into_data()).iter().map(|&p| p as usize).collect();
        loss_sum += read_scalar(loss(logits, batch.labels)) * indices.len() as f64;
        let truth: Vec<usize> = indices.iter().map(|&i| data.labels[i]).collect();
        confusion.add(&truth, &predicted);
    }
    Evaluation {
        loss: if data.is_empty() { 0.0 } else { loss_sum / data.len() as f64 },
        metrics: ClassificationMetrics::from_confusion(confusion),
    }
}
