//! A gradient's squared L2 norm read in place on Flex, for global-norm clipping.
//!
//! Burn's `square().sum()` first writes a squared copy of the tensor and then reads it: over the
//! 20,000 × 128 embedding table's gradient that is 20 MB of memory traffic beside the 10 MB read,
//! on every step. Here the values are read once, where they are.

use std::any::Any;

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use tandem_simd::Kernel;

/// `‖tensor‖²`, summed in f64 in one read of its values, where `B` is Flex and the tensor is f32
/// and contiguous; `None` elsewhere (the caller then asks Burn).
pub(super) fn squared_sum_in_place<B: Backend, const D: usize>(tensor: &Tensor<B, D>) -> Option<f64> {
    if std::any::TypeId::of::<B>() != std::any::TypeId::of::<Flex>() {
        return None;
    }
    // A second handle to the same buffer: nothing is copied.
    let primitive = tensor.clone().into_primitive().tensor();
    let flex = (&primitive as &dyn Any).downcast_ref::<FlexTensor>()?;
    Some(tandem_simd::run(SquaredSum(flex.as_slice::<f32>()?)))
}

/// Lanes of partial sums, so that the additions vectorise and do not wait on one another.
const LANES: usize = 16;

/// The sum of the squares of f32 values, in f64.
struct SquaredSum<'a>(&'a [f32]);

impl Kernel for SquaredSum<'_> {
    type Output = f64;

    #[inline(always)]
    fn run(self) -> f64 {
        let mut lanes = [0f64; LANES];
        let chunks = self.0.chunks_exact(LANES);
        let rest: f64 = chunks.remainder().iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        for chunk in chunks {
            for (lane, &v) in lanes.iter_mut().zip(chunk) {
                *lane += f64::from(v) * f64::from(v);
            }
        }
        lanes.iter().sum::<f64>() + rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_squares_of_a_flex_tensor_and_declines_other_backends() {
        let values: Vec<f32> = (0..1_000).map(|i| (i as f32 - 500.0) / 37.0).collect();
        let expected: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let flex =
            Tensor::<Flex, 2>::from_data(burn::tensor::TensorData::new(values.clone(), [40, 25]), &Default::default());
        let got = squared_sum_in_place(&flex).expect("a contiguous f32 Flex tensor");
        assert!((got - expected).abs() <= 1e-12 * expected, "{got} vs {expected}");
        // A transposed view is not contiguous: Burn's path then.
        assert_eq!(squared_sum_in_place(&flex.clone().transpose()), None);
        let ndarray = Tensor::<burn::backend::NdArray, 2>::from_data(
            burn::tensor::TensorData::new(values, [40, 25]),
            &Default::default(),
        );
        assert_eq!(squared_sum_in_place(&ndarray), None);
    }
}
