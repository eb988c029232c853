//! The time loop of [`crate::ops::recurrence`] on a CPU backend, in host memory: per step, one
//! matmul `h · W_h` ([`host_matmul`]) and the gate arithmetic as one loop over the values. The
//! cells' gate layout ([`Cell`]) is defined here, for both loops.
//!
//! The tensor-operation version runs about twenty small operations per step (each allocating
//! its `[batch, gates × hidden]` result); on a CPU that, not the arithmetic, was a third of an
//! LSTM training step. Sigmoid and tanh come from [`super::host_math`], polynomials the compiler
//! vectorises (libm's `expf` is a scalar call per value).

use std::cell::RefCell;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use tandem_simd::Kernel;

use super::dispatch::{host_f32, values};
use super::host_gemm::{host_matmul, host_product, transposed, Matrix};
use super::host_math::{sigmoid, tanh};

/// The recurrent cell, with its gate layout along the last axis of `projected`, `weight` and `bias`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cell {
    /// Gates `[input, forget, output, candidate]`: `c' = f·c + i·g`, `h' = o·tanh(c')`.
    Lstm,
    /// Gates `[update, reset, new]`, reset applied after the hidden matmul (Burn's `reset_after`):
    /// `n = tanh(x_n + r·(h·W_n + b_n))`, `h' = (1 − z)·n + z·h`.
    Gru,
}

impl Cell {
    /// Gates per hidden unit.
    pub(crate) fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
        }
    }
}

/// The steps of `seq` in the order they run.
pub(crate) fn order(seq: usize, reverse: bool) -> Vec<usize> {
    if reverse {
        (0..seq).rev().collect()
    } else {
        (0..seq).collect()
    }
}

/// `out = f(recurrent + bias + input)`, element by element.
#[inline(always)]
fn activate(out: &mut [f32], recurrent: &[f32], bias: &[f32], input: &[f32], f: impl Fn(f32) -> f32) {
    for (((out, r), b), x) in out.iter_mut().zip(recurrent).zip(bias).zip(input) {
        *out = f(r + b + x);
    }
}

/// The four `hidden`-wide blocks of a gate row.
#[inline(always)]
fn blocks(row: &[f32], hidden: usize) -> [&[f32]; 4] {
    let (a, rest) = row.split_at(hidden);
    let (b, rest) = rest.split_at(hidden);
    let (c, d) = rest.split_at(hidden);
    [a, b, c, &d[..hidden]]
}

/// The four `hidden`-wide blocks of a gate row, writable.
#[inline(always)]
fn blocks_mut(row: &mut [f32], hidden: usize) -> [&mut [f32]; 4] {
    let (a, rest) = row.split_at_mut(hidden);
    let (b, rest) = rest.split_at_mut(hidden);
    let (c, d) = rest.split_at_mut(hidden);
    [a, b, c, &mut d[..hidden]]
}

// One sample's step, forward and backward. Each takes its rows as separate slices: the compiler
// then knows they do not overlap and vectorises the loop (from inside one function body it
// cannot tell, and falls back to one value at a time).

/// LSTM: the new cell state `c`, its `tanh` and the hidden state `h` from the activated gates
/// `[i, f, o, g]` and the cell state before, `c_prev`.
#[inline(always)]
fn lstm_cell(gates: &[f32], c_prev: &[f32], c: &mut [f32], c_tanh: &mut [f32], h: &mut [f32]) {
    let n = h.len();
    let [i, f, o, g] = blocks(gates, n);
    let (c_prev, c, c_tanh) = (&c_prev[..n], &mut c[..n], &mut c_tanh[..n]);
    for j in 0..n {
        c[j] = f[j] * c_prev[j] + i[j] * g[j];
        c_tanh[j] = tanh(c[j]);
        h[j] = o[j] * c_tanh[j];
    }
}

/// LSTM backward: the gradient of the gates' pre-activations (`d_rec`) and of the cell state the
/// step started from (`dc`, which holds the gradient of the one it ended with on entry).
#[inline(always)]
fn lstm_cell_backward(gates: &[f32], c_prev: &[f32], c_tanh: &[f32], dh: &[f32], dc: &mut [f32], d_rec: &mut [f32]) {
    let n = dh.len();
    let [i, f, o, cand] = blocks(gates, n);
    let [di, df, d_o, dg] = blocks_mut(d_rec, n);
    let (c_prev, c_tanh, dc) = (&c_prev[..n], &c_tanh[..n], &mut dc[..n]);
    for j in 0..n {
        let d_cell = (1.0 - c_tanh[j] * c_tanh[j]) * o[j] * dh[j] + dc[j];
        dc[j] = d_cell * f[j];
        di[j] = d_cell * cand[j] * (i[j] - i[j] * i[j]);
        df[j] = d_cell * c_prev[j] * (f[j] - f[j] * f[j]);
        d_o[j] = dh[j] * c_tanh[j] * (o[j] - o[j] * o[j]);
        dg[j] = d_cell * i[j] * (1.0 - cand[j] * cand[j]);
    }
}

/// GRU: from `[z, r]` (activated) in `gates`, writes `h · W_n + b_n` and `n` into the rest of
/// `gates` and the new hidden state into `h`.
#[inline(always)]
fn gru_cell(gates: &mut [f32], recurrent_n: &[f32], bias_n: &[f32], input_n: &[f32], h: &mut [f32]) {
    let n = h.len();
    let [z, reset, hidden_new, new] = blocks_mut(gates, n);
    let (recurrent_n, bias_n, input_n) = (&recurrent_n[..n], &bias_n[..n], &input_n[..n]);
    for j in 0..n {
        hidden_new[j] = recurrent_n[j] + bias_n[j];
        new[j] = tanh(reset[j] * hidden_new[j] + input_n[j]);
        // (1 − z) · n + z · h
        h[j] = new[j] + z[j] * (h[j] - new[j]);
    }
}

/// GRU backward: the gradient of `[z, r]`'s and `h · W_n + b_n`'s pre-activations (`d_rec`), of
/// the input's `n` part (`d_input_n`), and, in `dh`, of the state the step started from (the
/// part that skips `W_h`).
#[inline(always)]
fn gru_cell_backward(gates: &[f32], h_prev: &[f32], dh: &mut [f32], d_rec: &mut [f32], d_input_n: &mut [f32]) {
    let n = dh.len();
    let [z, r, hidden_new, new] = blocks(gates, n);
    let (dz, rest) = d_rec.split_at_mut(n); // three blocks: the GRU's input has no `h · W_n` part
    let (dr, d_hidden_new) = rest.split_at_mut(n);
    let d_hidden_new = &mut d_hidden_new[..n];
    let (h_prev, d_input_n) = (&h_prev[..n], &mut d_input_n[..n]);
    for j in 0..n {
        let d_direct = dh[j] * z[j];
        let d_new = (1.0 - new[j] * new[j]) * (dh[j] - d_direct);
        dz[j] = (h_prev[j] - new[j]) * dh[j] * (z[j] - z[j] * z[j]);
        dr[j] = d_new * hidden_new[j] * (r[j] - r[j] * r[j]);
        d_hidden_new[j] = d_new * r[j];
        d_input_n[j] = d_new;
        dh[j] = d_direct;
    }
}

/// Everything the backward pass needs, in host memory; per-step blocks in the order the steps ran.
#[derive(Clone, Debug)]
pub(crate) struct HostTape<B: Backend> {
    device: B::Device,
    cell: Cell,
    reverse: bool,
    dims: [usize; 3],
    /// The hidden weight's values, `[hidden, gates × hidden]`.
    weight: TensorData,
    /// The hidden state each step started from, `[batch × seq, hidden]` (row `b × seq + t`, as
    /// the input and output rows).
    previous: Vec<f32>,
    /// LSTM: `[i, f, o, g]` after their activations; GRU: `[z, r]`, `h · W_n + b_n`, `n`.
    /// `[seq × batch, 4 × hidden]` either way.
    gates: Vec<f32>,
    /// LSTM only: the cell state each step ended with and its `tanh`, `[seq × batch, 2 × hidden]`.
    cells: Vec<f32>,
}

/// The loop over `projected` (`[batch, seq, gates × hidden]`) with hidden weight `weight` and
/// hidden bias `bias`: the hidden state of every step, `[batch, seq, hidden]`, and, with
/// `record`, the tape.
pub(crate) fn forward<B: Backend>(
    cell: Cell,
    projected: Tensor<B, 3>,
    weight: Tensor<B, 2>,
    bias: Tensor<B, 1>,
    reverse: bool,
    record: bool,
) -> (Tensor<B, 3>, Option<HostTape<B>>) {
    tandem_simd::run(ForwardLoop { cell, projected, weight, bias, reverse, record })
}

/// [`forward`]'s arguments.
struct ForwardLoop<B: Backend> {
    cell: Cell,
    projected: Tensor<B, 3>,
    weight: Tensor<B, 2>,
    bias: Tensor<B, 1>,
    reverse: bool,
    record: bool,
}

impl<B: Backend> Kernel for ForwardLoop<B> {
    type Output = (Tensor<B, 3>, Option<HostTape<B>>);

    #[inline(always)]
    fn run(self) -> Self::Output {
        let Self { cell, projected, weight, bias, reverse, record } = self;
        let [batch, seq, width] = projected.dims();
        let hidden = width / cell.gates();
        let device = projected.device();
        let projected = host_f32(projected);
        let (projected, bias) = (values(&projected), host_f32(bias));
        let bias = values(&bias);
        let weight = host_f32(weight);
        let mut output = vec![0f32; batch * seq * hidden];
        // A tape's buffers come from this thread's spares (see `tape_buffer`); without `record`
        // nothing gives them back, so plain ones.
        let buffer = |len| if record { tape_buffer(len) } else { vec![0f32; len] };
        let mut previous = buffer(if record { seq * batch * hidden } else { 0 });
        // The gates and (LSTM) cell states are written where the tape keeps them, per step in
        // run order; without `record`, into one step's block (the cells: two, this step's and
        // the one before).
        let (gates_len, cells_len) = (batch * 4 * hidden, if cell == Cell::Lstm { batch * 2 * hidden } else { 0 });
        let mut gates = buffer(if record { seq } else { 1 } * gates_len);
        let cell_blocks = if record { seq } else { 2 };
        let mut cells = buffer(cell_blocks * cells_len);
        let no_cells = vec![0f32; cells_len]; // before the first step
        let mut h = vec![0f32; batch * hidden];
        let mut recurrent = vec![0f32; batch * width]; // zero at the first step, where h is
        for (s, t) in order(seq, reverse).into_iter().enumerate() {
            if s > 0 {
                host_matmul(
                    &mut recurrent,
                    Matrix::rows(&h, batch, hidden),
                    Matrix::rows(values(&weight), hidden, width),
                    false,
                );
            }
            let step_gates = &mut gates[if record { s * gates_len } else { 0 }..][..gates_len];
            let (cells_before, step_cells) = match s {
                0 => (&no_cells[..], &mut cells[..cells_len]),
                _ => two_blocks(&mut cells, (s - 1) % cell_blocks, s % cell_blocks, cells_len),
            };
            for b in 0..batch {
                if record {
                    previous[(b * seq + t) * hidden..][..hidden].copy_from_slice(&h[b * hidden..][..hidden]);
                }
                let x = &projected[(b * seq + t) * width..][..width];
                let r = &recurrent[b * width..][..width];
                let h = &mut h[b * hidden..][..hidden];
                let row = &mut step_gates[b * 4 * hidden..][..4 * hidden];
                match cell {
                    Cell::Lstm => {
                        activate(
                            &mut row[..3 * hidden],
                            &r[..3 * hidden],
                            &bias[..3 * hidden],
                            &x[..3 * hidden],
                            sigmoid,
                        );
                        activate(&mut row[3 * hidden..], &r[3 * hidden..], &bias[3 * hidden..], &x[3 * hidden..], tanh);
                        let (c, c_tanh) = step_cells[b * 2 * hidden..][..2 * hidden].split_at_mut(hidden);
                        lstm_cell(row, &cells_before[b * 2 * hidden..][..hidden], c, c_tanh, h);
                    }
                    Cell::Gru => {
                        activate(
                            &mut row[..2 * hidden],
                            &r[..2 * hidden],
                            &bias[..2 * hidden],
                            &x[..2 * hidden],
                            sigmoid,
                        );
                        gru_cell(row, &r[2 * hidden..], &bias[2 * hidden..], &x[2 * hidden..], h);
                    }
                }
                output[(b * seq + t) * hidden..][..hidden].copy_from_slice(h);
            }
        }
        let output = Tensor::from_data(TensorData::new(output, [batch, seq, hidden]), &device);
        (
            output,
            record.then(|| HostTape {
                device,
                cell,
                reverse,
                dims: [batch, seq, hidden],
                weight,
                previous,
                gates,
                cells,
            }),
        )
    }
}

thread_local! {
    /// The tape buffers of this thread's finished backward passes, for its next forward passes.
    static SPARE_BUFFERS: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// At most this many spare buffers are kept per thread (three per recurrent layer and direction).
const MAX_SPARE_BUFFERS: usize = 12;

/// A buffer of `len` values for the tape, **which the caller overwrites in full**: a spare one
/// of this thread when one is large enough (its old values left in place), else a new one. A
/// new buffer is zero-filled first, a pass over 14 MB per LSTM layer at the reference shape
/// (~2 % of a training step).
fn tape_buffer(len: usize) -> Vec<f32> {
    if len == 0 {
        return Vec::new();
    }
    let spare = SPARE_BUFFERS.with(|spares| {
        let mut spares = spares.borrow_mut();
        // The smallest that is large enough, so that a large one stays for a large request.
        let (at, _) =
            spares.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity())?;
        Some(spares.swap_remove(at))
    });
    let mut buffer = spare.unwrap_or_default();
    buffer.resize(len, 0.0); // shortens a spare; zero-fills only what a new buffer lacks
    buffer
}

/// Keeps `buffers` for this thread's next [`tape_buffer`]s.
fn spare(buffers: impl IntoIterator<Item = Vec<f32>>) {
    SPARE_BUFFERS.with(|spares| {
        let mut spares = spares.borrow_mut();
        for buffer in buffers {
            if spares.len() < MAX_SPARE_BUFFERS && buffer.capacity() > 0 {
                spares.push(buffer);
            }
        }
    });
}

/// Block `before` (read) and block `now` (written) of `len` values each, two different blocks
/// of `buffer`.
fn two_blocks(buffer: &mut [f32], before: usize, now: usize, len: usize) -> (&[f32], &mut [f32]) {
    if before < now {
        let (head, tail) = buffer.split_at_mut(now * len);
        (&head[before * len..][..len], &mut tail[..len])
    } else {
        let (head, tail) = buffer.split_at_mut(before * len);
        (&tail[..len], &mut head[now * len..][..len])
    }
}

impl<B: Backend> HostTape<B> {
    /// Back-propagation through time: the gradients of `projected`, `weight` and `bias` from the
    /// gradient of the output (`[batch, seq, hidden]`).
    pub(crate) fn backward(self, grad: Tensor<B, 3>) -> (Tensor<B, 3>, Tensor<B, 2>, Tensor<B, 1>) {
        tandem_simd::run(BackwardThroughTime { tape: self, grad })
    }
}

/// [`HostTape::backward`]'s arguments.
struct BackwardThroughTime<B: Backend> {
    tape: HostTape<B>,
    grad: Tensor<B, 3>,
}

impl<B: Backend> Kernel for BackwardThroughTime<B> {
    type Output = (Tensor<B, 3>, Tensor<B, 2>, Tensor<B, 1>);

    #[inline(always)]
    fn run(self) -> Self::Output {
        let Self { tape, grad } = self;
        let [batch, seq, hidden] = tape.dims;
        let width = tape.cell.gates() * hidden;
        let device = tape.device;
        let grad = host_f32(grad);
        let grad = values(&grad);
        let mut d_projected = vec![0f32; batch * seq * width];
        // The gradient of `h · W_h + b_h`, rows as `d_projected`'s. The LSTM's is `d_projected`
        // itself; the GRU's differs in the `n` block, whose hidden side the reset gate scales.
        let mut d_recurrent = match tape.cell {
            Cell::Lstm => Vec::new(),
            Cell::Gru => tape_buffer(batch * seq * width),
        };
        let mut d_bias = vec![0f32; width];
        let mut dh = vec![0f32; batch * hidden]; // from the next step to run, through `h · W_h`
        let mut dc = vec![0f32; batch * hidden]; // LSTM: from the next step, through `f · c`
        let no_cell = vec![0f32; hidden]; // the cell state before the first step
                                          // W_hᵀ as rows, `[width, hidden]`: gemm copies ("packs") it at every step, faster from rows.
        let weight_t = transposed(values(&tape.weight), hidden, width);
        let times = order(seq, tape.reverse);
        for s in (0..seq).rev() {
            let t = times[s];
            for b in 0..batch {
                let at = s * batch + b;
                let row = (b * seq + t) * width;
                let g = &tape.gates[at * 4 * hidden..][..4 * hidden];
                let dh = &mut dh[b * hidden..][..hidden];
                for (d, from_output) in dh.iter_mut().zip(&grad[(b * seq + t) * hidden..][..hidden]) {
                    *d += from_output;
                }
                let d_proj = &mut d_projected[row..][..width];
                let d_rec: &[f32] = match tape.cell {
                    Cell::Lstm => {
                        let c_prev =
                            if s == 0 { &no_cell[..] } else { &tape.cells[(at - batch) * 2 * hidden..][..hidden] };
                        let c_tanh = &tape.cells[at * 2 * hidden + hidden..][..hidden];
                        lstm_cell_backward(g, c_prev, c_tanh, dh, &mut dc[b * hidden..][..hidden], d_proj);
                        dh.fill(0.0);
                        d_proj
                    }
                    Cell::Gru => {
                        let d_rec = &mut d_recurrent[row..][..width];
                        let h_prev = &tape.previous[(b * seq + t) * hidden..][..hidden];
                        gru_cell_backward(g, h_prev, dh, d_rec, &mut d_proj[2 * hidden..]);
                        d_proj[..2 * hidden].copy_from_slice(&d_rec[..2 * hidden]);
                        d_rec
                    }
                };
                for (sum, d) in d_bias.iter_mut().zip(d_rec) {
                    *sum += d;
                }
            }
            if s > 0 && batch > 0 {
                // dh += d_rec · W_hᵀ, over step t's rows (`seq × width` values apart)
                let d_rec = if tape.cell == Cell::Lstm { &d_projected } else { &d_recurrent };
                let d_rec = Matrix::rows(&d_rec[t * width..], batch, width).with_row_stride(seq * width);
                host_matmul(&mut dh, d_rec, Matrix::rows(&weight_t, width, hidden), true);
            }
        }
        // d W_h = Σ h_prevᵀ · d_rec over every step's rows, one matmul.
        let d_rec = if tape.cell == Cell::Lstm { &d_projected } else { &d_recurrent };
        let d_weight = host_product(
            Matrix::rows(&tape.previous, batch * seq, hidden).t(),
            Matrix::rows(d_rec, batch * seq, width),
        );
        spare([tape.gates, tape.cells, tape.previous, d_recurrent]);
        (
            Tensor::from_data(TensorData::new(d_projected, [batch, seq, width]), &device),
            Tensor::from_data(TensorData::new(d_weight, [hidden, width]), &device),
            Tensor::from_data(TensorData::new(d_bias, [width]), &device),
        )
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::NdArray;
    use burn::tensor::{Distribution, Tensor};
    use tandem_simd::Kernel;

    use super::{forward, BackwardThroughTime, Cell, ForwardLoop};

    /// The loops as built (called directly: compiled for the build's baseline) give the same bits
    /// as [`tandem_simd::run`]'s copy (AVX2 + FMA where this CPU has them).
    #[test]
    fn wide_copy_computes_the_same_bits() {
        let device = Default::default();
        for cell in [Cell::Lstm, Cell::Gru] {
            let (batch, seq, hidden) = (3, 5, 12); // 12: a vector width and a remainder
            let width = cell.gates() * hidden;
            let random = |dims: [usize; 3]| Tensor::<NdArray, 3>::random(dims, Distribution::Normal(0.0, 1.0), &device);
            let projected = random([batch, seq, width]);
            let weight = random([1, hidden, width]).reshape([hidden, width]);
            let bias = random([1, 1, width]).reshape([width]);
            let grad = random([batch, seq, hidden]);
            let bits = |t: Tensor<NdArray, 3>| {
                t.into_data().to_vec::<f32>().unwrap().into_iter().map(f32::to_bits).collect::<Vec<_>>()
            };
            let (wide_out, wide_tape) = forward(cell, projected.clone(), weight.clone(), bias.clone(), true, true);
            let (plain_out, plain_tape) =
                ForwardLoop { cell, projected, weight, bias, reverse: true, record: true }.run();
            assert_eq!(bits(wide_out), bits(plain_out), "{cell:?} forward");
            let wide = wide_tape.unwrap().backward(grad.clone());
            let plain = BackwardThroughTime { tape: plain_tape.unwrap(), grad }.run();
            assert_eq!(bits(wide.0), bits(plain.0), "{cell:?} input gradient");
            assert_eq!(bits(wide.1.unsqueeze()), bits(plain.1.unsqueeze()), "{cell:?} weight gradient");
            assert_eq!(
                bits(wide.2.unsqueeze::<2>().unsqueeze()),
                bits(plain.2.unsqueeze::<2>().unsqueeze()),
                "{cell:?} bias gradient"
            );
        }
    }
}
