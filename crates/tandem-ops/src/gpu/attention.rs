//! Self-attention's core — scores, scale, dropout on the scores, the padding mask, softmax and the
//! weighted sum of the values — as one kernel forward and two backward, where Burn runs about a
//! dozen operations each way (two batched matmuls, a scale, dropout's mask and product, the mask's
//! expansion and fill, softmax, and the copies of the heads' split and merge).
//!
//! A row of one head's scores (a query, or in the key-side backward a key) to [`LANES`] lanes
//! ([`super::lanes`]), the row kept in the cube's shared memory between its passes. The kernels
//! read the queries, keys and values as one projection leaves them, side by side,
//! `[batch · seq, 3 · heads · d_k]`, and write the context as `[batch · seq, heads · d_k]`, so
//! the heads are never split or merged by a copy, and the three projections are one matmul each
//! way. The computation is Burn's `MultiHeadAttention` in its order: `q · kᵀ / √d_k`, dropout
//! ([`dropout_factor`], the mask the host would draw for the scores' `[batch, heads, seq, seq]`),
//! padded keys set to `min_float`, softmax, times the values.

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::empty_like;
use super::lanes::{row_cubes, row_max, row_span, row_sum, tree_reads, CUBE_UNITS, LANES, ROWS_PER_CUBE};
use super::rows::dropout_factor;
use crate::dropout::Draw;
use crate::ledger::{note, Work};

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

/// A row's place: `(sample, head, position)` of `row = (sample · heads + head) · seq + position`.
#[cube]
fn place(row: u32, seq: u32, heads: u32) -> (u32, u32, u32) {
    let head_of_sample = row / seq;
    (head_of_sample / heads, head_of_sample % heads, row % seq)
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

/// The row of one head's scores a unit works on, with its lanes: `row = (sample · heads + head) ·
/// seq + position`.
#[derive(CubeType, Clone)]
struct ScoreRow {
    row: usize,
    sample: u32,
    head: u32,
    position: u32,
    /// How many keys (`seq`) and columns (`d_k`) the row works on: none past the last row.
    keys: usize,
    columns: usize,
    /// Where the row starts among the cube's rows in shared memory, and in the scores' tensor.
    own: usize,
    start: usize,
    /// From one position to the next in the projections side by side.
    stride: usize,
}

#[cube]
impl ScoreRow {
    fn new(rows: u32, seq: u32, heads: u32, d_k: u32) -> ScoreRow {
        let (row, _, start, keys) = row_span(rows, seq);
        let (sample, head, position) = place(row as u32, seq, heads);
        ScoreRow {
            row,
            sample,
            head,
            position,
            keys,
            columns: select(keys > 0, d_k as usize, 0usize),
            own: UNIT_POS_Y as usize * seq as usize,
            start,
            stride: (3 * heads * d_k) as usize,
        }
    }
}

/// For each column `c` of this unit's lane: `Σ_k scores[k] · projected[from + k · stride + c]`
/// over the `keys` scores of the unit's row in the cube's shared memory, written to `out` at
/// `out_start + c`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn weighted_sum(
    scores: &SharedMemory<f32>,
    keys: usize,
    projected: &Tensor<f32>,
    from: usize,
    stride: usize,
    out: &mut Tensor<f32>,
    out_start: usize,
    columns: usize,
) {
    let own = UNIT_POS_Y as usize * keys;
    let mut c = UNIT_POS_X as usize;
    while c < columns {
        let mut total = 0.0f32;
        for k in 0..keys {
            total += scores[own + k] * projected[from + k * stride + c];
        }
        out[out_start + c] = total;
        c += LANES as usize;
    }
}

/// A row of one head's scores to [`LANES`] lanes: lane `l` scores keys `l, l + 32, …` into the
/// cube's shared memory (`scores` values: the cube's rows side by side), the lanes find the row's
/// maximum and sum as a tree, then each lane sums the values weighted by the whole row for its
/// columns of the context.
#[cube(launch)]
fn forward_kernel(
    projected: &Tensor<f32>,
    padding: &Tensor<f32>,
    weights: &mut Tensor<f32>,
    context: &mut Tensor<f32>,
    rows: u32,
    seq: u32,
    heads: u32,
    d_k: u32,
    sqrt_d_k: f32,
    min_float: f32,
    key_0: u32,
    key_1: u32,
    threshold: u32,
    scale: f32,
    #[comptime] scores: usize,
) {
    let mut tree_space = SharedMemory::<f32>::new(CUBE_UNITS as usize);
    let mut row_scores = SharedMemory::<f32>::new(scores);
    let at = ScoreRow::new(rows, seq, heads, d_k);
    let query = projected_row(at.sample, at.head, at.position, 0, seq, heads, d_k);
    let mut max = f32::new(f32::MIN);
    let mut j = UNIT_POS_X as usize;
    while j < at.keys {
        let key = projected_row(at.sample, at.head, j as u32, 1, seq, heads, d_k);
        let score = dot(projected, query, projected, key, d_k) / sqrt_d_k;
        let mut score = score * dropout_factor((at.start + j) as u32, key_0, key_1, threshold, scale);
        if padding[at.sample as usize * seq as usize + j] > 0.5 {
            score = min_float;
        }
        row_scores[at.own + j] = score;
        max = f32::max(max, score);
        j += LANES as usize;
    }
    let max = row_max(&mut tree_space, max);
    let mut sum = 0.0f32;
    j = UNIT_POS_X as usize;
    while j < at.keys {
        let e = (row_scores[at.own + j] - max).exp();
        row_scores[at.own + j] = e;
        sum += e;
        j += LANES as usize;
    }
    let sum = row_sum(&mut tree_space, sum);
    j = UNIT_POS_X as usize;
    while j < at.keys {
        let weight = row_scores[at.own + j] / sum;
        row_scores[at.own + j] = weight;
        weights[at.start + j] = weight;
        j += LANES as usize;
    }
    sync_cube();
    let values = projected_row(at.sample, at.head, 0, 2, seq, heads, d_k);
    let out_start = head_row(at.sample, at.head, at.position, seq, heads, d_k);
    weighted_sum(&row_scores, at.keys, projected, values, at.stride, context, out_start, at.columns);
}

/// Per query row, laid out as forward: the scores' gradient (through softmax, mask, dropout and
/// scale) into `d_scores` and the cube's shared memory, then the query's gradient.
#[cube(launch)]
fn query_gradient_kernel(
    projected: &Tensor<f32>,
    padding: &Tensor<f32>,
    weights: &Tensor<f32>,
    grad: &Tensor<f32>,
    d_scores: &mut Tensor<f32>,
    d_projected: &mut Tensor<f32>,
    rows: u32,
    seq: u32,
    heads: u32,
    d_k: u32,
    sqrt_d_k: f32,
    key_0: u32,
    key_1: u32,
    threshold: u32,
    scale: f32,
    #[comptime] scores: usize,
) {
    let mut tree_space = SharedMemory::<f32>::new(CUBE_UNITS as usize);
    let mut row_scores = SharedMemory::<f32>::new(scores);
    let at = ScoreRow::new(rows, seq, heads, d_k);
    let own_grad = head_row(at.sample, at.head, at.position, seq, heads, d_k);
    let mut weighted = 0.0f32;
    let mut j = UNIT_POS_X as usize;
    while j < at.keys {
        let value = projected_row(at.sample, at.head, j as u32, 2, seq, heads, d_k);
        let d_weight = dot(grad, own_grad, projected, value, d_k);
        row_scores[at.own + j] = d_weight;
        weighted += d_weight * weights[at.start + j];
        j += LANES as usize;
    }
    let weighted = row_sum(&mut tree_space, weighted);
    j = UNIT_POS_X as usize;
    while j < at.keys {
        let mut d_score = 0.0f32;
        if padding[at.sample as usize * seq as usize + j] < 0.5 {
            let factor = dropout_factor((at.start + j) as u32, key_0, key_1, threshold, scale);
            d_score = weights[at.start + j] * (row_scores[at.own + j] - weighted) * factor / sqrt_d_k;
        }
        row_scores[at.own + j] = d_score;
        d_scores[at.start + j] = d_score;
        j += LANES as usize;
    }
    sync_cube();
    let keys_from = projected_row(at.sample, at.head, 0, 1, seq, heads, d_k);
    let out_start = projected_row(at.sample, at.head, at.position, 0, seq, heads, d_k);
    weighted_sum(&row_scores, at.keys, projected, keys_from, at.stride, d_projected, out_start, at.columns);
}

/// Per key row, its lanes over the columns: the key's and the value's gradients, sums over the
/// query rows.
#[cube(launch)]
fn key_value_gradient_kernel(
    projected: &Tensor<f32>,
    weights: &Tensor<f32>,
    grad: &Tensor<f32>,
    d_scores: &Tensor<f32>,
    d_projected: &mut Tensor<f32>,
    rows: u32,
    seq: u32,
    heads: u32,
    d_k: u32,
) {
    let at = ScoreRow::new(rows, seq, heads, d_k);
    let (sample, head, position, keys, columns) = (at.sample, at.head, at.position, at.keys, at.columns);
    // Column `position` of this head's `[seq, seq]` scores.
    let column = (at.row - position as usize) * seq as usize + position as usize;
    let mut c = UNIT_POS_X as usize;
    while c < columns {
        let mut key_total = 0.0f32;
        let mut value_total = 0.0f32;
        for i in 0..keys {
            let at = column + i * seq as usize;
            key_total += d_scores[at] * projected[projected_row(sample, head, i as u32, 0, seq, heads, d_k) + c];
            value_total += weights[at] * grad[head_row(sample, head, i as u32, seq, heads, d_k) + c];
        }
        d_projected[projected_row(sample, head, position, 1, seq, heads, d_k) + c] = key_total;
        d_projected[projected_row(sample, head, position, 2, seq, heads, d_k) + c] = value_total;
        c += LANES as usize;
    }
}

/// Rows of scores a cube holds at `seq` positions within `shared_bytes` of shared memory (beside
/// the lanes' tree), at most [`ROWS_PER_CUBE`]; `None` where not even one fits.
pub(crate) fn rows_per_cube(seq: usize, shared_bytes: usize) -> Option<u32> {
    let values = (shared_bytes / std::mem::size_of::<f32>()).checked_sub(CUBE_UNITS as usize)?;
    let rows = (values / seq.max(1)).min(ROWS_PER_CUBE as usize);
    (rows > 0).then_some(rows as u32)
}

/// Whether the kernels take `seq` positions on `device` (a row of scores in shared memory).
pub(crate) fn supports<R: CubeRuntime>(seq: usize, device: &R::Device) -> bool {
    rows_per_cube(seq, R::client(device).properties().hardware.max_shared_memory_size).is_some()
}

/// The cubes for `rows` rows of `seq` scores, and the shared values each holds.
fn geometry<R: CubeRuntime>(like: &CubeTensor<R>, rows: usize, seq: usize) -> (CubeCount, CubeDim, usize) {
    let shared = like.client.properties().hardware.max_shared_memory_size;
    let per_cube = rows_per_cube(seq, shared).expect("a shape `supports` accepts");
    let (count, dim) = row_cubes(like, rows, per_cube, 0);
    (count, dim, per_cube as usize * seq)
}

/// A launch's scalar arguments.
struct Scalars {
    rows: u32,
    seq: u32,
    heads: u32,
    d_k: u32,
    sqrt_d_k: f32,
}

impl Scalars {
    /// What a launch of `kernel` over `count` cubes of `dim` moves and computes: four values per
    /// position and column of a head (projections and context or their gradients), `scores`
    /// values per score, four flops per score and column. A row's lanes score its keys (a dot
    /// product each) and then sum its columns over the keys; a key-side row only the latter.
    fn work(&self, kernel: &'static str, count: &CubeCount, dim: CubeDim, scores: usize, key_side: bool) -> Work {
        let (rows, seq, d_k) = (self.rows as usize, self.seq as usize, self.d_k as usize);
        let lanes = LANES as usize;
        let (key_steps, column_steps) = (seq.div_ceil(lanes), d_k.div_ceil(lanes));
        let work =
            Work::of(kernel, count, dim).moves(4 * rows * d_k + scores * rows * seq).computes(4 * rows * seq * d_k);
        match key_side {
            true => work.waits(column_steps * seq, 0),
            false => work.waits(key_steps * d_k + column_steps * seq, 2 * tree_reads(lanes) + 2 * key_steps),
        }
    }

    /// For `projected` `[batch · seq, 3 · heads · d_k]` and `padding` `[batch, seq]`.
    fn of<R: CubeRuntime>(spec: &AttentionSpec, projected: &CubeTensor<R>, padding: &CubeTensor<R>) -> Self {
        let [batch, seq] = padding.shape().dims::<2>();
        let d_k = projected.shape().dims::<2>()[1] / (3 * spec.heads);
        Self {
            rows: (batch * spec.heads * seq) as u32,
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
    let (count, dim, scores) = geometry(&projected, n.rows as usize, seq);
    note(|| n.work("attention::forward_kernel", &count, dim, 1, false));
    forward_kernel::launch::<R>(
        &projected.client.clone(),
        count,
        dim,
        projected.clone().into_tensor_arg(),
        padding.clone().into_tensor_arg(),
        weights.clone().into_tensor_arg(),
        context.clone().into_tensor_arg(),
        n.rows,
        n.seq,
        n.heads,
        n.d_k,
        n.sqrt_d_k,
        spec.min_float,
        key_0,
        key_1,
        spec.dropout.threshold,
        spec.dropout.scale,
        scores,
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
    let (count, dim, scores) = geometry(&projected, n.rows as usize, n.seq as usize);
    note(|| n.work("attention::query_gradient_kernel", &count, dim, 2, false));
    note(|| n.work("attention::key_value_gradient_kernel", &count, dim, 2, true));
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
        n.rows,
        n.seq,
        n.heads,
        n.d_k,
        n.sqrt_d_k,
        key_0,
        key_1,
        spec.dropout.threshold,
        spec.dropout.scale,
        scores,
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
        n.rows,
        n.seq,
        n.heads,
        n.d_k,
    );
    d_projected
}

#[cfg(test)]
mod tests {
    use super::rows_per_cube;

    #[test]
    fn a_cube_holds_the_rows_of_scores_its_shared_memory_takes_beside_the_tree() {
        // 16 KiB is 4,096 values, 256 of them the tree's.
        assert_eq!(rows_per_cube(64, 16_384), Some(8));
        assert_eq!(rows_per_cube(1_000, 16_384), Some(3));
        assert_eq!(rows_per_cube(3_840, 16_384), Some(1));
        assert_eq!(rows_per_cube(3_841, 16_384), None);
        assert_eq!(rows_per_cube(256, 49_152), Some(8));
        assert_eq!(rows_per_cube(1, 1_000), None);
    }
}
