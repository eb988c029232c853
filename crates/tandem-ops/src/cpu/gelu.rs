//! GELU, `x · Φ(x)` (the exact form, as Burn's), and its derivative: one vectorised loop each over
//! [`super::host_math`]'s polynomials (Flex computes `erf` and `exp` as scalar libm calls, one
//! per value).

use burn::tensor::TensorData;
use tandem_simd::Kernel;

use super::dispatch::{values, values_mut};
use super::host_math::{normal_cdf, normal_pdf};
use super::host_op::HostOp;

/// GELU as a [`HostOp`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gelu;

impl HostOp for Gelu {
    const ON_NDARRAY: bool = false;
    const WITHOUT_AUTODIFF: bool = true; // Flex's plain GELU calls libm's erf too

    /// Keeps `x`.
    type Kept = TensorData;

    fn forward(self, x: TensorData) -> (TensorData, TensorData) {
        let mut out = vec![0f32; x.num_elements()];
        tandem_simd::run(Values { x: values(&x), out: &mut out });
        (TensorData::new(out, x.shape.clone()), x)
    }

    fn backward(self, x: &TensorData, mut grad: TensorData) -> TensorData {
        tandem_simd::run(Derivative { x: values(x), grad: values_mut(&mut grad) });
        grad
    }
}

/// GELU of `x` into `out`.
struct Values<'a> {
    x: &'a [f32],
    out: &'a mut [f32],
}

impl Kernel for Values<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        for (out, &x) in self.out.iter_mut().zip(self.x) {
            *out = x * normal_cdf(x);
        }
    }
}

/// The output's gradient `grad` times GELU's derivative at `x`, `Φ(x) + x φ(x)`, in place.
struct Derivative<'a> {
    x: &'a [f32],
    grad: &'a mut [f32],
}

impl Kernel for Derivative<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        for (grad, &x) in self.grad.iter_mut().zip(self.x) {
            *grad *= normal_cdf(x) + x * normal_pdf(x);
        }
    }
}
