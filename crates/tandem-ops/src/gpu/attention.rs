//! Self-attention's core — scores, scale, dropout on the scores, the padding mask, softmax and the
//! weighted sum of the values — as one kernel forward and two backward, where Burn runs about a
//! dozen operations each way (two batched matmuls, a scale, dropout's mask and product, the mask's
//! expansion and fill, softmax, and the copies of the heads' split and merge).
//!
//! One unit (thread) per query row of one head of one sample. The kernels read the queries, keys
//! and values as one projection leaves them, side by side, `[batch · seq, 3 · heads · d_k]`, and
//! write the context as `[batch · seq, heads · d_k]`, so the heads are never split or merged by a
//! copy, and the three projections are one matmul each way. The computation is Burn's
//! `MultiHeadAttention` in its order: `q · kᵀ / √d_k`, dropout ([`dropout_factor`], the mask the
//! host would draw for the scores' `[batch, heads, seq, seq]`), padded keys set to `min_float`,
//! softmax, times the values.

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::rows::{dropout_factor, softmax_in_place};
use super::{empty_like, one_unit_each};
use crate::dropout::Draw;

/// What attention's kernels need besides tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttentionSpec {
    pub heads: usize,
    /// The score padded keys get before the softmax.
    pub min_float: f32,
    /// Dropout on the scores; [`Draw::none`] for none.
    pub dropout: Draw,
}

/// What the backward kernels read, as tensors `T` of the backend.
#[derive(Clone, Debug)]
pub(crate) struct AttentionTape<T> {
    pub spec: AttentionSpec,
    /// The queries, keys and values side by side, `[batch · seq, 3 · heads · d_k]`.
    pub projected: T,
    /// `[batch, seq]`, 1 at padding.
    pub padding: T,
    /// The softmax's output `[batch, heads, seq, seq]`.
    pub weights: T,
}

/// A unit's place: `(sample, head, position)` of `unit = (sample · heads + head) · seq + position`.
#[cube]
fn place(unit: u32, seq: u32, heads: u32) -> (u32, u32, u32) {
    let head_of_sample = unit / seq;
    (head_of_sample / heads, head_of_sample % heads, unit % seq)
}

/// Where `head`'s part of position `position` of `sample` starts in a `[batch · seq, heads · d_k]`
/// tensor.
#[cube]
fn head_row(sample: u32, head: u32, position: u32, seq: u32, heads: u32, d_k: u32) -> usize {
    (((sample * seq + position) * heads + head) * d_k) as usize
}

/// Where `head`'s query (`part` 0), key (1) or value (2) of position `position` of `sample` starts
/// in the projections side by side, `[batch · seq, 3 · heads · d_k]`.
#[cube]
fn projected_row(sample: u32, head: u32, position: u32, part: u32, seq: u32, heads: u32, d_k: u32) -> usize {
    ((((sample * seq + position) * 3 + part) * heads + head) * d_k) as usize
}

#[cube]
fn dot(a: &Tensor<f32>, a_start: usize, b: &Tensor<f32>, b_start: usize, length: u32) -> f32 {
    let mut sum = 0.0f32;
    for c in 0..length as usize {
        sum += a[a_start + c] * b[b_start + c];
    }
    sum
}

#[cube(launch)]
fn forward_kernel(
    projected: &Tensor<f32>,
    padding: &Tensor<f32>,
    weights: &mut Tensor<f32>,
    context: &mut Tensor<f32>,
    units: u32,
    seq: u32,
    heads: u32,
    d_k: u32,
    sqrt_d_k: f32,
    min_float: f32,
    key_0: u32,
    key_1: u32,
    threshold: u32,
    scale: f32,
) {
    let unit = ABSOLUTE_POS as u32;
    if unit < units {
        let (sample, head, position) = place(unit, seq, heads);
        let query = projected_row(sample, head, position, 0, seq, heads, d_k);
        let start = (unit * seq) as usize;
        for j in 0..seq {
            let key = projected_row(sample, head, j, 1, seq, heads, d_k);
            let score = dot(projected, query, projected, key, d_k) / sqrt_d_k;
            let index = unit * seq + j;
            let mut score = score * dropout_factor(index, key_0, key_1, threshold, scale);
            if padding[(sample * seq + j) as usize] > 0.5 {
                score = min_float;
            }
            weights[start + j as usize] = score;
        }
        softmax_in_place(weights, start, seq as usize);
        for c in 0..d_k as usize {
            let mut total = 0.0f32;
            for j in 0..seq {
                total +=
                    weights[start + j as usize] * projected[projected_row(sample, head, j, 2, seq, heads, d_k) + c];
            }
            context[head_row(sample, head, position, seq, heads, d_k) + c] = total;
        }
    }
}

/// Per query row: the scores' gradient (through softmax, mask, dropout and scale) into `d_scores`,
/// and the query's gradient.
#[cube(launch)]
fn query_gradient_kernel(
    projected: &Tensor<f32>,
    padding: &Tensor<f32>,
    weights: &Tensor<f32>,
    grad: &Tensor<f32>,
    d_scores: &mut Tensor<f32>,
    d_projected: &mut Tensor<f32>,
    units: u32,
    seq: u32,
    heads: u32,
    d_k: u32,
    sqrt_d_k: f32,
    key_0: u32,
    key_1: u32,
    threshold: u32,
    scale: f32,
) {
    let unit = ABSOLUTE_POS as u32;
    if unit < units {
        let (sample, head, position) = place(unit, seq, heads);
        let own = head_row(sample, head, position, seq, heads, d_k);
        let start = (unit * seq) as usize;
        let mut weighted = 0.0f32;
        for j in 0..seq {
            let d_weight = dot(grad, own, projected, projected_row(sample, head, j, 2, seq, heads, d_k), d_k);
            d_scores[start + j as usize] = d_weight;
            weighted += d_weight * weights[start + j as usize];
        }
        for j in 0..seq {
            let at = start + j as usize;
            let mut d_score = 0.0f32;
            if padding[(sample * seq + j) as usize] < 0.5 {
                let factor = dropout_factor(unit * seq + j, key_0, key_1, threshold, scale);
                d_score = weights[at] * (d_scores[at] - weighted) * factor / sqrt_d_k;
            }
            d_scores[at] = d_score;
        }
        for c in 0..d_k as usize {
            let mut total = 0.0f32;
            for j in 0..seq {
                total +=
                    d_scores[start + j as usize] * projected[projected_row(sample, head, j, 1, seq, heads, d_k) + c];
            }
            d_projected[projected_row(sample, head, position, 0, seq, heads, d_k) + c] = total;
        }
    }
}

/// Per key row: the key's and the value's gradients, sums over the query rows.
#[cube(launch)]
fn key_value_gradient_kernel(
    projected: &Tensor<f32>,
    weights: &Tensor<f32>,
    grad: &Tensor<f32>,
    d_scores: &Tensor<f32>,
    d_projected: &mut Tensor<f32>,
    units: u32,
    seq: u32,
    heads: u32,
    d_k: u32,
) {
    let unit = ABSOLUTE_POS as u32;
    if unit < units {
        let (sample, head, position) = place(unit, seq, heads);
        // Column `position` of this head's `[seq, seq]` scores.
        let column = ((unit - position) * seq + position) as usize;
        for c in 0..d_k as usize {
            let mut key_total = 0.0f32;
            let mut value_total = 0.0f32;
            for i in 0..seq {
                let at = column + (i * seq) as usize;
                key_total += d_scores[at] * projected[projected_row(sample, head, i, 0, seq, heads, d_k) + c];
                value_total += weights[at] * grad[head_row(sample, head, i, seq, heads, d_k) + c];
            }
            d_projected[projected_row(sample, head, position, 1, seq, heads, d_k) + c] = key_total;
            d_projected[projected_row(sample, head, position, 2, seq, heads, d_k) + c] = value_total;
        }
    }
}

/// A launch's scalar arguments.
struct Scalars {
    units: u32,
    seq: u32,
    heads: u32,
    d_k: u32,
    sqrt_d_k: f32,
}

impl Scalars {
    /// For `projected` `[batch · seq, 3 · heads · d_k]` and `padding` `[batch, seq]`.
    fn of<R: CubeRuntime>(spec: &AttentionSpec, projected: &CubeTensor<R>, padding: &CubeTensor<R>) -> Self {
        let [batch, seq] = padding.shape().dims::<2>();
        let d_k = projected.shape().dims::<2>()[1] / (3 * spec.heads);
        Self {
            units: (batch * spec.heads * seq) as u32,
            seq: seq as u32,
            heads: spec.heads as u32,
            d_k: d_k as u32,
            sqrt_d_k: (d_k as f32).sqrt(),
        }
    }
}

/// The context `[batch · seq, heads · d_k]` of the queries, keys and values side by side in
/// `projected` `[batch · seq, 3 · heads · d_k]` (f32) under the padding mask `padding`
/// `[batch, seq]` (1 at padding), and what [`backward`] reads.
pub(crate) fn forward<R: CubeRuntime>(
    spec: AttentionSpec,
    projected: CubeTensor<R>,
    padding: CubeTensor<R>,
) -> (CubeTensor<R>, AttentionTape<CubeTensor<R>>) {
    let [projected, padding] = [projected, padding].map(into_contiguous);
    let [batch, seq] = padding.shape().dims::<2>();
    let n = Scalars::of(&spec, &projected, &padding);
    let [key_0, key_1] = spec.dropout.key;
    let weights = empty_like(&projected, Shape::new([batch, spec.heads, seq, seq]));
    let context = empty_like(&projected, Shape::new([batch * seq, (spec.heads * n.d_k as usize)]));
    let (count, dim) = one_unit_each(&projected, n.units as usize);
    forward_kernel::launch::<R>(
        &projected.client.clone(),
        count,
        dim,
        projected.clone().into_tensor_arg(),
        padding.clone().into_tensor_arg(),
        weights.clone().into_tensor_arg(),
        context.clone().into_tensor_arg(),
        n.units,
        n.seq,
        n.heads,
        n.d_k,
        n.sqrt_d_k,
        spec.min_float,
        key_0,
        key_1,
        spec.dropout.threshold,
        spec.dropout.scale,
    );
    (context, AttentionTape { spec, projected, padding, weights })
}

/// The gradient of the projections side by side from the context's, `grad`.
pub(crate) fn backward<R: CubeRuntime>(tape: AttentionTape<CubeTensor<R>>, grad: CubeTensor<R>) -> CubeTensor<R> {
    let AttentionTape { spec, projected, padding, weights } = tape;
    let grad = into_contiguous(grad);
    let n = Scalars::of(&spec, &projected, &padding);
    let [key_0, key_1] = spec.dropout.key;
    let d_scores = empty_like(&projected, weights.shape());
    let d_projected = empty_like(&projected, projected.shape());
    let client = projected.client.clone();
    let (count, dim) = one_unit_each(&projected, n.units as usize);
    query_gradient_kernel::launch::<R>(
        &client,
        count.clone(),
        dim,
        projected.clone().into_tensor_arg(),
        padding.into_tensor_arg(),
        weights.clone().into_tensor_arg(),
        grad.clone().into_tensor_arg(),
        d_scores.clone().into_tensor_arg(),
        d_projected.clone().into_tensor_arg(),
        n.units,
        n.seq,
        n.heads,
        n.d_k,
        n.sqrt_d_k,
        key_0,
        key_1,
        spec.dropout.threshold,
        spec.dropout.scale,
    );
    key_value_gradient_kernel::launch::<R>(
        &client,
        count,
        dim,
        projected.into_tensor_arg(),
        weights.into_tensor_arg(),
        grad.into_tensor_arg(),
        d_scores.into_tensor_arg(),
        d_projected.clone().into_tensor_arg(),
        n.units,
        n.seq,
        n.heads,
        n.d_k,
    );
    d_projected
}
