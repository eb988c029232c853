//! Self-attention's core on the GPU backends compiled into this crate: scores, scale, dropout on
//! the scores, the padding mask, softmax and the weighted sum of the values as one kernel forward
//! and two backward ([`crate::gpu::GpuKernels::attention_forward`]), one autodiff node of the
//! queries, keys and values side by side. Elsewhere the caller runs Burn's operations.

use burn::nn::attention::MultiHeadAttention;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

/// The context `[batch · seq, d_model]` of `mha`'s self-attention over `x` `[batch · seq, d_model]`
/// (f32) under `mask_pad` `[batch, seq]` (`true` at padding), where `B` is a GPU backend compiled
/// into this crate and `mha` is what Tandem builds (biases, Burn's softmax); `None` elsewhere, with
/// nothing computed and no dropout drawn. The three projections are one matmul over their weights
/// side by side. Shapes whose kernel indices would pass `u32::MAX` ([`indices_fit`]), or whose
/// row of scores does not fit in the device's shared memory, run Burn's operations too.
pub(crate) fn on_gpu<B: Backend>(
    mha: &MultiHeadAttention<B>,
    x: Tensor<B, 2>,
    mask_pad: &Tensor<B, 2, Bool>,
) -> Option<Tensor<B, 2>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        let biased = [&mha.query, &mha.key, &mha.value].iter().all(|linear| linear.bias.is_some());
        let [batch, seq] = mask_pad.dims();
        let fits = indices_fit(batch, mha.n_heads, seq, mha.d_model);
        if biased && fits && !mha.quiet_softmax && x.dtype() == burn::tensor::DType::F32 {
            return crate::ops::gpu_path::run::<B, _>(gpu::Attention { mha, x, mask_pad }).ok().flatten();
        }
    }
    let _ = (mha, x, mask_pad);
    None
}

/// Whether every index the attention kernels compute (`u32`) fits: the scores' `batch · heads ·
/// seq²` and the projections' `3 · batch · seq · d_model` values.
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
pub(crate) fn indices_fit(batch: usize, heads: usize, seq: usize, d_model: usize) -> bool {
    let scores = batch.checked_mul(heads).and_then(|n| n.checked_mul(seq)).and_then(|n| n.checked_mul(seq));
    let projected = batch.checked_mul(seq).and_then(|n| n.checked_mul(3 * d_model));
    [scores, projected].iter().all(|n| n.is_some_and(|n| n <= u32::MAX as usize))
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu {
    use burn::backend::Autodiff;
    use burn::nn::attention::MultiHeadAttention;
    use burn::tensor::backend::Backend;
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{Bool, Tensor, TensorPrimitive};

    use crate::cpu::dispatch::same_type;
    use crate::dropout::Draw;
    use crate::gpu::{AttentionSpec, AttentionTape, GpuKernels};
    use crate::ops::concat::concat;
    use crate::ops::gpu_path::{gpu_node, padding_on, GpuBackward, GpuPath};
    use crate::ops::linear::linear_rows;

    /// One attention for [`crate::ops::gpu_path::run`].
    pub(super) struct Attention<'a, B: Backend> {
        pub(super) mha: &'a MultiHeadAttention<B>,
        pub(super) x: Tensor<B, 2>,
        pub(super) mask_pad: &'a Tensor<B, 2, Bool>,
    }

    impl<B: Backend> Attention<'_, B> {
        /// Whether `G`'s kernels take the sequence's length on the input's device.
        fn supported<G: GpuKernels>(&self) -> bool {
            let device = same_type::<_, G::Device>(self.x.device());
            G::attention_supports(self.mask_pad.dims()[1], &device)
        }

        /// The queries, keys and values side by side, `[batch · seq, 3 · d_model]`: one matmul.
        fn projected(&self) -> Tensor<B, 2> {
            let linears = [&self.mha.query, &self.mha.key, &self.mha.value];
            let weight = concat(linears.iter().map(|l| l.weight.val()).collect(), 1);
            let bias = linears.iter().map(|l| l.bias.as_ref().expect("checked by `on_gpu`").val()).collect();
            linear_rows(self.x.clone(), weight, Some(concat(bias, 0)))
        }

        /// The kernels' spec, with dropout drawn from the thread's stream or none, and the padding
        /// mask as floats on `G`.
        fn spec_and_padding<G: Backend>(&self, dropout: bool) -> (AttentionSpec, FloatTensor<G>) {
            let [batch, seq] = self.mask_pad.dims();
            let heads = self.mha.n_heads;
            let draw = match dropout {
                true => Draw::next(self.mha.dropout.prob, batch * heads * seq * seq),
                false => None,
            };
            let spec =
                AttentionSpec { heads, min_float: self.mha.min_float as f32, dropout: draw.unwrap_or(Draw::none()) };
            (spec, padding_on::<B, G>(self.mask_pad))
        }
    }

    impl<B: Backend> GpuPath<B> for Attention<'_, B> {
        /// `None` where the kernels do not take the shape on the device.
        type Output = Option<Tensor<B, 2>>;

        fn plain<G: GpuKernels>(self) -> Self::Output {
            if !self.supported::<G>() {
                return None;
            }
            let projected = same_type::<_, Tensor<G, 2>>(self.projected()).into_primitive().tensor();
            let (spec, padding) = self.spec_and_padding::<G>(false);
            let (context, _) = G::attention_forward(spec, projected, padding);
            Some(same_type(Tensor::<G, 2>::from_primitive(TensorPrimitive::Float(context))))
        }

        fn autodiff<G: GpuKernels>(self) -> Self::Output {
            if !self.supported::<G>() {
                return None;
            }
            let projected = same_type::<_, Tensor<Autodiff<G>, 2>>(self.projected()).into_primitive().tensor();
            let (spec, padding) = self.spec_and_padding::<G>(true);
            let context = gpu_node(Backward, [projected], |[projected], tracked| {
                let (context, tape) = G::attention_forward(spec, projected, padding);
                (context, tracked.then_some(tape))
            });
            Some(same_type(Tensor::<Autodiff<G>, 2>::from_primitive(TensorPrimitive::Float(context))))
        }
    }

    /// Attention's backward kernels, from the forward kernel's tape.
    #[derive(Debug)]
    struct Backward;

    impl<G: GpuKernels> GpuBackward<G, 1> for Backward {
        type Kept = AttentionTape<FloatTensor<G>>;

        fn input_gradients(self, tape: Self::Kept, grad: FloatTensor<G>) -> [FloatTensor<G>; 1] {
            [G::attention_backward(tape, grad)]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::indices_fit;

    #[test]
    fn shapes_whose_indices_pass_u32_are_refused() {
        // The reference shape, and 256 positions.
        assert!(indices_fit(64, 4, 64, 128));
        assert!(indices_fit(64, 4, 256, 128));
        // 2¹⁶ scores a head: 2¹⁶ heads' worth is 2³², one past the largest index.
        assert!(indices_fit(1, 65_535, 256, 128));
        assert!(!indices_fit(1, 65_536, 256, 128));
        assert!(!indices_fit(512, 8, 4_096, 512));
        // The projections alone.
        assert!(!indices_fit(1 << 20, 1, 1, 2_048));
        assert!(!indices_fit(usize::MAX, 2, 2, 2));
    }
}
