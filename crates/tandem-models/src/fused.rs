//! Faster forward passes over Burn's own layer modules: the same parameters, the same maths,
//! fewer and larger tensor operations.
//!
//! Stock Burn runs an LSTM step as 8 small matmuls and 8 bias additions (one each per gate, for
//! the input and the hidden state) and writes each step's output into the sequence with a
//! `slice_assign`, whose backward copies the whole sequence again at every step. Here:
//! - each step concatenates `[x, h]` and makes one matmul per group of gates that share an
//!   activation (LSTM: the three sigmoid gates, the candidate; GRU: update + reset, and the
//!   candidate's input and hidden parts, which the reset gate keeps apart);
//! - outputs are kept in a list and stacked once at the end;
//! - the CNN's convolutions of every width are one im2col matmul: windows of the widest kernel,
//!   narrower kernels zero-padded to that width, −∞ where a kernel would run past the end.
//!
//! The fused weights are concatenated from the stock modules' parameters on every forward pass
//! (a few hundred kB), so gradients flow back to those parameters, a model trains the same either
//! way, and checkpoints do not depend on the path. These functions assume the configuration
//! Tandem builds: biases, sigmoid / tanh activations, no clipping, GRU `reset_after`, Conv1d with
//! stride 1, dilation 1, one group and no padding.

use burn::nn::conv::Conv1d;
use burn::nn::gru::{BiGru, Gru};
use burn::nn::lstm::{BiLstm, Lstm};
use burn::nn::{GateController, Linear};
use burn::tensor::activation::{relu, sigmoid};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// A stock layer's parameters laid side by side: `[d_in, gates × hidden]` input weights,
/// `[hidden, gates × hidden]` hidden weights, and the two biases.
struct GateWeights<B: Backend> {
    input: Tensor<B, 2>,
    input_bias: Tensor<B, 1>,
    hidden: Tensor<B, 2>,
    hidden_bias: Tensor<B, 1>,
}

impl<B: Backend> GateWeights<B> {
    fn concat(gates: &[&GateController<B>]) -> Self {
        let weights = |pick: fn(&GateController<B>) -> &Linear<B>| -> Tensor<B, 2> {
            Tensor::cat(gates.iter().map(|g| pick(g).weight.val()).collect(), 1)
        };
        let biases = |pick: fn(&GateController<B>) -> &Linear<B>| -> Tensor<B, 1> {
            Tensor::cat(
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

/// The time steps of `x` (`[batch, seq, d_in]`), each `[batch, d_in]`.
///
/// Burn's backward of a slice writes into a zeroed tensor the size of the *whole* input, so
/// slicing `seq` steps straight out of `x` would cost `seq` full-size tensors in the backward pass
/// (quadratic in the sequence length). Slicing in two levels, blocks of about √seq steps and then
/// steps out of each block, costs about 2√seq.
fn time_steps<B: Backend>(x: Tensor<B, 3>) -> Vec<Tensor<B, 2>> {
    let seq = x.dims()[1];
    let block = (seq as f64).sqrt().ceil() as usize;
    let x = x.swap_dims(0, 1); // [seq, batch, d_in]
    (0..seq)
        .step_by(block)
        .flat_map(|start| {
            let len = block.min(seq - start);
            let block = x.clone().narrow(0, start, len);
            (0..len).map(move |t| block.clone().narrow(0, t, 1).squeeze_dim(0))
        })
        .collect()
}

/// Runs `step` over the time steps of `x` (backwards when `reverse`); returns the hidden states
/// batch-first, `[batch, seq, hidden]`.
fn scan<B: Backend, S>(x: Tensor<B, 3>, reverse: bool, mut state: S, step: impl Fn(Tensor<B, 2>, S) -> (Tensor<B, 2>, S)) -> Tensor<B, 3> {
    let mut steps: Vec<(usize, Tensor<B, 2>)> = time_steps(x).into_iter().enumerate().collect();
    if reverse {
        steps.reverse();
    }
    let mut outputs = vec![None; steps.len()];
    for (t, input) in steps {
        let (hidden, next) = step(input, state);
        outputs[t] = Some(hidden);
        state = next;
    }
    let outputs: Vec<Tensor<B, 2>> = outputs.into_iter().map(|h| h.expect("every step ran")).collect();
    Tensor::stack::<3>(outputs, 0).swap_dims(0, 1)
}

/// `[batch, seq, d_in]` → `[batch, seq, hidden]` through `lstm`'s parameters.
pub fn lstm<B: Backend>(lstm: &Lstm<B>, x: Tensor<B, 3>, reverse: bool) -> Tensor<B, 3> {
    let w = GateWeights::concat(&[&lstm.input_gate, &lstm.forget_gate, &lstm.output_gate, &lstm.cell_gate]);
    let [batch, _, _] = x.dims();
    let hidden = lstm.d_hidden;
    // One weight for [x, h] of every gate; the sigmoid gates (i, f, o) and the tanh candidate are
    // kept apart so that no step has to split one matmul's output (a slice costs a zeroed copy of
    // its whole source in the backward pass).
    let weight = Tensor::cat(vec![w.input, w.hidden], 0);
    let bias = (w.input_bias + w.hidden_bias).unsqueeze::<2>();
    let sigmoid_weight = weight.clone().narrow(1, 0, 3 * hidden);
    let sigmoid_bias = bias.clone().narrow(1, 0, 3 * hidden);
    let candidate_weight = weight.narrow(1, 3 * hidden, hidden);
    let candidate_bias = bias.narrow(1, 3 * hidden, hidden);
    let zeros = Tensor::<B, 2>::zeros([batch, hidden], &x.device());
    scan(x, reverse, (zeros.clone(), zeros), |x, (h, c): (Tensor<B, 2>, Tensor<B, 2>)| {
        let xh = Tensor::cat(vec![x, h], 1);
        let ifo = sigmoid(xh.clone().matmul(sigmoid_weight.clone()) + sigmoid_bias.clone());
        let candidate = (xh.matmul(candidate_weight.clone()) + candidate_bias.clone()).tanh();
        let [i, f, o] = <[Tensor<B, 2>; 3]>::try_from(ifo.chunk(3, 1)).ok().expect("three gates");
        let c = f * c + i * candidate;
        let h = o * c.clone().tanh();
        (h.clone(), (h, c))
    })
}

/// `[batch, seq, d_in]` → `[batch, seq, hidden]` through `gru`'s parameters.
pub fn gru<B: Backend>(gru: &Gru<B>, x: Tensor<B, 3>, reverse: bool) -> Tensor<B, 3> {
    debug_assert!(gru.reset_after, "the fused GRU applies the reset gate after the hidden matmul");
    let w = GateWeights::concat(&[&gru.update_gate, &gru.reset_gate, &gru.new_gate]);
    let [batch, _, _] = x.dims();
    let hidden = gru.d_hidden;
    // Update and reset gates: one weight for [x, h] and both biases. The candidate keeps its input
    // and hidden parts apart, as the reset gate scales only the hidden part.
    let gate_weight = Tensor::cat(vec![w.input.clone().narrow(1, 0, 2 * hidden), w.hidden.clone().narrow(1, 0, 2 * hidden)], 0);
    let gate_bias = (w.input_bias.clone().narrow(0, 0, 2 * hidden) + w.hidden_bias.clone().narrow(0, 0, 2 * hidden)).unsqueeze::<2>();
    let input_weight = w.input.narrow(1, 2 * hidden, hidden);
    let input_bias = w.input_bias.narrow(0, 2 * hidden, hidden).unsqueeze::<2>();
    let hidden_weight = w.hidden.narrow(1, 2 * hidden, hidden);
    let hidden_bias = w.hidden_bias.narrow(0, 2 * hidden, hidden).unsqueeze::<2>();
    let zeros = Tensor::<B, 2>::zeros([batch, hidden], &x.device());
    scan(x, reverse, zeros, |x, h: Tensor<B, 2>| {
        let zr = sigmoid(Tensor::cat(vec![x.clone(), h.clone()], 1).matmul(gate_weight.clone()) + gate_bias.clone());
        let [z, r] = <[Tensor<B, 2>; 2]>::try_from(zr.chunk(2, 1)).ok().expect("two gates");
        let recurrent = h.clone().matmul(hidden_weight.clone()) + hidden_bias.clone();
        let n = (x.matmul(input_weight.clone()) + input_bias.clone() + r * recurrent).tanh();
        // (1 − z) · n + z · h, with one multiplication.
        let h = n.clone() + z * (h - n);
        (h.clone(), h)
    })
}

/// Both directions of `bi`, concatenated on the feature axis as Burn's `BiLstm` does.
pub fn bi_lstm<B: Backend>(bi: &BiLstm<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    Tensor::cat(vec![lstm(&bi.forward, x.clone(), false), lstm(&bi.reverse, x, true)], 2)
}

/// Both directions of `bi`, concatenated on the feature axis as Burn's `BiGru` does.
pub fn bi_gru<B: Backend>(bi: &BiGru<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    Tensor::cat(vec![gru(&bi.forward, x.clone(), false), gru(&bi.reverse, x, true)], 2)
}

/// `[batch, seq, channels]` → `[batch, filters × widths]`: every convolution → max over the
/// positions where its kernel fits → ReLU (ReLU commutes with max, so it runs on the pooled values).
pub fn conv_pool<B: Backend>(convs: &[Conv1d<B>], x: Tensor<B, 3>) -> Tensor<B, 2> {
    let [batch, seq, channels] = x.dims();
    let device = x.device();
    let widest = convs.iter().map(|c| c.kernel_size).max().expect("at least one convolution");
    let narrowest = convs.iter().map(|c| c.kernel_size).min().expect("at least one convolution");
    // Zeros after the end let the widest window start wherever the narrowest one fits.
    let x = match widest - narrowest {
        0 => x,
        extra => Tensor::cat(vec![x, Tensor::zeros([batch, extra, channels], &device)], 1),
    };
    let positions = seq - narrowest + 1;
    // Window k of every position is the sequence shifted by k: [batch, positions, channels, widest]
    // (channel-major rows, as Conv1d's weight), then one row of `channels × widest` per position.
    let shifted = (0..widest).map(|k| x.clone().narrow(1, k, positions)).collect();
    let windows = Tensor::stack::<4>(shifted, 3).reshape([batch * positions, channels * widest]);
    let weight = Tensor::cat(
        convs
            .iter()
            .map(|c| {
                let [filters, _, width] = c.weight.dims();
                let w = c.weight.val();
                let w = if width < widest { Tensor::cat(vec![w, Tensor::zeros([filters, channels, widest - width], &device)], 2) } else { w };
                w.reshape([filters, channels * widest]).transpose()
            })
            .collect(),
        1,
    );
    let total: usize = convs.iter().map(|c| c.weight.dims()[0]).sum();
    // −∞ where a kernel would run past the end, so the max over positions never picks it.
    let mut outside = Vec::with_capacity(positions * total);
    for p in 0..positions {
        for c in convs {
            outside.extend(std::iter::repeat_n(if p + c.kernel_size > seq { f32::NEG_INFINITY } else { 0.0 }, c.weight.dims()[0]));
        }
    }
    let outside = Tensor::<B, 2>::from_data(TensorData::new(outside, [positions, total]), &device).unsqueeze::<3>();
    let out = windows.matmul(weight).reshape([batch, positions, total]) + outside;
    // Bias after the max: max(y + b) = max(y) + b, on `total` values per sample instead of per position.
    let bias = Tensor::cat(convs.iter().map(|c| c.bias.as_ref().expect("Tandem builds convolutions with biases").val()).collect(), 0);
    relu(out.max_dim(1).squeeze_dim(1) + bias.unsqueeze())
}
