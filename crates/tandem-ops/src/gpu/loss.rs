//! The mean cross-entropy of a batch of logits against integer labels as one kernel forward and
//! one backward. Burn computes it as a log-softmax, a gather of each row's label, a mean and a
//! negation (about ten launches forward, as many backward, a fill and a scatter among them).
//!
//! The forward kernel is one cube: each unit takes every 256th row, writes the row's softmax (what
//! the backward kernel reads) and adds up its rows' losses, and unit 0 adds the units' sums in
//! order, so the loss does not depend on scheduling. The backward kernel is one unit per logit:
//! `∂loss · (softmax − one-hot) / rows`.

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::rows::softmax_row;
use super::{empty_like, one_unit_each};
use crate::ledger::{note, Work};

/// Units of the forward kernel's one cube.
const UNITS: u32 = 256;

#[cube(launch)]
fn forward_kernel<I: Int>(
    logits: &Tensor<f32>,
    labels: &Tensor<I>,
    softmax: &mut Tensor<f32>,
    loss: &mut Tensor<f32>,
    rows: u32,
    classes: u32,
    #[define(I)] _label_type: StorageType,
) {
    let unit = UNIT_POS_X as usize;
    let (rows, classes) = (rows as usize, classes as usize);
    let mut sums = SharedMemory::<f32>::new(UNITS as usize);
    let mut total = 0.0f32;
    let mut row = unit;
    while row < rows {
        let start = row * classes;
        let log_sum_exp = softmax_row(logits, softmax, start, classes);
        // −log softmax at the label.
        total += log_sum_exp - logits[start + u32::cast_from(labels[row]) as usize];
        row += UNITS as usize;
    }
    sums[unit] = total;
    sync_cube();
    if unit == 0 {
        let mut all = 0.0f32;
        for u in 0..UNITS as usize {
            all += sums[u];
        }
        loss[0] = all / rows as f32;
    }
}

#[cube(launch)]
fn backward_kernel<I: Int>(
    softmax: &Tensor<f32>,
    labels: &Tensor<I>,
    grad: &Tensor<f32>,
    out: &mut Tensor<f32>,
    rows: u32,
    classes: u32,
    #[define(I)] _label_type: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let classes = classes as usize;
        let (row, class) = (i / classes, i % classes);
        let mut value = softmax[i];
        if u32::cast_from(labels[row]) as usize == class {
            value -= 1.0;
        }
        out[i] = grad[0] * value / rows as f32;
    }
}

/// The mean cross-entropy `[1]` of `logits` `[rows, classes]` (f32) against `labels` `[rows]`,
/// and the rows' softmax, which [`backward`] reads.
pub(crate) fn forward<R: CubeRuntime>(logits: CubeTensor<R>, labels: CubeTensor<R>) -> (CubeTensor<R>, CubeTensor<R>) {
    let (logits, labels) = (into_contiguous(logits), into_contiguous(labels));
    let [rows, classes] = logits.shape().dims::<2>();
    let softmax = empty_like(&logits, Shape::new([rows, classes]));
    let loss = empty_like(&logits, Shape::new([1]));
    let labels_dtype = labels.dtype;
    let (count, dim) = (CubeCount::Static(1, 1, 1), CubeDim::new_1d(UNITS));
    // A unit's rows, three passes over each, then unit 0's sum of the units' totals.
    note(|| {
        let work = Work::of("loss::forward_kernel", &count, dim).moves(2 * rows * classes + 2 * rows);
        work.computes(6 * rows * classes).waits(rows.div_ceil(UNITS as usize) * 3 * classes, UNITS as usize)
    });
    forward_kernel::launch::<R>(
        &logits.client.clone(),
        count,
        dim,
        logits.into_tensor_arg(),
        labels.into_tensor_arg(),
        softmax.clone().into_tensor_arg(),
        loss.clone().into_tensor_arg(),
        rows as u32,
        classes as u32,
        labels_dtype.into(),
    );
    (loss, softmax)
}

/// The gradient of the logits from the forward pass's softmax, the labels and the loss's gradient `[1]`.
pub(crate) fn backward<R: CubeRuntime>(
    softmax: CubeTensor<R>,
    labels: CubeTensor<R>,
    grad: CubeTensor<R>,
) -> CubeTensor<R> {
    let (softmax, labels, grad) = (into_contiguous(softmax), into_contiguous(labels), into_contiguous(grad));
    let shape = softmax.shape();
    let [rows, classes] = shape.dims::<2>();
    let out = empty_like(&softmax, shape);
    let client = softmax.client.clone();
    let (count, dim) = one_unit_each(&softmax, rows * classes);
    note(|| {
        Work::of("loss::backward_kernel", &count, dim)
            .moves(2 * rows * classes + rows)
            .computes(3 * rows * classes)
            .waits(2, 0)
    });
    let labels_dtype = labels.dtype;
    backward_kernel::launch::<R>(
        &client,
        count,
        dim,
        softmax.into_tensor_arg(),
        labels.into_tensor_arg(),
        grad.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows as u32,
        classes as u32,
        labels_dtype.into(),
    );
    out
}
