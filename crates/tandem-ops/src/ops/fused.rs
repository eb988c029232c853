//! Faster forward passes over Burn's own layer modules: the same parameters, the same maths,
//! fewer and larger tensor operations.
//!
//! Stock Burn runs an LSTM step as 8 small matmuls and 8 bias additions (one each per gate, for
//! the input and the hidden state), records each of them for autodiff, and writes each step's
//! output into the sequence with a `slice_assign`, whose backward copies the whole sequence again
//! at every step. Here:
//! - the input projection of every time step is one matmul ([`super::linear`]: one autodiff
//!   node on the CPU backends; the LSTM's input bias joins its hidden bias), and the time loop
//!   (one matmul of `h` by all gates' hidden weights per step) is one autodiff operation with a
//!   hand-written backward pass ([`super::recurrence`]);
//! - the CNN's convolutions of every width and their max pooling are one operation
//!   ([`super::conv_max`]) whose backward uses that each maximum came from one window;
//! - a Transformer encoder layer runs every linear layer on `[batch × seq, features]` rows. Burn
//!   applies a `Linear` to a 3-D input as a *batched* matmul, so its weight gradient is one small
//!   matmul per sample, summed afterwards (a `[batch, in, out]` intermediate); on rows it is one
//!   large matmul ([`super::linear`]). The padding mask is expanded to the scores' shape once
//!   per layer instead of being broadcast by each `mask_fill` (forward and backward). On the CPU
//!   backends, GELU, the scores' softmax, the head split and merge, and layer norm's normalising
//!   part are one autodiff node each ([`super::host_ops`]); on the GPU backends attention's core
//!   (scores to context) is one ([`super::attention`]).
//!
//! The fused weights are concatenated from the stock modules' parameters on every forward pass
//! (a few hundred kB), so gradients flow back to those parameters, a model trains the same either
//! way (up to float rounding: sums are grouped differently), and checkpoints do not depend on
//! the path. These functions assume the configuration
//! Tandem builds: biases, sigmoid / tanh activations, no clipping, GRU `reset_after`, Conv1d with
//! stride 1, dilation 1, one group and no padding, and layer norms with the ε of Burn's
//! `TransformerEncoderConfig` default (`LayerNorm` keeps its own private).

pub use crate::ops::embedding::{embedded_on_gpu, masked_embedding};
pub use crate::ops::rows::dropout;
use burn::nn::activation::Activation;
use burn::nn::attention::MultiHeadAttention;
use burn::nn::conv::Conv1d;
use burn::nn::gru::{BiGru, Gru};
use burn::nn::lstm::{BiLstm, Lstm};
use burn::nn::transformer::{PositionWiseFeedForward, TransformerEncoderConfig, TransformerEncoderLayer};
use burn::nn::{GateController, Linear};
use burn::tensor::activation::{quiet_softmax, relu};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

use super::attention;
use super::concat::concat;
use super::conv_max::{conv_max, Widths};
use super::host_ops::{gelu, layer_norm, permute, softmax_last};
use super::linear::linear_rows;
use super::recurrence::{recurrence, Cell};

/// A stock layer's parameters laid side by side: `[d_in, gates × hidden]` input weights,
/// `[hidden, gates × hidden]` hidden weights, and the two biases.
struct GateWeights<B: Backend> {
    input: Tensor<B, 2>,
    input_bias: Tensor<B, 1>,
    hidden: Tensor<B, 2>,
    hidden_bias: Tensor<B, 1>,
}

impl<B: Backend> GateWeights<B> {
    fn of(gates: &[&GateController<B>]) -> Self {
        let weights = |pick: fn(&GateController<B>) -> &Linear<B>| -> Tensor<B, 2> {
            concat(gates.iter().map(|g| pick(g).weight.val()).collect(), 1)
        };
        let biases = |pick: fn(&GateController<B>) -> &Linear<B>| -> Tensor<B, 1> {
            concat(
                gates
                    .iter()
                    .map(|g| pick(g).bias.as_ref().expect("Tandem builds recurrent layers with biases").val())
                    .collect(),
                0,
            )
        };
        Self {
            input: weights(|g| &g.input_transform),
            input_bias: biases(|g| &g.input_transform),
            hidden: weights(|g| &g.hidden_transform),
            hidden_bias: biases(|g| &g.hidden_transform),
        }
    }
}

/// `[batch, seq, d_in]` → `[batch, seq, hidden]`: the input projection of every step in one
/// matmul, then the time loop as one autodiff operation ([`recurrence`]).
fn run<B: Backend>(cell: Cell, w: GateWeights<B>, x: Tensor<B, 3>, reverse: bool) -> Tensor<B, 3> {
    let [batch, seq, d_in] = x.dims();
    let width = w.input.dims()[1];
    let x = x.reshape([batch * seq, d_in]);
    let (projected, bias) = match cell {
        // Both biases reach every LSTM gate unscaled: their sum joins the hidden side, which the
        // time loop adds anyway, and the input projection writes its rows once.
        Cell::Lstm => (linear_rows(x, w.input, None), w.hidden_bias + w.input_bias),
        // The GRU's reset gate scales the hidden side of `n` only, not its input bias.
        Cell::Gru => (linear_rows(x, w.input, Some(w.input_bias)), w.hidden_bias),
    };
    recurrence(cell, projected.reshape([batch, seq, width]), w.hidden, bias, reverse)
}

/// `[batch, seq, d_in]` → `[batch, seq, hidden]` through `lstm`'s parameters.
pub fn lstm<B: Backend>(lstm: &Lstm<B>, x: Tensor<B, 3>, reverse: bool) -> Tensor<B, 3> {
    let w = GateWeights::of(&[&lstm.input_gate, &lstm.forget_gate, &lstm.output_gate, &lstm.cell_gate]);
    run(Cell::Lstm, w, x, reverse)
}

/// `[batch, seq, d_in]` → `[batch, seq, hidden]` through `gru`'s parameters.
pub fn gru<B: Backend>(gru: &Gru<B>, x: Tensor<B, 3>, reverse: bool) -> Tensor<B, 3> {
    debug_assert!(gru.reset_after, "the fused GRU applies the reset gate after the hidden matmul");
    let w = GateWeights::of(&[&gru.update_gate, &gru.reset_gate, &gru.new_gate]);
    run(Cell::Gru, w, x, reverse)
}

/// Both directions of `bi`, concatenated on the feature axis as Burn's `BiLstm` does.
pub fn bi_lstm<B: Backend>(bi: &BiLstm<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    concat(vec![lstm(&bi.forward, x.clone(), false), lstm(&bi.reverse, x, true)], 2)
}

/// Both directions of `bi`, concatenated on the feature axis as Burn's `BiGru` does.
pub fn bi_gru<B: Backend>(bi: &BiGru<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    concat(vec![gru(&bi.forward, x.clone(), false), gru(&bi.reverse, x, true)], 2)
}

/// `[batch, seq, channels]` → `[batch, filters × widths]`: every convolution → max over the
/// positions where its kernel fits → ReLU (ReLU commutes with max, so it runs on the pooled
/// values), as one [`conv_max`] over the kernels side by side.
pub fn conv_pool<B: Backend>(convs: &[Conv1d<B>], x: Tensor<B, 3>) -> Tensor<B, 2> {
    let channels = x.dims()[2];
    let device = x.device();
    let widths = Widths(convs.iter().map(|c| (c.kernel_size, c.weight.dims()[0])).collect());
    let widest = widths.widest();
    // Column f of a width-w kernel: row k × channels + c = offset k, channel c; zeros past w.
    let weight = concat(
        convs
            .iter()
            .map(|c| {
                let [filters, _, width] = c.weight.dims();
                let w = c.weight.val();
                let w = if width < widest {
                    concat(vec![w, Tensor::zeros([filters, channels, widest - width], &device)], 2)
                } else {
                    w
                };
                w.swap_dims(1, 2).reshape([filters, widest * channels]).transpose()
            })
            .collect(),
        1,
    );
    // Bias after the max: max(y + b) = max(y) + b, on `filters` values per sample instead of per position.
    let bias = concat(
        convs.iter().map(|c| c.bias.as_ref().expect("Tandem builds convolutions with biases").val()).collect(),
        0,
    );
    relu(conv_max(x, weight, &widths) + bias.unsqueeze())
}

/// `[batch, seq, d_model]` → `[batch, seq, d_model]` through `layer`'s parameters, as Burn's
/// `TransformerEncoderLayer::forward` with a padding mask (`true` at padding) and no attention
/// mask: the same operations, dropouts drawn in the same order, on rows of features.
pub fn encoder_layer<B: Backend>(
    layer: &TransformerEncoderLayer<B>,
    x: Tensor<B, 3>,
    mask_pad: &Tensor<B, 2, Bool>,
) -> Tensor<B, 3> {
    let attend = |x: Tensor<B, 3>| dropout(&layer.dropout, attention(&layer.mha, x, mask_pad));
    let feed_forward = |x: Tensor<B, 3>| dropout(&layer.dropout, position_wise(&layer.pwff, x));
    // The ε Tandem's encoder configuration leaves at Burn's default (the layer keeps it private).
    let epsilon = TransformerEncoderConfig::new(1, 1, 1, 1).layer_norm_eps;
    let (norm_1, norm_2) = (|x| layer_norm(&layer.norm_1, x, epsilon), |x| layer_norm(&layer.norm_2, x, epsilon));
    if layer.norm_first {
        let x = x.clone() + attend(norm_2(x));
        x.clone() + feed_forward(norm_1(x))
    } else {
        let x = norm_1(x.clone() + attend(x));
        norm_2(x.clone() + feed_forward(x))
    }
}

/// `linear` applied to every position of `[batch, seq, in]`, as one `[batch × seq, in]` matmul.
fn on_rows<B: Backend>(linear: &Linear<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let [batch, seq, d_in] = x.dims();
    let rows = x.reshape([batch * seq, d_in]);
    let out = linear_rows(rows, linear.weight.val(), linear.bias.as_ref().map(|b| b.val()));
    let d_out = out.dims()[1];
    out.reshape([batch, seq, d_out])
}

/// Burn's `MultiHeadAttention::forward` (self-attention, padding mask) on rows of features.
fn attention<B: Backend>(mha: &MultiHeadAttention<B>, x: Tensor<B, 3>, mask_pad: &Tensor<B, 2, Bool>) -> Tensor<B, 3> {
    let [batch, seq, d_model] = x.dims();
    if let Some(context) = attention::on_gpu(mha, x.clone().reshape([batch * seq, d_model]), mask_pad) {
        return on_rows(&mha.output, context.reshape([batch, seq, d_model]));
    }
    // Heads as `[batch, heads, seq, d_k]`; keys as `[batch, heads, d_k, seq]`, ready for `q · kᵀ`.
    let heads = |linear: &Linear<B>, axes| {
        permute(on_rows(linear, x.clone()).reshape([batch, seq, mha.n_heads, mha.d_k]), axes)
    };
    let (query, key_t, value) =
        (heads(&mha.query, [0, 2, 1, 3]), heads(&mha.key, [0, 2, 3, 1]), heads(&mha.value, [0, 2, 1, 3]));
    let scores = dropout(&mha.dropout, query.matmul(key_t).div_scalar((mha.d_k as f32).sqrt()));
    // Expanded (a copy) once here; a broadcast mask would be expanded by every mask_fill.
    let mask = mask_pad.clone().reshape([batch, 1, 1, seq]).repeat_dim(1, mha.n_heads).repeat_dim(2, seq);
    let scores = scores.mask_fill(mask, mha.min_float);
    let weights = if mha.quiet_softmax { quiet_softmax(scores, 3) } else { softmax_last(scores) };
    let context = permute(weights.matmul(value), [0, 2, 1, 3]).reshape([batch, seq, d_model]);
    on_rows(&mha.output, context)
}

/// Burn's `PositionWiseFeedForward::forward` on rows of features.
fn position_wise<B: Backend>(pwff: &PositionWiseFeedForward<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let inner = on_rows(&pwff.linear_inner, x);
    let activated = match &pwff.activation {
        Activation::Gelu(_) => gelu(inner),
        other => other.forward(inner),
    };
    let inner = dropout(&pwff.dropout, activated);
    on_rows(&pwff.linear_outer, inner)
}
