//! Layer normalisation with its scale γ and shift β as one kernel forward and one backward, where
//! Burn runs about seven operations forward (mean, subtract, square, mean, add ε, square root,
//! divide, then scale and shift) and more backward, the parameters' gradients among them.
//!
//! Forward, one unit (thread) per row: `x̂ = (x − mean) / √(var + ε)`, then `x̂ · γ + β`; it keeps
//! `x̂` and `1 / √(var + ε)` per row. Backward, in one launch, units of two kinds: one per row
//! writes `∂x = (g − mean(g) − x̂ · mean(g ⊙ x̂)) / √(var + ε)` with `g = ∂y ⊙ γ`, and one per
//! column sums `∂γ = Σ ∂y ⊙ x̂` and `∂β = Σ ∂y` over the rows (a Transformer's `d_model` columns,
//! each a loop over the batch's rows).

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::rows::rows_of;
use super::{empty_like, one_unit_each};

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
    let row = ABSOLUTE_POS;
    if row < rows as usize {
        let (start, width) = (row * width as usize, width as usize);
        let n = width as f32;
        let mut sum = 0.0f32;
        for j in 0..width {
            sum += x[start + j];
        }
        let mean = sum / n;
        let mut squares = 0.0f32;
        for j in 0..width {
            let centred = x[start + j] - mean;
            squares += centred * centred;
        }
        let denominator = (squares / n + epsilon).sqrt();
        for j in 0..width {
            let x_hat = (x[start + j] - mean) / denominator;
            normalized[start + j] = x_hat;
            out[start + j] = x_hat * gamma[j] + beta[j];
        }
        inverse[row] = 1.0 / denominator;
    }
}

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
) {
    let unit = ABSOLUTE_POS;
    let (rows, width) = (rows as usize, width as usize);
    if unit < rows {
        let start = unit * width;
        let n = width as f32;
        let mut sum = 0.0f32;
        let mut dot = 0.0f32;
        for j in 0..width {
            let g = grad[start + j] * gamma[j];
            sum += g;
            dot += g * normalized[start + j];
        }
        let (mean, mean_dot, scale) = (sum / n, dot / n, inverse[unit]);
        for j in 0..width {
            let g = grad[start + j] * gamma[j];
            d_x[start + j] = (g - mean - normalized[start + j] * mean_dot) * scale;
        }
    }
    if unit < width {
        let mut scale_total = 0.0f32;
        let mut shift_total = 0.0f32;
        for row in 0..rows {
            let g = grad[row * width + unit];
            scale_total += g * normalized[row * width + unit];
            shift_total += g;
        }
        d_gamma[unit] = scale_total;
        d_beta[unit] = shift_total;
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
    let (count, dim) = one_unit_each(&x, rows);
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
    let (count, dim) = one_unit_each(&grad, rows.max(width));
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
    );
    [d_x, d_gamma, d_beta]
}
