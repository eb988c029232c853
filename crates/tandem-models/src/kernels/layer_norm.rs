//! Layer normalisation with the normalising part as one operation with its own backward pass on
//! the CPU backends.
//!
//! `LayerNorm::forward` runs, under autodiff, as Burn's default decomposition: mean, subtract,
//! square, mean, add ε, square root, divide (then scale and shift), each allocating its result
//! and recording its own backward; about 6 % of a Transformer training step on Flex (`perf`).
//! Here `(x − mean) / √(var + ε)` over the last dimension is one vectorised pass per row each way
//! ([`crate::host_op`]); the scale γ and shift β stay tensor operations, so their gradients are
//! Burn's. Other backends, and Flex / ndarray without autodiff (one fused kernel there), run
//! `LayerNorm::forward`.

use burn::nn::LayerNorm;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::dispatch::{values, values_mut};
use crate::host_math::{dot, sum};
use crate::host_op::{self, row_len, HostOp};
use crate::wide::{self, Kernel};

/// `norm` applied to `x` over its last dimension, with `norm`'s ε given as `epsilon` (Burn keeps
/// the module's own private).
pub fn layer_norm<B: Backend, const D: usize>(norm: &LayerNorm<B>, x: Tensor<B, D>, epsilon: f64) -> Tensor<B, D> {
    match host_op::apply(Normalize { epsilon: epsilon as f32 }, x.clone()) {
        Some(normalized) => {
            let scaled = normalized * norm.gamma.val().unsqueeze();
            match &norm.beta {
                Some(beta) => scaled + beta.val().unsqueeze(),
                None => scaled,
            }
        }
        None => norm.forward(x),
    }
}

#[derive(Clone, Copy, Debug)]
struct Normalize {
    epsilon: f32,
}

impl HostOp for Normalize {
    const ON_NDARRAY: bool = true;
    const WITHOUT_AUTODIFF: bool = false; // Flex's plain layer norm is one fused kernel
    /// The output, and `1 / √(var + ε)` per row.
    type Kept = (TensorData, Vec<f32>);

    fn forward(self, x: TensorData) -> (TensorData, Self::Kept) {
        let row = row_len(&x);
        let mut out = vec![0f32; x.num_elements()];
        let mut inverse = vec![0f32; out.len() / row];
        wide::run(NormalizeRows { x: values(&x), out: &mut out, inverse: &mut inverse, row, epsilon: self.epsilon });
        let out = TensorData::new(out, x.shape.clone());
        (out.clone(), (out, inverse))
    }

    /// Per row, `(g − mean(g) − x̂ · mean(g ⊙ x̂)) / √(var + ε)`.
    fn backward(self, (normalized, inverse): &Self::Kept, mut grad: TensorData) -> TensorData {
        let row = row_len(normalized);
        wide::run(NormalizeRowsBackward { normalized: values(normalized), inverse, grad: values_mut(&mut grad), row });
        grad
    }
}

/// Each `row`-long row of `x` normalised into `out`, and its `1 / √(var + ε)` into `inverse`.
struct NormalizeRows<'a> {
    x: &'a [f32],
    out: &'a mut [f32],
    inverse: &'a mut [f32],
    row: usize,
    epsilon: f32,
}

impl Kernel for NormalizeRows<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let n = self.row as f32;
        for ((x, out), inverse) in
            self.x.chunks_exact(self.row).zip(self.out.chunks_exact_mut(self.row)).zip(self.inverse.iter_mut())
        {
            let mean = sum(x) / n;
            for (out, &x) in out.iter_mut().zip(x) {
                *out = x - mean;
            }
            let denominator = (dot(out, out) / n + self.epsilon).sqrt();
            for out in out.iter_mut() {
                *out /= denominator; // divided, not multiplied by the inverse: Burn's rounding
            }
            *inverse = 1.0 / denominator;
        }
    }
}

/// The input's gradient from the output's (`grad`, in place), per row.
struct NormalizeRowsBackward<'a> {
    normalized: &'a [f32],
    inverse: &'a [f32],
    grad: &'a mut [f32],
    row: usize,
}

impl Kernel for NormalizeRowsBackward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let n = self.row as f32;
        for ((x, g), &inverse) in
            self.normalized.chunks_exact(self.row).zip(self.grad.chunks_exact_mut(self.row)).zip(self.inverse)
        {
            let (mean_g, mean_gx) = (sum(g) / n, dot(g, x) / n);
            for (g, &x) in g.iter_mut().zip(x) {
                *g = (*g - mean_g - x * mean_gx) * inverse;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};
    use burn::nn::LayerNormConfig;
    use burn::tensor::{Distribution, Tensor};

    use super::layer_norm;

    type B = Autodiff<NdArray>;

    #[test]
    fn equals_burns_layer_norm_in_values_and_gradients() {
        let device = Default::default();
        let norm = LayerNormConfig::new(12).init::<B>(&device);
        let close = |what: &str, a: Tensor<NdArray, 3>, b: Tensor<NdArray, 3>| {
            let worst = (a - b).abs().max().into_scalar();
            assert!(worst < 1e-5, "{what}: largest difference {worst:e}");
        };
        {
            let width = 12;
            let x = Tensor::<B, 3>::random([2, 5, width], Distribution::Normal(1.0, 3.0), &device).require_grad();
            let weights = Tensor::<B, 3>::random([2, 5, width], Distribution::Normal(0.0, 1.0), &device);
            let ours = layer_norm(&norm, x.clone(), 1e-5);
            let burns = norm.forward(x.clone());
            close("values", ours.clone().inner(), burns.clone().inner());
            let grads = |y: Tensor<B, 3>| {
                let grads = (y * weights.clone()).sum().backward();
                let gamma = norm.gamma.grad(&grads).expect("γ has a gradient");
                (x.grad(&grads).expect("x has a gradient"), gamma.reshape([1, 1, width]))
            };
            let ((x_ours, gamma_ours), (x_burns, gamma_burns)) = (grads(ours), grads(burns));
            close("gradient of x", x_ours, x_burns);
            close("gradient of γ", gamma_ours, gamma_burns);
        }
    }
}
