//! The pieces of a training step every strategy shares: gradients of a batch, and evaluation.

use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor};
use tandem_data::{Batch, Encoded};
use tandem_models::Classifier;

use crate::metrics::{ClassificationMetrics, ConfusionMatrix};
use crate::Evaluation;

/// Mean cross-entropy loss of a batch (one kernel each way on the GPU backends).
pub fn loss<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    tandem_models::cross_entropy(logits, labels)
}

/// Forward + backward on one batch: the mean loss and the gradients of `model`'s parameters.
pub fn gradients<B: AutodiffBackend>(model: &Classifier<B>, batch: Batch<B>) -> (f64, GradientsParams) {
    let (value, _, grads) = tested_gradients(model, batch);
    (value, grads)
}

/// [`gradients`], plus how many samples of the batch the forward pass classified correctly
/// (test-then-train: the model is the one before the batch's update).
pub fn tested_gradients<B: AutodiffBackend>(model: &Classifier<B>, batch: Batch<B>) -> (f64, usize, GradientsParams) {
    let logits = model.forward(batch.tokens, &batch.mask_pad);
    let correct = correct_predictions(logits.clone(), batch.labels.clone());
    let loss = loss(logits, batch.labels);
    let value = loss.clone().into_scalar().elem::<f64>();
    let grads = GradientsParams::from_grads(loss.backward(), model);
    (value, correct, grads)
}

/// How many rows of `logits` have their largest value at their label.
pub fn correct_predictions<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> usize {
    let predicted = logits.argmax(1).squeeze_dim::<1>(1);
    predicted.equal(labels).int().sum().into_scalar().elem::<i64>() as usize
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
        let predicted: Vec<usize> = logits.clone().argmax(1).into_data().iter::<i64>().map(|p| p as usize).collect();
        loss_sum += loss(logits, batch.labels).into_scalar().elem::<f64>() * indices.len() as f64;
        let truth: Vec<usize> = indices.iter().map(|&i| data.labels[i]).collect();
        confusion.add(&truth, &predicted);
    }
    Evaluation {
        loss: if data.is_empty() { 0.0 } else { loss_sum / data.len() as f64 },
        metrics: ClassificationMetrics::from_confusion(confusion),
    }
}
