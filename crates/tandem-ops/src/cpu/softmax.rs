//! Softmax over the last dimension, forward and backward: one vectorised loop per row each way.

use burn::tensor::TensorData;
use tandem_simd::Kernel;

use super::dispatch::{values, values_mut};
use super::host_math::{dot, exp, max, sum};
use super::host_op::{row_len, HostOp};

/// Softmax over the last dimension as a [`HostOp`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Softmax;

impl HostOp for Softmax {
    const ON_NDARRAY: bool = true;
    const WITHOUT_AUTODIFF: bool = false; // Flex's plain softmax is one fused kernel

    /// Keeps the output `p`.
    type Kept = TensorData;

    fn forward(self, x: TensorData) -> (TensorData, TensorData) {
        let row = row_len(&x);
        let mut p = vec![0f32; x.num_elements()];
        tandem_simd::run(SoftmaxRows { x: values(&x), p: &mut p, row });
        let p = TensorData::new(p, x.shape.clone());
        (p.clone(), p)
    }

    /// Per row, `p ⊙ (g − Σ g ⊙ p)`.
    fn backward(self, p: &TensorData, mut grad: TensorData) -> TensorData {
        let row = row_len(p);
        tandem_simd::run(SoftmaxRowsBackward { p: values(p), grad: values_mut(&mut grad), row });
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
