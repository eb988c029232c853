//! Softmax over the last dimension with its own backward pass on the CPU backends.
//!
//! Under autodiff, Burn's `softmax` is five tensor operations (max, subtract, exp, sum, divide),
//! each allocating its result and recording its own backward: 12 % of a Transformer training
//! step on Flex (`perf`). Here each pass is one vectorised loop per row ([`crate::host_op`]).
//! Other backends, and Flex / ndarray without autodiff (where it is one fused kernel), run
//! Burn's `softmax`.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::dispatch::{values, values_mut};
use crate::host_math::{dot, exp, max, sum};
use crate::host_op::{self, row_len, HostOp};
use crate::wide::{self, Kernel};

/// `exp(x − max) / Σ exp(x − max)` over the last dimension, as Burn's `softmax(x, D − 1)`.
pub fn softmax_last<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    host_op::apply(Softmax, x.clone()).unwrap_or_else(|| burn::tensor::activation::softmax(x, D - 1))
}

/// Whether [`softmax_last`] runs with its own backward pass on `B`.
pub fn has_own_backward<B: Backend>() -> bool {
    host_op::one_node::<B, Softmax>()
}

#[derive(Clone, Copy, Debug)]
struct Softmax;

impl HostOp for Softmax {
    const ON_NDARRAY: bool = true;
    const WITHOUT_AUTODIFF: bool = false; // Flex's plain softmax is one fused kernel

    /// Keeps the output `p`.
    type Kept = TensorData;

    fn forward(self, x: TensorData) -> (TensorData, TensorData) {
        let row = row_len(&x);
        let mut p = vec![0f32; x.num_elements()];
        wide::run(SoftmaxRows { x: values(&x), p: &mut p, row });
        let p = TensorData::new(p, x.shape.clone());
        (p.clone(), p)
    }

    /// Per row, `p ⊙ (g − Σ g ⊙ p)`.
    fn backward(self, p: &TensorData, mut grad: TensorData) -> TensorData {
        let row = row_len(p);
        wide::run(SoftmaxRowsBackward { p: values(p), grad: values_mut(&mut grad), row });
        grad
    }
}

/// Softmax of each `row`-long row of `x` into `p`.
struct SoftmaxRows<'a> {
    x: &'a [f32],
    p: &'a mut [f32],
    row: usize,
}

impl Kernel for SoftmaxRows<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        for (x, p) in self.x.chunks_exact(self.row).zip(self.p.chunks_exact_mut(self.row)) {
            let max = max(x);
            // Below −87, `exp` (clamped there) would give 1.6e-38, where the exact value is a
            // subnormal or 0: give 0, so that masked positions (the most negative f32) get
            // exactly what Burn gives them.
            for (p, &x) in p.iter_mut().zip(x) {
                let shifted = x - max;
                *p = if shifted < -87.0 { 0.0 } else { exp(shifted) };
            }
            let sum = sum(p);
            for p in p.iter_mut() {
                *p /= sum;
            }
        }
    }
}

/// The input's gradient from the output's (`grad`, in place) and the output `p`, per row.
struct SoftmaxRowsBackward<'a> {
    p: &'a [f32],
    grad: &'a mut [f32],
    row: usize,
}

impl Kernel for SoftmaxRowsBackward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        for (p, g) in self.p.chunks_exact(self.row).zip(self.grad.chunks_exact_mut(self.row)) {
            let dot = dot(p, g);
            for (g, p) in g.iter_mut().zip(p) {
                *g = p * (*g - dot);
            }
        }
    }
}
