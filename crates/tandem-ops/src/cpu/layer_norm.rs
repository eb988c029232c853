//! Layer normalisation's normalising part, `(x − mean) / √(var + ε)` over the last dimension,
//! forward and backward: one vectorised pass per row each way.

use burn::tensor::TensorData;
use tandem_simd::Kernel;

use super::dispatch::{values, values_mut};
use super::host_math::{dot, sum};
use super::host_op::{row_len, HostOp};

/// Layer normalisation's normalising part, `(x − mean) / √(var + ε)` over the last dimension,
/// as a [`HostOp`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Normalize {
    pub(crate) epsilon: f32,
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
        tandem_simd::run(NormalizeRows {
            x: values(&x),
            out: &mut out,
            inverse: &mut inverse,
            row,
            epsilon: self.epsilon,
        });
        let out = TensorData::new(out, x.shape.clone());
        (out.clone(), (out, inverse))
    }

    /// Per row, `(g − mean(g) − x̂ · mean(g ⊙ x̂)) / √(var + ε)`.
    fn backward(self, (normalized, inverse): &Self::Kept, mut grad: TensorData) -> TensorData {
        let row = row_len(normalized);
        tandem_simd::run(NormalizeRowsBackward {
            normalized: values(normalized),
            inverse,
            grad: values_mut(&mut grad),
            row,
        });
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
