//! A gradient's squared L2 norm read without a copy on Flex, for global-norm clipping.
//!
//! Burn's `square().sum()` first writes a squared copy of the tensor and then reads it: over the
//! 20,000 × 128 embedding table's gradient that is 20 MB of memory traffic beside the 10 MB read,
//! on every step. Here the values are read once, where they lie.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use tandem_simd::Kernel;

/// `‖tensor‖²`, summed in f64 in one read of its values, where `B` is Flex and the tensor is f32
/// and contiguous; `None` elsewhere (the caller then asks Burn).
pub(crate) fn squared_sum_without_copy<B: Backend, const D: usize>(tensor: &Tensor<B, D>) -> Option<f64> {
    // Checked first so that other backends do not even clone the handle.
    if crate::backend::Which::of::<B>() != crate::backend::Which::Flex {
        return None;
    }
    // A second handle to the same buffer: nothing is copied.
    let primitive = tensor.clone().into_primitive().tensor();
    let flex = (&primitive as &dyn std::any::Any).downcast_ref::<burn::backend::flex::FlexTensor>()?;
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
    use burn::backend::Flex;
    use burn::tensor::TensorData;

    /// The exact sum of the squares of `values`, in f64.
    fn expected(values: &[f32]) -> f64 {
        values.iter().map(|&v| f64::from(v) * f64::from(v)).sum()
    }

    #[test]
    fn sums_the_squares_of_a_flex_tensor_or_of_a_view_of_its_rows() {
        let values: Vec<f32> = (0..1_000).map(|i| (i as f32 - 500.0) / 37.0).collect();
        let flex = Tensor::<Flex, 2>::from_data(TensorData::new(values.clone(), [40, 25]), &Default::default());
        let close = |got: Option<f64>, want: f64| got.is_some_and(|got| (got - want).abs() <= 1e-12 * want);
        assert!(close(squared_sum_without_copy(&flex), expected(&values)));
        // Rows 10..20: a view into the same buffer, at an offset.
        let rows = flex.clone().narrow(0, 10, 10);
        let view = rows.clone().into_primitive().tensor();
        assert_eq!(view.layout().start_offset(), 250, "a view, not a copy");
        assert!(close(squared_sum_without_copy(&rows), expected(&values[250..500])));
    }

    #[test]
    fn declines_what_it_cannot_read_in_place() {
        let values: Vec<f32> = (0..1_000).map(|i| i as f32).collect();
        let flex = Tensor::<Flex, 2>::from_data(TensorData::new(values.clone(), [40, 25]), &Default::default());
        assert_eq!(squared_sum_without_copy(&flex.transpose()), None, "not contiguous");
        let doubles = TensorData::new(values.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), [40, 25]);
        let f64s = Tensor::<Flex, 2>::from_data(doubles, (&Default::default(), burn::tensor::DType::F64));
        assert_eq!(squared_sum_without_copy(&f64s), None, "not f32");
        let ndarray =
            Tensor::<burn::backend::NdArray, 2>::from_data(TensorData::new(values, [40, 25]), &Default::default());
        assert_eq!(squared_sum_without_copy(&ndarray), None, "not Flex");
    }
}
