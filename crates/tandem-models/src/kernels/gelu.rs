//! GELU, `x · Φ(x)` (the exact form, as Burn's), with its own backward pass on Flex.
//!
//! Flex computes `erf` and `exp` as scalar libm calls, one per value, forward and backward: 12 %
//! of a Transformer training step (`perf`, 2 layers, feed-forward 256). Here both passes are one
//! vectorised loop over [`crate::host_math`]'s polynomials ([`crate::host_op`]). Other backends
//! run Burn's `gelu`. Not ndarray either: its backward pass (Burn's default) is the derivative of
//! GELU's tanh approximation, about 1e-3 off the exact one used here and by Flex, so the fused
//! Transformer would no longer compute what the stock one does there.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::dispatch::{values, values_mut};
use crate::host_math::{normal_cdf, normal_pdf};
use crate::host_op::{self, HostOp};
use crate::wide::{self, Kernel};

/// `x · Φ(x)`, element by element (Φ: the standard normal distribution function).
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    host_op::apply(Gelu, x.clone()).unwrap_or_else(|| burn::tensor::activation::gelu(x))
}

/// Whether [`gelu`] runs with its own backward pass on `B`.
pub fn has_own_backward<B: Backend>() -> bool {
    host_op::one_node::<B, Gelu>()
}

#[derive(Clone, Copy, Debug)]
struct Gelu;

impl HostOp for Gelu {
    const ON_NDARRAY: bool = false;
    const WITHOUT_AUTODIFF: bool = true; // Flex's plain GELU calls libm's erf too

    /// Keeps `x`.
    type Kept = TensorData;

    fn forward(self, x: TensorData) -> (TensorData, TensorData) {
        let mut out = vec![0f32; x.num_elements()];
        wide::run(Values { x: values(&x), out: &mut out });
        (TensorData::new(out, x.shape.clone()), x)
    }

    fn backward(self, x: &TensorData, mut grad: TensorData) -> TensorData {
        wide::run(Derivative { x: values(x), grad: values_mut(&mut grad) });
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
