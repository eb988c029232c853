//! GELU, softmax over the last dimension and dropout as one kernel forward and one backward each.
//! Burn runs them as several tensor operations on a GPU: GELU five forward and about fifteen
//! backward (its derivative written out), softmax five forward (max, subtract, exp, sum, divide)
//! and as many backward, dropout a random draw, a comparison and two products forward.
//!
//! GELU and dropout give each unit (thread) one element, softmax a row to [`LANES`] lanes
//! ([`super::lanes`]). Dropout's backward pass draws its mask again rather than keeping it. The
//! forward kernels compute what Burn's operations do, in the same order; GELU's backward is
//! Burn's too, the derivative of its tanh approximation (as every backend but Flex runs it), so a
//! GPU run trains as it did.

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::lanes::{row_cubes, row_max, row_span, row_sum, tree_reads, CUBE_UNITS, LANES, ROWS_PER_CUBE};
use super::{empty_like, one_unit_each};
use crate::dropout::Draw;
use crate::ledger::{note, Work};
pub(crate) use crate::row_op::RowOp;

/// What the backward kernel of a [`RowOp`] reads, as tensors `T` of the backend.
#[derive(Clone, Debug)]
pub(crate) enum RowTape<T> {
    Gelu {
        input: T,
    },
    Softmax {
        output: T,
    },
    /// Dropout's backward pass draws its mask again.
    Dropout(Draw),
}

#[cfg(feature = "fusion")]
impl<T> RowTape<T> {
    /// The same tape with each tensor mapped by `f`, in the order of [`Self::tensors`].
    pub(crate) fn map<U>(self, mut f: impl FnMut(T) -> U) -> RowTape<U> {
        match self {
            Self::Gelu { input } => RowTape::Gelu { input: f(input) },
            Self::Softmax { output } => RowTape::Softmax { output: f(output) },
            Self::Dropout(draw) => RowTape::Dropout(draw),
        }
    }

    /// The tape's tensors.
    pub(crate) fn tensors(&self) -> Vec<&T> {
        match self {
            Self::Gelu { input } => vec![input],
            Self::Softmax { output } => vec![output],
            Self::Dropout(_) => vec![],
        }
    }
}

/// `√2` as Burn's GELU divides by it.
const SQRT_2: f32 = std::f32::consts::SQRT_2;

#[cube(launch)]
fn gelu_kernel(x: &Tensor<f32>, out: &mut Tensor<f32>) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let v = x[i];
        out[i] = v * (Erf::erf(v / SQRT_2) + 1.0) / 2.0;
    }
}

/// Burn's `gelu_backward`: the gradient times the derivative of GELU's tanh approximation.
#[cube(launch)]
fn gelu_backward_kernel(x: &Tensor<f32>, grad: &Tensor<f32>, out: &mut Tensor<f32>) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let v = x[i];
        let cube = v * v * v;
        let inner_1 = cube * 0.0356774 + v * 0.797885;
        let inner_2 = cube * 0.0535161 + v * 0.398942;
        let tanh = inner_1.tanh();
        let sech = 1.0 - tanh * tanh;
        out[i] = (tanh * 0.5 + (inner_2 * sech + 0.5)) * grad[i];
    }
}

/// [`crate::dropout::mix`] on the GPU.
#[cube]
fn mix(x: u32) -> u32 {
    let x = (x ^ (x >> 16u32)) * 0x7feb_352du32;
    let x = (x ^ (x >> 15u32)) * 0x846c_a68bu32;
    x ^ (x >> 16u32)
}

/// [`Draw::factor`] on the GPU: `scale` where element `i` is kept, 0 where it is dropped.
#[cube]
pub(crate) fn dropout_factor(i: u32, key_0: u32, key_1: u32, threshold: u32, scale: f32) -> f32 {
    let mut factor = 0.0f32;
    if mix(mix(i ^ key_0) ^ key_1) >> 8u32 < threshold {
        factor = scale;
    }
    factor
}

/// `x` times each element's dropout factor (forward and backward: the mask is drawn again).
#[cube(launch)]
fn dropout_kernel(x: &Tensor<f32>, out: &mut Tensor<f32>, key_0: u32, key_1: u32, threshold: u32, scale: f32) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        out[i] = x[i] * dropout_factor(i as u32, key_0, key_1, threshold, scale);
    }
}

/// Launches [`dropout_kernel`] of `draw` over `x` (contiguous) into `out`.
fn drop_out<R: CubeRuntime>(draw: Draw, x: CubeTensor<R>, out: &CubeTensor<R>) {
    let elements = out.shape().num_elements();
    let (count, dim) = one_unit_each(&x, elements);
    note(|| Work::of("rows::dropout_kernel", &count, dim).moves(2 * elements).computes(elements).waits(1, 0));
    let [key_0, key_1] = draw.key;
    dropout_kernel::launch::<R>(
        &x.client.clone(),
        count,
        dim,
        x.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        key_0,
        key_1,
        draw.threshold,
        draw.scale,
    );
}

/// Writes the softmax of the `width` values of `x` from `start` into `out` at the same places, and
/// returns their log-sum-exp, `max + log Σ exp(x − max)`.
#[cube]
pub(crate) fn softmax_row(x: &Tensor<f32>, out: &mut Tensor<f32>, start: usize, width: usize) -> f32 {
    for j in 0..width {
        out[start + j] = x[start + j];
    }
    softmax_in_place(out, start, width)
}

/// Replaces the `width` values of `values` from `start` by their softmax, and returns their
/// log-sum-exp, `max + log Σ exp(x − max)`.
#[cube]
fn softmax_in_place(values: &mut Tensor<f32>, start: usize, width: usize) -> f32 {
    let mut max = values[start];
    for j in 1..width {
        max = f32::max(max, values[start + j]);
    }
    let mut sum = 0.0f32;
    for j in 0..width {
        let e = (values[start + j] - max).exp();
        values[start + j] = e;
        sum += e;
    }
    for j in 0..width {
        values[start + j] = values[start + j] / sum;
    }
    max + sum.ln()
}

/// A row to [`LANES`] lanes: `exp(x − max) / Σ exp(x − max)`.
#[cube(launch)]
fn softmax_kernel(x: &Tensor<f32>, out: &mut Tensor<f32>, rows: u32, width: u32) {
    let mut shared = SharedMemory::<f32>::new(CUBE_UNITS as usize);
    let (_, lane, start, length) = row_span(rows, width);
    let lanes = LANES as usize;
    let mut max = f32::new(f32::MIN);
    let mut j = lane;
    while j < length {
        max = f32::max(max, x[start + j]);
        j += lanes;
    }
    let max = row_max(&mut shared, max);
    let mut sum = 0.0f32;
    j = lane;
    while j < length {
        let e = (x[start + j] - max).exp();
        out[start + j] = e;
        sum += e;
        j += lanes;
    }
    let sum = row_sum(&mut shared, sum);
    j = lane;
    while j < length {
        out[start + j] = out[start + j] / sum;
        j += lanes;
    }
}

/// A row to [`LANES`] lanes: `y ⊙ (g − Σ g ⊙ y)`, from the output `y` and its gradient `g`.
#[cube(launch)]
fn softmax_backward_kernel(y: &Tensor<f32>, grad: &Tensor<f32>, out: &mut Tensor<f32>, rows: u32, width: u32) {
    let mut shared = SharedMemory::<f32>::new(CUBE_UNITS as usize);
    let (_, lane, start, length) = row_span(rows, width);
    let lanes = LANES as usize;
    let mut dot = 0.0f32;
    let mut j = lane;
    while j < length {
        dot += grad[start + j] * y[start + j];
        j += lanes;
    }
    let dot = row_sum(&mut shared, dot);
    j = lane;
    while j < length {
        out[start + j] = y[start + j] * (grad[start + j] - dot);
        j += lanes;
    }
}

/// Rows and their length: the last dimension, and every other one multiplied out.
pub(crate) fn rows_of(shape: &Shape) -> (usize, usize) {
    let width = shape.as_slice().last().copied().unwrap_or(1).max(1);
    (shape.num_elements() / width, width)
}

/// `op` over the last dimension of `x` (f32): the output, and what [`backward`] reads.
pub(crate) fn forward<R: CubeRuntime>(op: RowOp, x: CubeTensor<R>) -> (CubeTensor<R>, RowTape<CubeTensor<R>>) {
    let x = into_contiguous(x);
    let shape = x.shape();
    let (rows, width) = rows_of(&shape);
    let out = empty_like(&x, shape.clone());
    let client = x.client.clone();
    match op {
        RowOp::Gelu => {
            let (count, dim) = one_unit_each(&x, shape.num_elements());
            note(|| {
                Work::of("rows::gelu_kernel", &count, dim)
                    .moves(2 * rows * width)
                    .computes(14 * rows * width)
                    .waits(1, 0)
            });
            gelu_kernel::launch::<R>(&client, count, dim, x.clone().into_tensor_arg(), out.clone().into_tensor_arg());
            (out, RowTape::Gelu { input: x })
        }
        RowOp::Softmax => {
            let (count, dim) = row_cubes(&x, rows, ROWS_PER_CUBE, 0);
            note(|| {
                let work = Work::of("rows::softmax_kernel", &count, dim).moves(2 * rows * width);
                work.computes(5 * rows * width)
                    .waits(3 * width.div_ceil(LANES as usize), 2 * tree_reads(LANES as usize))
            });
            softmax_kernel::launch::<R>(
                &client,
                count,
                dim,
                x.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                rows as u32,
                width as u32,
            );
            (out.clone(), RowTape::Softmax { output: out })
        }
        RowOp::Dropout(draw) => {
            drop_out(draw, x, &out);
            (out, RowTape::Dropout(draw))
        }
    }
}

/// The gradient of the input of the forward pass that kept `tape`, from the output's, `grad`.
pub(crate) fn backward<R: CubeRuntime>(tape: RowTape<CubeTensor<R>>, grad: CubeTensor<R>) -> CubeTensor<R> {
    let grad = into_contiguous(grad);
    let shape = grad.shape();
    let (rows, width) = rows_of(&shape);
    let out = empty_like(&grad, shape.clone());
    let client = grad.client.clone();
    let arg = |t: CubeTensor<R>| into_contiguous(t).into_tensor_arg();
    match tape {
        RowTape::Gelu { input } => {
            let (count, dim) = one_unit_each(&grad, shape.num_elements());
            note(|| {
                Work::of("rows::gelu_backward_kernel", &count, dim)
                    .moves(3 * rows * width)
                    .computes(24 * rows * width)
                    .waits(1, 0)
            });
            gelu_backward_kernel::launch::<R>(
                &client,
                count,
                dim,
                arg(input),
                grad.into_tensor_arg(),
                out.clone().into_tensor_arg(),
            );
        }
        RowTape::Softmax { output } => {
            let (count, dim) = row_cubes(&grad, rows, ROWS_PER_CUBE, 0);
            note(|| {
                let work = Work::of("rows::softmax_backward_kernel", &count, dim).moves(3 * rows * width);
                work.computes(4 * rows * width).waits(2 * width.div_ceil(LANES as usize), tree_reads(LANES as usize))
            });
            softmax_backward_kernel::launch::<R>(
                &client,
                count,
                dim,
                arg(output),
                grad.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                rows as u32,
                width as u32,
            );
        }
        RowTape::Dropout(draw) => drop_out(draw, grad, &out),
    }
    out
}
