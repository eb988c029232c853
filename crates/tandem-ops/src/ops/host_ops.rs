//! GELU, softmax, layer normalisation and permutation: on the CPU backends each is one autodiff
//! node over a host kernel ([`crate::cpu::host_op`]); on the GPU backends the first three are
//! GPU kernels ([`super::rows`], [`super::layer_norm`]); elsewhere Burn's operation runs.
//!
//! Under autodiff Burn runs each as several tensor operations, each allocating its result and
//! recording its own backward, with scalar libm calls, or (a copy of a permuted view) one value at
//! a time; shares below are of a Transformer training step on Flex (`perf`).

use burn::nn::LayerNorm;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::rows::on_gpu;
use crate::cpu::gelu::Gelu;
use crate::cpu::host_op;
use crate::cpu::layer_norm::Normalize;
use crate::cpu::permute::Permute;
use crate::cpu::softmax::Softmax;
use crate::row_op::RowOp;

/// `x · Φ(x)`, element by element (Φ: the standard normal distribution function), the exact form
/// as Burn's `gelu`.
///
/// Flex computes `erf` and `exp` as scalar libm calls, one per value, forward and backward (12 %
/// of a step with 2 layers, feed-forward 256); here both passes are one vectorised loop, on Flex
/// with and without autodiff. Not on ndarray: its backward pass (Burn's default) is the derivative
/// of GELU's tanh approximation, about 1e-3 off the exact one used here and by Flex, so the fused
/// Transformer would no longer compute what the stock one does there.
pub(crate) fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    on_gpu(RowOp::Gelu, x.clone())
        .or_else(|| host_op::apply(Gelu, x.clone()))
        .unwrap_or_else(|| burn::tensor::activation::gelu(x))
}

/// `exp(x − max) / Σ exp(x − max)` over the last dimension, as Burn's `softmax(x, D − 1)`.
///
/// Under autodiff Burn's `softmax` is five tensor operations (max, subtract, exp, sum, divide):
/// 12 % of a step. Flex and ndarray without autodiff run Burn's (one fused kernel there).
pub(crate) fn softmax_last<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    on_gpu(RowOp::Softmax, x.clone())
        .or_else(|| host_op::apply(Softmax, x.clone()))
        .unwrap_or_else(|| burn::tensor::activation::softmax(x, D - 1))
}

/// `norm` applied to `x` over its last dimension, with `norm`'s ε given as `epsilon` (Burn keeps
/// the module's own private).
///
/// `LayerNorm::forward` runs, under autodiff, as Burn's default decomposition: mean, subtract,
/// square, mean, add ε, square root, divide (then scale and shift), about 6 % of a step. On the
/// CPU backends the normalising part is one node, the scale γ and shift β stay tensor operations
/// (their gradients are Burn's); on the GPU backends all of it is one ([`super::layer_norm`]).
/// Flex and ndarray without autodiff run `LayerNorm::forward` (one fused kernel there).
pub(crate) fn layer_norm<B: Backend, const D: usize>(
    norm: &LayerNorm<B>,
    x: Tensor<B, D>,
    epsilon: f64,
) -> Tensor<B, D> {
    let epsilon = epsilon as f32;
    if let Some(y) = super::layer_norm::on_gpu(norm, x.clone(), epsilon) {
        return y;
    }
    match host_op::apply(Normalize { epsilon }, x.clone()) {
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

/// `x` with dimension `axes[i]` as dimension `i` (as `Tensor::permute`), contiguous on the CPU
/// backends (a view elsewhere): attention's head split and merge.
///
/// Burn permutes as a view, and the first reshape of that view (forward, or in the backward
/// pass) copies it on Flex one value at a time through a strided index: 10 % of a step.
pub(crate) fn permute<B: Backend>(x: Tensor<B, 4>, axes: [usize; 4]) -> Tensor<B, 4> {
    host_op::apply(Permute(axes), x.clone()).unwrap_or_else(|| x.permute(axes))
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};
    use burn::nn::LayerNormConfig;
    use burn::tensor::{Distribution, Tensor};

    use super::{layer_norm, permute};

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

    #[test]
    fn equals_burns_permute_forward_and_backward() {
        let device = Default::default();
        for axes in [[0, 2, 1, 3], [0, 2, 3, 1], [3, 1, 0, 2]] {
            let x = Tensor::<B, 4>::random([2, 3, 4, 5], Distribution::Normal(0.0, 1.0), &device).require_grad();
            let weights =
                Tensor::<B, 4>::random(x.clone().permute(axes).dims(), Distribution::Normal(0.0, 1.0), &device);
            let ours = permute(x.clone(), axes);
            let burns = x.clone().permute(axes);
            assert_eq!(ours.clone().into_data(), burns.clone().into_data(), "{axes:?} forward");
            let gradient = |y: Tensor<B, 4>| {
                x.grad(&(y * weights.clone()).sum().backward()).expect("x requires a gradient").into_data()
            };
            assert_eq!(gradient(ours), gradient(burns), "{axes:?} backward");
        }
    }
}
