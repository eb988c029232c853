//! The time loop of an LSTM or GRU layer as two CubeCL kernels: one launch runs the whole forward
//! loop, one the whole back-propagation through time.
//!
//! Samples are independent in a recurrence, so a cube owns a few batch rows and never waits for
//! another cube: its hidden state stays in shared memory from one step to the next, and each unit
//! (thread) computes its hidden units' gate pre-activations `h · W_h[:, gate·H + k]` itself, so the
//! cell arithmetic of a unit needs no other thread's values. One barrier per step publishes the
//! new hidden state (double-buffered, so reads of step `t` never race writes of step `t + 1`).
//!
//! Backward, a unit turns the output gradient and the carried `∂h` into its gate derivatives
//! (from the gate values the forward kernel kept), writes them, and after the step's barrier sums
//! `∂gates · W_hᵀ` for its hidden units: the `∂h` carried to the step before. The gradients of
//! `W_h` and the bias, sums over every step and sample, are one matmul and one sum outside the
//! kernel.

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::{empty_like, RecurrenceTape};
use crate::cpu::recurrence::Cell;
use crate::ledger::{note, Work};

/// Values the forward kernel keeps per sample, step and hidden unit for the backward kernel:
/// LSTM `[i, f, o, g, c]` (activated gates and the new cell state), GRU `[z, r, h·W_n + b_n, n]`.
pub(crate) fn taped(lstm: bool) -> usize {
    if lstm {
        5
    } else {
        4
    }
}

#[cube]
fn sigmoid<F: Float>(x: F) -> F {
    F::new(1.0) / (F::new(1.0) + (F::new(0.0) - x).exp())
}

/// The forward time loop. `projected` `[batch, seq, G·H]` (the input projection of every step),
/// `weight` `[H, G·H]`, `bias` `[G·H]`, all contiguous; writes `output` `[batch, seq, H]` and, when
/// `record`, `tape` `[batch, seq, T·H]` and `previous` `[batch, seq, H]` (the hidden state each
/// step started from). Cubes of `hidden`-striding units × `rows` batch rows.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel<F: Float>(
    projected: &Tensor<F>,
    weight: &Tensor<F>,
    bias: &Tensor<F>,
    output: &mut Tensor<F>,
    tape: &mut Tensor<F>,
    previous: &mut Tensor<F>,
    batch: u32,
    seq: u32,
    reverse: u32,
    #[comptime] hidden: u32,
    #[comptime] rows: u32,
    #[comptime] parts: u32,
    #[comptime] lstm: bool,
    #[comptime] record: bool,
    #[define(F)] _dtype: StorageType,
) {
    let h_len = hidden as usize;
    let rows_len = rows as usize;
    let gates = comptime!(if lstm { 4usize } else { 3usize });
    let width = gates * h_len;
    let kept = comptime!(if lstm { 5usize } else { 4usize });
    let seq = seq as usize;
    let r = UNIT_POS_Y as usize;
    let part = UNIT_POS_Z as usize;
    let b = CUBE_POS_X as usize * rows_len + r;
    let active = b < batch as usize;
    let stride = CUBE_DIM_X as usize;
    let (from, to) = share(part, parts, h_len);

    // Hidden state, two buffers of `rows × H` (read one, write the other); LSTM cell state; each
    // part's sums of `h · W_h`, `parts × rows × G·H`.
    let mut state = SharedMemory::<F>::new(2 * rows_len * h_len);
    let mut cells = SharedMemory::<F>::new(rows_len * h_len);
    let mut sums = SharedMemory::<F>::new(parts as usize * rows_len * width);
    let mut k = UNIT_POS_X as usize;
    while k < h_len && part == 0 {
        state[r * h_len + k] = F::new(0.0);
        state[(rows_len + r) * h_len + k] = F::new(0.0);
        cells[r * h_len + k] = F::new(0.0);
        k += stride;
    }
    sync_cube();

    for s in 0..seq {
        let t = if reverse == 1 { seq - 1 - s } else { s };
        let read = (s % 2) * rows_len * h_len + r * h_len;
        let write = ((s + 1) % 2) * rows_len * h_len + r * h_len;
        // This part's terms of `h · W_h` for the unit's hidden units.
        let own = (part * rows_len + r) * width;
        let mut k = UNIT_POS_X as usize;
        while k < h_len && active {
            let mut a0 = F::new(0.0);
            let mut a1 = F::new(0.0);
            let mut a2 = F::new(0.0);
            let mut a3 = F::new(0.0);
            for j in from..to {
                let h = state[read + j];
                let w = j * width + k;
                a0 += h * weight[w];
                a1 += h * weight[w + h_len];
                a2 += h * weight[w + 2 * h_len];
                if lstm {
                    a3 += h * weight[w + 3 * h_len];
                }
            }
            sums[own + k] = a0;
            sums[own + h_len + k] = a1;
            sums[own + 2 * h_len + k] = a2;
            if lstm {
                sums[own + 3 * h_len + k] = a3;
            }
            k += stride;
        }
        sync_cube();
        if active && part == 0 {
            let row = b * seq + t;
            let mut k = UNIT_POS_X as usize;
            while k < h_len {
                let a0 = bias[k] + gathered(&sums, parts, rows_len * width, r * width + k);
                let a1 = bias[h_len + k] + gathered(&sums, parts, rows_len * width, r * width + h_len + k);
                let a2 = bias[2 * h_len + k] + gathered(&sums, parts, rows_len * width, r * width + 2 * h_len + k);
                let mut a3 = F::new(0.0);
                if lstm {
                    a3 = bias[3 * h_len + k] + gathered(&sums, parts, rows_len * width, r * width + 3 * h_len + k);
                }
                let x = row * width + k;
                let before = state[read + k];
                let at = row * kept * h_len + k;
                let next = if lstm {
                    let i = sigmoid::<F>(a0 + projected[x]);
                    let f = sigmoid::<F>(a1 + projected[x + h_len]);
                    let o = sigmoid::<F>(a2 + projected[x + 2 * h_len]);
                    let g = (a3 + projected[x + 3 * h_len]).tanh();
                    let c = f * cells[r * h_len + k] + i * g;
                    cells[r * h_len + k] = c;
                    if record {
                        tape[at] = i;
                        tape[at + h_len] = f;
                        tape[at + 2 * h_len] = o;
                        tape[at + 3 * h_len] = g;
                        tape[at + 4 * h_len] = c;
                    }
                    o * c.tanh()
                } else {
                    let z = sigmoid::<F>(a0 + projected[x]);
                    let reset = sigmoid::<F>(a1 + projected[x + h_len]);
                    let n = (projected[x + 2 * h_len] + reset * a2).tanh();
                    if record {
                        tape[at] = z;
                        tape[at + h_len] = reset;
                        tape[at + 2 * h_len] = a2;
                        tape[at + 3 * h_len] = n;
                    }
                    // (1 − z) · n + z · h, with one multiplication.
                    n + z * (before - n)
                };
                if record {
                    previous[row * h_len + k] = before;
                }
                output[row * h_len + k] = next;
                state[write + k] = next;
                k += stride;
            }
        }
        sync_cube();
    }
}

/// The range of `0..length` that part `part` of `parts` sums: the first parts a term more where
/// `parts` does not divide `length`.
#[cube]
fn share(part: usize, #[comptime] parts: u32, length: usize) -> (usize, usize) {
    let (each, extra) = (length / parts as usize, length % parts as usize);
    let from = part * each + select(part < extra, part, extra);
    (from, from + each + select(part < extra, 1usize, 0usize))
}

/// The sum over the `parts` parts of the value at `at` of each part's `size` values in `sums`, in
/// part order.
#[cube]
fn gathered<F: Float>(sums: &SharedMemory<F>, #[comptime] parts: u32, size: usize, at: usize) -> F {
    let count = comptime!(parts as usize);
    let mut total = F::new(0.0);
    #[unroll]
    for part in 0..count {
        total += sums[part * size + at];
    }
    total
}

/// Back-propagation through time. `grad` `[batch, seq, H]` (of the output), `tape` and
/// `previous` from [`forward_kernel`], `weight_t` `[G·H, H]` (the hidden weight transposed,
/// contiguous); writes `d_projected` `[batch, seq, G·H]` and, for the GRU, `d_recurrent` (the
/// gradient of `h · W_h + b`, which differs from `d_projected` in the new gate).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn backward_kernel<F: Float>(
    grad: &Tensor<F>,
    tape: &Tensor<F>,
    previous: &Tensor<F>,
    weight_t: &Tensor<F>,
    d_projected: &mut Tensor<F>,
    d_recurrent: &mut Tensor<F>,
    batch: u32,
    seq: u32,
    reverse: u32,
    #[comptime] hidden: u32,
    #[comptime] rows: u32,
    #[comptime] parts: u32,
    #[comptime] lstm: bool,
    #[define(F)] _dtype: StorageType,
) {
    let h_len = hidden as usize;
    let rows_len = rows as usize;
    let gates = comptime!(if lstm { 4usize } else { 3usize });
    let width = gates * h_len;
    let kept = comptime!(if lstm { 5usize } else { 4usize });
    let seq = seq as usize;
    let r = UNIT_POS_Y as usize;
    let part = UNIT_POS_Z as usize;
    let b = CUBE_POS_X as usize * rows_len + r;
    let active = b < batch as usize;
    let stride = CUBE_DIM_X as usize;
    let one = F::new(1.0);
    let (from, to) = share(part, parts, width);

    // The gate derivatives of a step, two buffers (one step writes one while the next reads the
    // other); `∂h` carried to the step before (owned by the part-0 unit of each hidden unit); LSTM
    // `∂c`; each part's sums of `∂gates · W_hᵀ`, `parts × rows × H`.
    let mut derivatives = SharedMemory::<F>::new(2 * rows_len * gates * h_len);
    let mut carried = SharedMemory::<F>::new(rows_len * h_len);
    let mut carried_cell = SharedMemory::<F>::new(rows_len * h_len);
    let mut sums = SharedMemory::<F>::new(parts as usize * rows_len * h_len);
    let mut k = UNIT_POS_X as usize;
    while k < h_len && part == 0 {
        carried[r * h_len + k] = F::new(0.0);
        carried_cell[r * h_len + k] = F::new(0.0);
        k += stride;
    }

    for back in 0..seq {
        // `s`: the step's place in the order the forward loop ran; `t`: its position.
        let s = seq - 1 - back;
        let t = if reverse == 1 { seq - 1 - s } else { s };
        let buffer = (back % 2) * rows_len * width + r * width;
        if active && part == 0 {
            let row = b * seq + t;
            let mut k = UNIT_POS_X as usize;
            while k < h_len {
                let dh = grad[row * h_len + k] + carried[r * h_len + k];
                let at = row * kept * h_len + k;
                let out = row * width + k;
                if lstm {
                    let i = tape[at];
                    let f = tape[at + h_len];
                    let o = tape[at + 2 * h_len];
                    let g = tape[at + 3 * h_len];
                    let c_tanh = tape[at + 4 * h_len].tanh();
                    let mut c_before = F::new(0.0);
                    if s > 0 {
                        let t_before = if reverse == 1 { t + 1 } else { t - 1 };
                        c_before = tape[(b * seq + t_before) * kept * h_len + 4 * h_len + k];
                    }
                    let d_cell = (one - c_tanh * c_tanh) * o * dh + carried_cell[r * h_len + k];
                    carried_cell[r * h_len + k] = d_cell * f;
                    let d_i = d_cell * g * i * (one - i);
                    let d_f = d_cell * c_before * f * (one - f);
                    let d_o = dh * c_tanh * o * (one - o);
                    let d_g = d_cell * i * (one - g * g);
                    d_projected[out] = d_i;
                    d_projected[out + h_len] = d_f;
                    d_projected[out + 2 * h_len] = d_o;
                    d_projected[out + 3 * h_len] = d_g;
                    derivatives[buffer + k] = d_i;
                    derivatives[buffer + h_len + k] = d_f;
                    derivatives[buffer + 2 * h_len + k] = d_o;
                    derivatives[buffer + 3 * h_len + k] = d_g;
                } else {
                    let z = tape[at];
                    let reset = tape[at + h_len];
                    let hidden_new = tape[at + 2 * h_len];
                    let n = tape[at + 3 * h_len];
                    let direct = dh * z;
                    let d_z = (previous[row * h_len + k] - n) * dh * z * (one - z);
                    let d_n = (one - n * n) * (dh - direct);
                    let d_r = d_n * hidden_new * reset * (one - reset);
                    d_projected[out] = d_z;
                    d_projected[out + h_len] = d_r;
                    d_projected[out + 2 * h_len] = d_n;
                    d_recurrent[out] = d_z;
                    d_recurrent[out + h_len] = d_r;
                    d_recurrent[out + 2 * h_len] = d_n * reset;
                    derivatives[buffer + k] = d_z;
                    derivatives[buffer + h_len + k] = d_r;
                    derivatives[buffer + 2 * h_len + k] = d_n * reset;
                    // `h'` depends on `h` directly too: `z · ∂h'` joins what `W_h` carries back.
                    carried[r * h_len + k] = direct;
                }
                k += stride;
            }
        }
        sync_cube();
        // This part's terms of `∂gates · W_hᵀ` for the unit's hidden units, then part 0 adds the
        // parts' sums to what it carries back.
        let own = (part * rows_len + r) * h_len;
        let mut k = UNIT_POS_X as usize;
        while k < h_len && active && s > 0 {
            let mut sum = F::new(0.0);
            for j in from..to {
                sum += derivatives[buffer + j] * weight_t[j * h_len + k];
            }
            sums[own + k] = sum;
            k += stride;
        }
        sync_cube();
        k = UNIT_POS_X as usize;
        while k < h_len && active && s > 0 && part == 0 {
            let sum = gathered(&sums, parts, rows_len * h_len, r * h_len + k);
            if lstm {
                carried[r * h_len + k] = sum;
            } else {
                carried[r * h_len + k] += sum;
            }
            k += stride;
        }
    }
}

/// How the kernels are laid out for one layer: units per cube along the hidden axis, batch rows
/// per cube, and parts each hidden unit's sums over `W_h` are split into (a unit per part, which
/// shortens the chain of weight reads each unit waits for in every step).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    units: u32,
    rows: u32,
    parts: u32,
}

/// Parts a hidden unit's sums are split into, at most.
const MAX_PARTS: u32 = 8;
/// Terms of `h · W_h` a part sums, at least: shorter and adding the parts up costs more than the
/// split saves.
const MIN_TERMS: usize = 16;

/// Units per cube at most: enough to keep a GPU's cores busy, few enough to stay under every
/// backend's limit (Vulkan guarantees 128 invocations per workgroup; lavapipe, NVIDIA and
/// Apple allow 1,024).
const MAX_UNITS: u32 = 256;

impl Launch {
    /// The layout for `batch` rows of `hidden` units, or `None` when the kernels' shared memory
    /// (the backward kernel's `2 · G·H + 3 · H` values a row with one part) does not fit in
    /// `shared_bytes` even with one row per cube, or the cubes exceed `max_cubes`. The parts are as many (a power of two)
    /// as the units per cube, the shared memory and [`MIN_TERMS`] allow.
    pub(crate) fn plan(
        cell: Cell,
        batch: usize,
        hidden: usize,
        shared_bytes: usize,
        max_units: u32,
        max_cubes: u32,
    ) -> Option<Self> {
        let units = (hidden as u32).min(MAX_UNITS).min(max_units);
        // Shared memory per batch row with `parts` parts: the forward kernel's state, cells and
        // sums, or the backward kernel's derivatives, carried values and sums, the larger.
        let per_row = |parts: usize| {
            let (g, h) = (cell.gates(), hidden);
            (3 * h + parts * g * h).max(2 * g * h + 2 * h + parts * h) * std::mem::size_of::<f32>()
        };
        let fit = shared_bytes / per_row(1);
        if fit == 0 || units == 0 {
            return None;
        }
        // One row per cube keeps the most cubes in flight; a large batch shares each weight read
        // between a few rows.
        let wanted = batch.div_ceil(128).max(1);
        let rows = wanted.min(fit).min((max_units / units) as usize).max(1) as u32;
        let fits = |parts: u32| {
            rows as usize * per_row(parts as usize) <= shared_bytes
                && units * rows * parts <= max_units
                && hidden / parts as usize >= MIN_TERMS
        };
        let parts = (0..=MAX_PARTS.ilog2()).rev().map(|e| 1 << e).find(|&p| fits(p)).unwrap_or(1);
        (batch.div_ceil(rows as usize) <= max_cubes as usize).then_some(Self { units, rows, parts })
    }
}

impl Launch {
    /// The cubes and their units for `batch` rows.
    fn geometry(&self, batch: usize) -> (CubeCount, CubeDim) {
        let count = CubeCount::Static((batch as u32).div_ceil(self.rows), 1, 1);
        (count, CubeDim::new_3d(self.units, self.rows, self.parts))
    }

    /// Weight reads one unit waits for in a step: its part of `length` terms for each of its
    /// share of the `hidden` units.
    fn terms(&self, hidden: usize, length: usize) -> usize {
        hidden.div_ceil(self.units as usize) * length.div_ceil(self.parts as usize)
    }
}

/// The layout for `batch` rows of `hidden` units on `device`, if the kernels support it there.
pub(crate) fn plan<R: CubeRuntime>(cell: Cell, batch: usize, hidden: usize, device: &R::Device) -> Option<Launch> {
    let hardware = R::client(device).properties().hardware.clone();
    let (shared, units, cubes) =
        (hardware.max_shared_memory_size, hardware.max_units_per_cube, hardware.max_cube_count.0);
    Launch::plan(cell, batch, hidden, shared, units, cubes)
}

/// Runs the forward kernel (the shape must be one [`plan`] accepts). Returns the hidden states
/// `[batch, seq, H]` and, when `record`, the tape.
pub(crate) fn forward<R: CubeRuntime>(
    cell: Cell,
    projected: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: CubeTensor<R>,
    reverse: bool,
    record: bool,
) -> (CubeTensor<R>, Option<RecurrenceTape<CubeTensor<R>>>) {
    let lstm = cell == Cell::Lstm;
    let [batch, seq, _] = projected.shape().dims::<3>();
    let hidden = weight.shape().dims::<2>()[0];
    let launch = plan::<R>(cell, batch, hidden, &projected.device).expect("the caller checked the shape");
    let (projected, weight, bias) = (into_contiguous(projected), into_contiguous(weight), into_contiguous(bias));
    let output = empty_like(&projected, Shape::new([batch, seq, hidden]));
    let (tape, previous) = if record {
        (
            empty_like(&projected, Shape::new([batch, seq, taped(lstm) * hidden])),
            empty_like(&projected, Shape::new([batch, seq, hidden])),
        )
    } else {
        (empty_like(&projected, Shape::new([1])), empty_like(&projected, Shape::new([1])))
    };
    let dtype = projected.dtype;
    let client = projected.client.clone();
    let (count, dim) = launch.geometry(batch);
    note(|| {
        // Each step a unit sums `h · W_h` for its hidden units, a weight read per term.
        let gates = cell.gates();
        let values = batch * seq * (gates + 1 + if record { taped(lstm) + 1 } else { 0 }) * hidden;
        let work = Work::of("recurrence::forward_kernel", &count, dim).moves(values + gates * hidden * hidden);
        work.computes(2 * batch * seq * gates * hidden * hidden)
            .waits(seq * (launch.terms(hidden, hidden) + 2), seq * (launch.parts as usize + 1))
    });
    forward_kernel::launch::<R>(
        &client,
        count,
        dim,
        projected.into_tensor_arg(),
        weight.clone().into_tensor_arg(),
        bias.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        tape.clone().into_tensor_arg(),
        previous.clone().into_tensor_arg(),
        batch as u32,
        seq as u32,
        reverse as u32,
        hidden as u32,
        launch.rows,
        launch.parts,
        lstm,
        record,
        dtype.into(),
    );
    let tape = record.then(|| RecurrenceTape { cell, reverse, weight, values: tape, previous });
    (output, tape)
}

/// Back-propagation through time from the gradient of the output, `[batch, seq, H]`, with the
/// hidden weight transposed, `[G·H, H]`: the gradient of `projected` `[batch, seq, G·H]`, and
/// the gradient of `h · W_h + b` and the steps' starting states as `[batch · seq, ·]` rows, whose
/// products are the gradients of `W_h` and `b`.
pub(crate) fn backward<R: CubeRuntime>(
    tape: RecurrenceTape<CubeTensor<R>>,
    grad: CubeTensor<R>,
    weight_t: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let lstm = tape.cell == Cell::Lstm;
    let [batch, seq, hidden] = grad.shape().dims::<3>();
    let launch = plan::<R>(tape.cell, batch, hidden, &grad.device).expect("the forward pass ran with this shape");
    let width = tape.cell.gates() * hidden;
    let (grad, weight_t) = (into_contiguous(grad), into_contiguous(weight_t));
    let d_projected = empty_like(&grad, Shape::new([batch, seq, width]));
    let d_recurrent =
        if lstm { empty_like(&grad, Shape::new([1])) } else { empty_like(&grad, Shape::new([batch, seq, width])) };
    let dtype = grad.dtype;
    let client = grad.client.clone();
    let (count, dim) = launch.geometry(batch);
    note(|| {
        // Each step a unit sums `∂gates · W_hᵀ` for its hidden units, a weight read per term.
        // The GRU writes the gradient of `h · W_h + b` apart from the projections'.
        let written = if lstm { width } else { 2 * width };
        let values = batch * seq * ((2 + taped(lstm)) * hidden + written);
        let work = Work::of("recurrence::backward_kernel", &count, dim).moves(values + width * hidden);
        work.computes(2 * batch * seq * width * hidden)
            .waits(seq * (launch.terms(hidden, width) + 4), seq * (launch.parts as usize + 2))
    });
    backward_kernel::launch::<R>(
        &client,
        count,
        dim,
        grad.into_tensor_arg(),
        into_contiguous(tape.values).into_tensor_arg(),
        into_contiguous(tape.previous.clone()).into_tensor_arg(),
        weight_t.into_tensor_arg(),
        d_projected.clone().into_tensor_arg(),
        d_recurrent.clone().into_tensor_arg(),
        batch as u32,
        seq as u32,
        tape.reverse as u32,
        hidden as u32,
        launch.rows,
        launch.parts,
        lstm,
        dtype.into(),
    );
    let rows = |t: CubeTensor<R>, columns: usize| reshape(into_contiguous(t), Shape::new([batch * seq, columns]));
    let recurrent = if lstm { d_projected.clone() } else { d_recurrent };
    (d_projected, rows(recurrent, width), rows(tape.previous, hidden))
}

/// A contiguous `tensor` seen with another shape of as many values (no copy).
fn reshape<R: CubeRuntime>(tensor: CubeTensor<R>, shape: Shape) -> CubeTensor<R> {
    debug_assert!(tensor.is_contiguous() && tensor.shape().num_elements() == shape.num_elements());
    CubeTensor::new_contiguous(tensor.client, tensor.device, shape, tensor.handle, tensor.dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_fits_the_shared_memory_or_there_is_none() {
        // 48 KiB: an LSTM of hidden 512 needs 20 KiB a row.
        let plan = Launch::plan(Cell::Lstm, 64, 512, 48 * 1024, 1024, 65535).expect("fits");
        assert_eq!(plan, Launch { units: 256, rows: 1, parts: 4 });
        assert!(Launch::plan(Cell::Lstm, 64, 2048, 48 * 1024, 1024, 65535).is_none());
        // A large batch shares weight reads between rows, within the units per cube.
        let plan = Launch::plan(Cell::Gru, 1024, 16, 48 * 1024, 1024, 65535).expect("fits");
        assert_eq!(plan, Launch { units: 16, rows: 8, parts: 1 });
        assert_eq!(Launch::plan(Cell::Gru, 3, 6, 16 * 1024, 128, 65535), Some(Launch { units: 6, rows: 1, parts: 1 }));
        // The reference shape: a hidden unit's sums split eight ways where a cube takes 1,024
        // units, two ways where it takes 256.
        let plan = Launch::plan(Cell::Lstm, 64, 128, 48 * 1024, 1024, 65535);
        assert_eq!(plan, Some(Launch { units: 128, rows: 1, parts: 8 }));
        let plan = Launch::plan(Cell::Lstm, 64, 128, 48 * 1024, 256, 65535);
        assert_eq!(plan, Some(Launch { units: 128, rows: 1, parts: 2 }));
        // More cubes than the device can count: none.
        assert!(Launch::plan(Cell::Gru, 1 << 30, 512, 48 * 1024, 1024, 65535).is_none());
    }
}
