//! The time loop of [`crate::recurrence`] on a CPU backend: per step, one matmul on the backend
//! (`h · W_h`) and the gate arithmetic as one loop over the values in host memory.
//!
//! The tensor-operation version runs about twenty small operations per step (each allocating
//! its `[batch, gates × hidden]` result); on a CPU that, not the arithmetic, was a third of an
//! LSTM training step. Sigmoid and tanh come from [`exp`], a polynomial the compiler vectorises
//! (libm's `expf` is a scalar call per value).

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::recurrence::{order, Cell};
use crate::dispatch::{host_f32, values};

/// `e^x` without a libm call, so that loops over it vectorise: Cephes' `expf` (range reduction
/// by ln 2, degree-5 polynomial, relative error about 1e-7), `x` clamped to [−87, 88] (the
/// result stays a normal, finite f32); NaN stays NaN, so a diverged run still shows.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let x = if x < -87.0 { -87.0 } else if x > 88.0 { 88.0 } else { x };
    // Round x / ln 2 to the integer n: adding 1.5 × 2^23 leaves no fraction bits, and leaves n
    // in the low bits of the sum (read as an integer, not converted: that vectorises).
    let shifted = x * std::f32::consts::LOG2_E + 12_582_912.0;
    let n = shifted - 12_582_912.0;
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4; // x − n ln 2, ln 2 in two parts
    let mut p = 1.987_569_1e-4_f32;
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1] {
        p = p * r + c;
    }
    let y = p * r * r + r + 1.0;
    // 2^n: n + 127 in the exponent bits.
    y * f32::from_bits(shifted.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23)
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[inline(always)]
fn tanh(x: f32) -> f32 {
    2.0 * sigmoid(2.0 * x) - 1.0
}

/// `out = f(recurrent + bias + input)`, element by element.
#[inline(always)]
fn activate(out: &mut [f32], recurrent: &[f32], bias: &[f32], input: &[f32], f: impl Fn(f32) -> f32) {
    for (((out, r), b), x) in out.iter_mut().zip(recurrent).zip(bias).zip(input) {
        *out = f(r + b + x);
    }
}

/// Everything the backward pass needs, in host memory; per-step blocks in the order the steps ran.
#[derive(Clone, Debug)]
pub(crate) struct HostTape<B: Backend> {
    cell: Cell,
    reverse: bool,
    dims: [usize; 3],
    /// The hidden weight, `[hidden, gates × hidden]`.
    weight: Tensor<B, 2>,
    /// The hidden state each step started from, `[seq × batch, hidden]`.
    previous: Vec<f32>,
    /// LSTM: `[i, f, o, g]` after their activations; GRU: `[z, r]`, `h · W_n + b_n`, `n`.
    /// `[seq × batch, 4 × hidden]` either way.
    gates: Vec<f32>,
    /// LSTM only: the cell state each step started from and `tanh` of the one it ended with,
    /// `[seq × batch, 2 × hidden]`.
    cells: Vec<f32>,
}

/// The loop over `projected` (`[batch, seq, gates × hidden]`) with hidden weight `weight` and
/// hidden bias `bias`: the hidden state of every step, `[batch, seq, hidden]`, and, with
/// `record`, the tape.
pub(crate) fn forward<B: Backend>(cell: Cell, projected: Tensor<B, 3>, weight: Tensor<B, 2>, bias: Tensor<B, 1>, reverse: bool, record: bool) -> (Tensor<B, 3>, Option<HostTape<B>>) {
    let [batch, seq, width] = projected.dims();
    let hidden = width / cell.gates();
    let device = projected.device();
    let projected = host_f32(projected);
    let (projected, bias) = (values(&projected), host_f32(bias));
    let bias = values(&bias);
    let mut output = vec![0f32; batch * seq * hidden];
    let kept = if record { seq * batch } else { 0 };
    let mut previous = Vec::with_capacity(kept * hidden);
    let mut gates = Vec::with_capacity(kept * 4 * hidden);
    let mut cells = Vec::with_capacity(if cell == Cell::Lstm { kept * 2 * hidden } else { 0 });
    let mut h = vec![0f32; batch * hidden];
    let mut c = vec![0f32; batch * hidden];
    let mut row = vec![0f32; 4 * hidden];
    let mut row_cell = vec![0f32; hidden];
    for t in order(seq, reverse) {
        let recurrent = host_f32(Tensor::<B, 2>::from_data(TensorData::new(h.clone(), [batch, hidden]), &device).matmul(weight.clone()));
        let recurrent = values(&recurrent);
        if record {
            previous.extend_from_slice(&h);
        }
        for b in 0..batch {
            let x = &projected[(b * seq + t) * width..][..width];
            let r = &recurrent[b * width..][..width];
            let (h, c) = (&mut h[b * hidden..][..hidden], &mut c[b * hidden..][..hidden]);
            match cell {
                Cell::Lstm => {
                    activate(&mut row[..3 * hidden], &r[..3 * hidden], &bias[..3 * hidden], &x[..3 * hidden], sigmoid);
                    activate(&mut row[3 * hidden..], &r[3 * hidden..], &bias[3 * hidden..], &x[3 * hidden..], tanh);
                    if record {
                        cells.extend_from_slice(c);
                    }
                    let c_tanh = &mut row_cell[..hidden];
                    let (i, f, o, g) = (&row[..hidden], &row[hidden..2 * hidden], &row[2 * hidden..3 * hidden], &row[3 * hidden..4 * hidden]);
                    for j in 0..hidden {
                        c[j] = f[j] * c[j] + i[j] * g[j];
                        c_tanh[j] = tanh(c[j]);
                        h[j] = o[j] * c_tanh[j];
                    }
                    if record {
                        cells.extend_from_slice(c_tanh);
                    }
                }
                Cell::Gru => {
                    activate(&mut row[..2 * hidden], &r[..2 * hidden], &bias[..2 * hidden], &x[..2 * hidden], sigmoid);
                    let (zr, rest) = row.split_at_mut(2 * hidden);
                    let (hidden_new, new) = rest.split_at_mut(hidden);
                    let (z, reset) = (&zr[..hidden], &zr[hidden..]);
                    let (r_n, b_n, x_n) = (&r[2 * hidden..], &bias[2 * hidden..], &x[2 * hidden..]);
                    for j in 0..hidden {
                        hidden_new[j] = r_n[j] + b_n[j];
                        new[j] = tanh(reset[j] * hidden_new[j] + x_n[j]);
                        // (1 − z) · n + z · h
                        h[j] = new[j] + z[j] * (h[j] - new[j]);
                    }
                }
            }
            if record {
                gates.extend_from_slice(&row);
            }
            output[(b * seq + t) * hidden..][..hidden].copy_from_slice(h);
        }
    }
    let output = Tensor::from_data(TensorData::new(output, [batch, seq, hidden]), &device);
    (output, record.then(|| HostTape { cell, reverse, dims: [batch, seq, hidden], weight, previous, gates, cells }))
}

impl<B: Backend> HostTape<B> {
    /// Back-propagation through time: the gradients of `projected`, `weight` and `bias` from the
    /// gradient of the output (`[batch, seq, hidden]`).
    pub(crate) fn backward(self, grad: Tensor<B, 3>) -> (Tensor<B, 3>, Tensor<B, 2>, Tensor<B, 1>) {
        let [batch, seq, hidden] = self.dims;
        let width = self.cell.gates() * hidden;
        let device = grad.device();
        let grad = host_f32(grad);
        let grad = values(&grad);
        let weight_t = self.weight.transpose();
        let mut d_projected = vec![0f32; batch * seq * width];
        // Per step, in run order: the gradient of `h · W_h + b_h`.
        let mut d_recurrent = vec![0f32; seq * batch * width];
        let mut d_bias = vec![0f32; width];
        let mut dh = vec![0f32; batch * hidden]; // from the next step to run, through `h · W_h`
        let mut dc = vec![0f32; batch * hidden]; // LSTM: from the next step, through `f · c`
        let times = order(seq, self.reverse);
        for s in (0..seq).rev() {
            let t = times[s];
            for b in 0..batch {
                let at = s * batch + b;
                let g = &self.gates[at * 4 * hidden..][..4 * hidden];
                let dh = &mut dh[b * hidden..][..hidden];
                for (j, d) in dh.iter_mut().enumerate() {
                    *d += grad[(b * seq + t) * hidden + j];
                }
                let d_rec = &mut d_recurrent[at * width..][..width];
                let d_proj = &mut d_projected[(b * seq + t) * width..][..width];
                match self.cell {
                    Cell::Lstm => {
                        let cells = &self.cells[at * 2 * hidden..][..2 * hidden];
                        let (c_prev, c_tanh) = cells.split_at(hidden);
                        let dc = &mut dc[b * hidden..][..hidden];
                        for j in 0..hidden {
                            let (i, f, o, cand) = (g[j], g[hidden + j], g[2 * hidden + j], g[3 * hidden + j]);
                            let d_cell = (1.0 - c_tanh[j] * c_tanh[j]) * o * dh[j] + dc[j];
                            dc[j] = d_cell * f;
                            d_rec[j] = d_cell * cand * (i - i * i);
                            d_rec[hidden + j] = d_cell * c_prev[j] * (f - f * f);
                            d_rec[2 * hidden + j] = dh[j] * c_tanh[j] * (o - o * o);
                            d_rec[3 * hidden + j] = d_cell * i * (1.0 - cand * cand);
                        }
                        d_proj.copy_from_slice(d_rec);
                    }
                    Cell::Gru => {
                        let h_prev = &self.previous[at * hidden..][..hidden];
                        for j in 0..hidden {
                            let (z, r, hidden_new, new) = (g[j], g[hidden + j], g[2 * hidden + j], g[3 * hidden + j]);
                            let d_direct = dh[j] * z;
                            let d_new = (1.0 - new * new) * (dh[j] - d_direct);
                            d_rec[j] = (h_prev[j] - new) * dh[j] * (z - z * z);
                            d_rec[hidden + j] = d_new * hidden_new * (r - r * r);
                            d_rec[2 * hidden + j] = d_new * r;
                            d_proj[2 * hidden + j] = d_new;
                            dh[j] = d_direct; // the part of the previous state's gradient that skips W_h
                        }
                        d_proj[..2 * hidden].copy_from_slice(&d_rec[..2 * hidden]);
                    }
                }
                if self.cell == Cell::Lstm {
                    dh.fill(0.0);
                }
                for (sum, d) in d_bias.iter_mut().zip(d_rec.iter()) {
                    *sum += d;
                }
            }
            if s > 0 {
                let block = d_recurrent[s * batch * width..][..batch * width].to_vec();
                let through = host_f32(Tensor::<B, 2>::from_data(TensorData::new(block, [batch, width]), &device).matmul(weight_t.clone()));
                for (d, v) in dh.iter_mut().zip(values(&through)) {
                    *d += v;
                }
            }
        }
        let tensor = |data: Vec<f32>, rows: usize, cols: usize| Tensor::<B, 2>::from_data(TensorData::new(data, [rows, cols]), &device);
        let previous = tensor(self.previous, seq * batch, hidden);
        let weight = previous.transpose().matmul(tensor(d_recurrent, seq * batch, width));
        (
            Tensor::from_data(TensorData::new(d_projected, [batch, seq, width]), &device),
            weight,
            Tensor::from_data(TensorData::new(d_bias, [width]), &device),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::exp;

    #[test]
    fn exp_is_within_2e7_of_libm_and_keeps_nan() {
        let mut worst = 0f64;
        for i in 0..175_000 {
            let x = -87.0 + i as f32 * 0.001; // up to 88, where the clamp starts
            let expected = f64::from(x).exp();
            worst = worst.max(((f64::from(exp(x)) - expected) / expected).abs());
        }
        assert!(worst < 2e-7, "largest relative error {worst:e}");
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-1e4) > 0.0 && exp(1e4).is_finite(), "clamped, not 0 or ∞");
    }
}
