//! Layer normalisation with its scale γ and shift β as one kernel forward and one backward, where
//! Burn runs about seven operations forward (mean, subtract, square, mean, add ε, square root,
//! divide, then scale and shift) and more backward, the parameters' gradients among them.
//!
//! Forward, a row to [`LANES`] lanes ([`super::lanes`]): `x̂ = (x − mean) / √(var + ε)`, then
//! `x̂ · γ + β`; it keeps `x̂` and `1 / √(var + ε)` per row. Backward, in one launch, cubes of two
//! kinds: rows' cubes write `∂x = (g − mean(g) − x̂ · mean(g ⊙ x̂)) / √(var + ε)` with `g = ∂y ⊙ γ`,
//! and a cube per column sums `∂γ = Σ ∂y ⊙ x̂` and `∂β = Σ ∂y` over the rows, its units a row
//! apart (a Transformer's `d_model` cubes, each unit's loop `rows / 256` long).

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::empty_like;
use super::lanes::{row_cubes, row_span, row_sum, tree, tree_reads, CUBE_UNITS, LANES, ROWS_PER_CUBE};
use super::rows::rows_of;
use crate::ledger::{note, Work};

/// What the backward kernel reads, as tensors `T` of the backend.
#[derive(Clone, Debug)]
pub(crate) struct LayerNormTape<T> {
    /// `x̂`, the input's shape.
    pub normalized: T,
    /// `1 / √(var + ε)` per row.
    pub inverse: T,
    pub gamma: T,
}

#[cube(launch)]
fn forward_kernel(
    x: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    out: &mut Tensor<f32>,
    normalized: &mut Tensor<f32>,
    inverse: &mut Tensor<f32>,
    rows: u32,
    width: u32,
    epsilon: f32,
) {
    let mut shared = SharedMemory::<f32>::new(CUBE_UNITS as usize);
    let (row, lane, start, length) = row_span(rows, width);
    let (lanes, n) = (LANES as usize, width as f32);
    let mut sum = 0.0f32;
    let mut j = lane;
    while j < length {
        sum += x[start + j];
        j += lanes;
    }
    let mean = row_sum(&mut shared, sum) / n;
    let mut squares = 0.0f32;
    j = lane;
    while j < length {
        let centred = x[start + j] - mean;
        squares += centred * centred;
        j += lanes;
    }
    let denominator = (row_sum(&mut shared, squares) / n + epsilon).sqrt();
    j = lane;
    while j < length {
        let x_hat = (x[start + j] - mean) / denominator;
        normalized[start + j] = x_hat;
        out[start + j] = x_hat * gamma[j] + beta[j];
        j += lanes;
    }
    if lane == 0 && length > 0 {
        inverse[row] = 1.0 / denominator;
    }
}

/// Cubes of two kinds in one launch: the first `cubes_of_rows` work rows, as forward, and write
/// `∂x`; each of the next `width` sums one column of `∂γ` and `∂β` over all rows, its
/// [`CUBE_UNITS`] units a row apart, then as a tree.
#[cube(launch)]
fn backward_kernel(
    normalized: &Tensor<f32>,
    inverse: &Tensor<f32>,
    gamma: &Tensor<f32>,
    grad: &Tensor<f32>,
    d_x: &mut Tensor<f32>,
    d_gamma: &mut Tensor<f32>,
    d_beta: &mut Tensor<f32>,
    rows: u32,
    width: u32,
    cubes_of_rows: u32,
) {
    let mut first = SharedMemory::<f32>::new(CUBE_UNITS as usize);
    let mut second = SharedMemory::<f32>::new(CUBE_UNITS as usize);
    let cubes_of_rows = cubes_of_rows as usize;
    if CUBE_POS < cubes_of_rows {
        let (row, lane, start, length) = row_span(rows, width);
        let lanes = LANES as usize;
        let mut sum = 0.0f32;
        let mut dot = 0.0f32;
        let mut j = lane;
        while j < length {
            let g = grad[start + j] * gamma[j];
            sum += g;
            dot += g * normalized[start + j];
            j += lanes;
        }
        let n = width as f32;
        let mean = row_sum(&mut first, sum) / n;
        let mean_dot = row_sum(&mut second, dot) / n;
        if length > 0 {
            let scale = inverse[row];
            j = lane;
            while j < length {
                let g = grad[start + j] * gamma[j];
                d_x[start + j] = (g - mean - normalized[start + j] * mean_dot) * scale;
                j += lanes;
            }
        }
    } else if CUBE_POS - cubes_of_rows < width as usize {
        let (rows, width) = (rows as usize, width as usize);
        let column = CUBE_POS - cubes_of_rows;
        let (unit, units) = (UNIT_POS as usize, CUBE_UNITS as usize);
        let mut scale_total = 0.0f32;
        let mut shift_total = 0.0f32;
        let mut row = unit;
        while row < rows {
            let g = grad[row * width + column];
            scale_total += g * normalized[row * width + column];
            shift_total += g;
            row += units;
        }
        let scale_total = tree(&mut first, 0, unit, units, scale_total, false);
        let shift_total = tree(&mut second, 0, unit, units, shift_total, false);
        if unit == 0 {
            d_gamma[column] = scale_total;
            d_beta[column] = shift_total;
        }
    }
}

/// Layer norm of `x` over its last dimension with scale `gamma` and shift `beta` (f32, that
/// dimension's length): the output, and what [`backward`] reads.
pub(crate) fn forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    beta: CubeTensor<R>,
    epsilon: f32,
) -> (CubeTensor<R>, LayerNormTape<CubeTensor<R>>) {
    let [x, gamma, beta] = [x, gamma, beta].map(into_contiguous);
    let shape = x.shape();
    let (rows, width) = rows_of(&shape);
    let [out, normalized] = [0; 2].map(|_| empty_like(&x, shape.clone()));
    let inverse = empty_like(&x, Shape::new([rows]));
    let (count, dim) = row_cubes(&x, rows, ROWS_PER_CUBE, 0);
    note(|| {
        let work = Work::of("layer_norm::forward_kernel", &count, dim).moves(3 * rows * width + 2 * width + rows);
        work.computes(8 * rows * width).waits(3 * width.div_ceil(LANES as usize), 2 * tree_reads(LANES as usize))
    });
    forward_kernel::launch::<R>(
        &x.client.clone(),
        count,
        dim,
        x.into_tensor_arg(),
        gamma.clone().into_tensor_arg(),
        beta.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        normalized.clone().into_tensor_arg(),
        inverse.clone().into_tensor_arg(),
        rows as u32,
        width as u32,
        epsilon,
    );
    (out, LayerNormTape { normalized, inverse, gamma })
}

/// The gradients of the input, γ and β from the output's, `grad`.
pub(crate) fn backward<R: CubeRuntime>(tape: LayerNormTape<CubeTensor<R>>, grad: CubeTensor<R>) -> [CubeTensor<R>; 3] {
    let LayerNormTape { normalized, inverse, gamma } = tape;
    let grad = into_contiguous(grad);
    let shape = grad.shape();
    let (rows, width) = rows_of(&shape);
    let d_x = empty_like(&grad, shape);
    let [d_gamma, d_beta] = [0; 2].map(|_| empty_like(&grad, Shape::new([width])));
    let (count, dim) = row_cubes(&grad, rows, ROWS_PER_CUBE, width);
    note(|| {
        let work = Work::of("layer_norm::backward_kernel", &count, dim).moves(3 * rows * width + 3 * width + rows);
        // The longer of a row's three passes and a column's walk down the rows.
        let reads = (3 * width.div_ceil(LANES as usize)).max(rows.div_ceil(CUBE_UNITS as usize));
        work.computes(12 * rows * width).waits(reads, 2 * tree_reads(CUBE_UNITS as usize))
    });
    backward_kernel::launch::<R>(
        &grad.client.clone(),
        count,
        dim,
        normalized.into_tensor_arg(),
        inverse.into_tensor_arg(),
        gamma.into_tensor_arg(),
        grad.into_tensor_arg(),
        d_x.clone().into_tensor_arg(),
        d_gamma.clone().into_tensor_arg(),
        d_beta.clone().into_tensor_arg(),
        rows as u32,
        width as u32,
        rows.div_ceil(ROWS_PER_CUBE as usize) as u32,
    );
    [d_x, d_gamma, d_beta]
}
