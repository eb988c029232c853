//! The time loop of an LSTM or GRU layer as **one autodiff operation** with a hand-written
//! backward pass (back-propagation through time), as cuDNN and PyTorch run it.
//!
//! Burn's autodiff records every small tensor operation of every time step (about 17 per LSTM
//! step) and replays each in the backward pass; on a CPU that bookkeeping, not the arithmetic,
//! dominates a recurrent layer. Here the forward loop runs on the *inner* backend, untracked,
//! keeps the gate values each step needs for its backward, and registers one node whose backward
//! computes the gradients of the whole sequence: per step only the gate derivatives and one
//! matmul by the transposed hidden weight; the weight and bias gradients of all steps come from
//! one matmul and one sum at the end.
//!
//! The input projection `x · W_x + b_x` of every time step is *not* part of it: callers compute it
//! with ordinary (tracked) tensor operations as one large matmul, and this operation takes it as its
//! input `projected`.
//!
//! [`recurrence`] checks at run time ([`crate::cpu::dispatch`]) whether `B` is
//! `Autodiff<I>` for one of the inner backends compiled into this crate (Flex, ndarray, and wgpu /
//! CUDA with the features of those names) and takes the fast path there: on the CPU backends the
//! loop runs in host memory ([`crate::cpu::recurrence`]), on the GPU backends as two kernels,
//! one launch forward and one backward ([`crate::gpu::recurrence`]), where the kernels support
//! the shape (else as tensor operations). Without autodiff, the CPU and GPU backends run the same
//! forward loops. On any other backend the loop runs as ordinary tensor operations: correct, only
//! slower.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::backend::Which;
use crate::cpu::dispatch::{record_node, same_type};
pub(crate) use crate::cpu::recurrence::Cell;
use crate::cpu::recurrence::{self as host_loop, order, HostTape};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::gpu::{GpuKernels, RecurrenceTape};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use burn::tensor::ops::FloatTensor;

/// Runs `cell` over `projected` (`[batch, seq, gates × hidden]`: the input projection
/// `x · W_x + b_x` of every step), with hidden weight `weight` (`[hidden, gates × hidden]`) and
/// hidden bias `bias` (`[gates × hidden]`), from zero initial states; backwards in time when
/// `reverse`. Returns the hidden state of every step, `[batch, seq, hidden]`.
pub(crate) fn recurrence<B: Backend>(
    cell: Cell,
    projected: Tensor<B, 3>,
    weight: Tensor<B, 2>,
    bias: Tensor<B, 1>,
    reverse: bool,
) -> Tensor<B, 3> {
    let [_, seq, width] = projected.dims();
    let [hidden, weight_width] = weight.dims();
    assert!(
        seq > 0 && width == cell.gates() * hidden && weight_width == width && bias.dims() == [width],
        "recurrence: {cell:?} over {:?} with a {:?} hidden weight and a {:?} bias",
        projected.dims(),
        weight.dims(),
        bias.dims()
    );
    let inputs = Inputs { projected, weight, bias };
    match one_node::<B>() {
        Some(run) => run(cell, inputs, reverse),
        None if Which::of::<B>().on_cpu() => {
            host_loop::forward(cell, inputs.projected, inputs.weight, inputs.bias, reverse, false).0
        }
        None => match gpu_forward::<B>() {
            Some(run) => run(cell, inputs, reverse),
            None => forward(cell, inputs, reverse, false).0,
        },
    }
}

/// Whether [`recurrence`] runs as one autodiff node on `B` (`B` is `Autodiff<I>` for an inner
/// backend compiled into this crate); otherwise it runs as ordinary tensor operations.
pub(crate) fn runs_as_one_node<B: Backend>() -> bool {
    one_node::<B>().is_some()
}

/// The time loop as one autodiff node on `Autodiff<I>`, for a `B` that is that type.
type OneNode<B> = fn(Cell, Inputs<B>, bool) -> Tensor<B, 3>;

/// `B`'s one-node path, if `B` is `Autodiff<I>` for an inner backend compiled into this crate.
/// CPU backends run the loop's arithmetic in host memory ([`crate::cpu::recurrence`]), GPU
/// backends in two kernels ([`crate::gpu::recurrence`]).
fn one_node<B: Backend>() -> Option<OneNode<B>> {
    match Which::of::<B>() {
        #[cfg(feature = "flex")]
        Which::AutodiffFlex => Some(on_autodiff_host::<B, burn::backend::Flex>),
        #[cfg(feature = "ndarray")]
        Which::AutodiffNdArray => Some(on_autodiff_host::<B, burn::backend::NdArray>),
        #[cfg(feature = "wgpu")]
        Which::AutodiffWgpu => Some(on_autodiff_gpu::<B, burn::backend::Wgpu>),
        #[cfg(feature = "cuda")]
        Which::AutodiffCuda => Some(on_autodiff_gpu::<B, burn::backend::Cuda>),
        _ => None,
    }
}

/// The forward kernel of a GPU backend compiled into this crate, if `B` is one (no autodiff).
fn gpu_forward<B: Backend>() -> Option<OneNode<B>> {
    match Which::of::<B>() {
        #[cfg(feature = "wgpu")]
        Which::Wgpu => Some(on_gpu::<B, burn::backend::Wgpu>),
        #[cfg(feature = "cuda")]
        Which::Cuda => Some(on_gpu::<B, burn::backend::Cuda>),
        _ => None,
    }
}

/// Where the one-node loop's arithmetic runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loop {
    /// In host memory, one pass per step ([`crate::cpu::recurrence`]).
    Host,
    /// As tensor operations on the backend ([`forward`]): GPU shapes the kernels do not support.
    #[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), expect(dead_code))]
    Tensors,
}

/// The three inputs of the operation.
#[derive(Clone, Debug)]
struct Inputs<B: Backend> {
    projected: Tensor<B, 3>,
    weight: Tensor<B, 2>,
    bias: Tensor<B, 1>,
}

/// The one-node path for `B` = `Autodiff<I>`, its loop in host memory.
fn on_autodiff_host<B: Backend, I: Backend>(cell: Cell, inputs: Inputs<B>, reverse: bool) -> Tensor<B, 3> {
    same_type(tracked::<I>(cell, same_type(inputs), reverse, Loop::Host))
}

/// The forward loop on the GPU backend `B` = `G`: the forward kernel where it supports the shape.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn on_gpu<B: Backend, G: GpuKernels>(cell: Cell, inputs: Inputs<B>, reverse: bool) -> Tensor<B, 3> {
    let Inputs { projected, weight, bias } = same_type::<_, Inputs<G>>(inputs);
    let [batch, _, _] = projected.dims();
    let hidden = match G::recurrence_supports(cell, batch, weight.dims()[0], &projected.device()) {
        true => {
            let (p, w, b) =
                (projected.into_primitive().tensor(), weight.into_primitive().tensor(), bias.into_primitive().tensor());
            Tensor::from_primitive(TensorPrimitive::Float(G::recurrence_forward(cell, p, w, b, reverse, false).0))
        }
        false => forward(cell, Inputs { projected, weight, bias }, reverse, false).0,
    };
    same_type(hidden)
}

/// The one-node path for `B` = `Autodiff<G>` on a GPU backend: the kernels where they support
/// the shape, else the loop as tensor operations.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn on_autodiff_gpu<B: Backend, G: GpuKernels>(cell: Cell, inputs: Inputs<B>, reverse: bool) -> Tensor<B, 3> {
    let inputs: Inputs<Autodiff<G>> = same_type(inputs);
    let [batch, _, _] = inputs.projected.dims();
    let hidden = inputs.weight.dims()[0];
    let supported = G::recurrence_supports(cell, batch, hidden, &inputs.projected.device());
    same_type(match supported {
        true => tracked_kernel::<G>(cell, inputs, reverse),
        false => tracked::<G>(cell, inputs, reverse, Loop::Tensors),
    })
}

/// Runs the GPU kernels on `G` and registers one autodiff node for them.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn tracked_kernel<G: GpuKernels>(cell: Cell, inputs: Inputs<Autodiff<G>>, reverse: bool) -> Tensor<Autodiff<G>, 3> {
    let parents = [
        inputs.projected.into_primitive().tensor(),
        inputs.weight.into_primitive().tensor(),
        inputs.bias.into_primitive().tensor(),
    ];
    let output = record_node(KernelBackward, parents, |[projected, weight, bias], record| {
        G::recurrence_forward(cell, projected, weight, bias, reverse, record)
    });
    Tensor::from_primitive(TensorPrimitive::Float(output))
}

/// The autodiff node of one recurrence run by the GPU kernels.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[derive(Debug)]
struct KernelBackward;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl<G: GpuKernels> Backward<G, 3> for KernelBackward {
    type State = RecurrenceTape<FloatTensor<G>>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<G>(&ops.node);
        let (projected, weight, bias) = G::recurrence_backward(ops.state, grad);
        for (node, gradient) in ops.parents.into_iter().zip([projected, weight, bias]) {
            if let Some(node) = node {
                grads.register::<G>(node.id, gradient);
            }
        }
    }
}

/// Runs the loop on `I` and registers one autodiff node for it.
fn tracked<I: Backend>(cell: Cell, inputs: Inputs<Autodiff<I>>, reverse: bool, how: Loop) -> Tensor<Autodiff<I>, 3> {
    let parents = [
        inputs.projected.into_primitive().tensor(),
        inputs.weight.into_primitive().tensor(),
        inputs.bias.into_primitive().tensor(),
    ];
    let output = record_node(RecurrenceBackward, parents, |[projected, weight, bias], record| {
        let inner = Inputs::<I> {
            projected: Tensor::from_primitive(TensorPrimitive::Float(projected)),
            weight: Tensor::from_primitive(TensorPrimitive::Float(weight)),
            bias: Tensor::from_primitive(TensorPrimitive::Float(bias)),
        };
        let (hidden, tape) = match how {
            Loop::Host => {
                let (hidden, tape) =
                    host_loop::forward(cell, inner.projected, inner.weight, inner.bias, reverse, record);
                (hidden, tape.map(Taped::Host))
            }
            Loop::Tensors => {
                let (hidden, tape) = forward(cell, inner, reverse, record);
                (hidden, tape.map(Taped::Tensors))
            }
        };
        (hidden.into_primitive().tensor(), tape)
    });
    Tensor::from_primitive(TensorPrimitive::Float(output))
}

/// The autodiff node of one recurrence.
#[derive(Debug)]
struct RecurrenceBackward;

impl<I: Backend> Backward<I, 3> for RecurrenceBackward {
    type State = Taped<I>;

    fn backward(self, ops: Ops<Taped<I>, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = Tensor::<I, 3>::from_primitive(TensorPrimitive::Float(grads.consume::<I>(&ops.node)));
        let Inputs { projected, weight, bias } = match ops.state {
            Taped::Tensors(tape) => tape.backward(grad),
            Taped::Host(tape) => {
                let (projected, weight, bias) = tape.backward(grad);
                Inputs { projected, weight, bias }
            }
        };
        let gradients = [projected.into_primitive(), weight.into_primitive(), bias.into_primitive()];
        for (node, gradient) in ops.parents.into_iter().zip(gradients) {
            if let Some(node) = node {
                grads.register::<I>(node.id, gradient.tensor());
            }
        }
    }
}

/// The tape of either loop.
#[derive(Clone, Debug)]
enum Taped<B: Backend> {
    Tensors(Tape<B>),
    Host(HostTape<B>),
}

/// What the backward pass needs of the forward pass: the hidden weight, and per step (in the order
/// the steps ran) the hidden state it started from and its gate values.
#[derive(Clone, Debug)]
struct Tape<B: Backend> {
    cell: Cell,
    reverse: bool,
    weight: Tensor<B, 2>,
    previous: Vec<Tensor<B, 2>>,
    steps: Vec<StepTape<B>>,
}

/// One step's gate values (after their activations).
#[derive(Clone, Debug)]
enum StepTape<B: Backend> {
    Lstm {
        /// `[i, f, o]`, sigmoid outputs.
        ifo: Tensor<B, 2>,
        /// The candidate, `tanh` output.
        candidate: Tensor<B, 2>,
        /// The cell state the step started from.
        cell: Tensor<B, 2>,
        /// `tanh` of the cell state the step ended with.
        cell_tanh: Tensor<B, 2>,
    },
    Gru {
        /// `[z, r]`, sigmoid outputs.
        zr: Tensor<B, 2>,
        /// `h · W_n + b_n`, before the reset gate scales it.
        hidden_new: Tensor<B, 2>,
        /// The new-gate output `n`, `tanh` output.
        new: Tensor<B, 2>,
    },
}

fn sigmoid<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    burn::tensor::activation::sigmoid(x)
}

fn tanh<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    x.tanh()
}

/// `1 − x²`: the derivative of `tanh` from its output.
fn tanh_derivative<B: Backend>(y: Tensor<B, 2>) -> Tensor<B, 2> {
    y.clone().mul(y).neg().add_scalar(1.0)
}

/// `y · (1 − y)`: the derivative of the sigmoid from its output.
fn sigmoid_derivative<B: Backend>(y: Tensor<B, 2>) -> Tensor<B, 2> {
    y.clone().sub(y.clone().mul(y))
}

/// `[batch, seq, features]` → one `[batch, features]` tensor per step.
///
/// Under autodiff (the ordinary-operations path), Burn's backward of a slice writes into a zeroed
/// tensor the size of its whole input, so `seq` slices straight out of `x` would cost `seq`
/// full-size tensors (quadratic in the sequence length); blocks of about √seq steps, then steps
/// out of each block, cost about 2√seq. On the inner backend the slices are views either way.
fn steps<B: Backend>(x: Tensor<B, 3>) -> Vec<Tensor<B, 2>> {
    let [batch, seq, features] = x.dims();
    let block = (seq as f64).sqrt().ceil() as usize;
    (0..seq)
        .step_by(block)
        .flat_map(|start| {
            let len = block.min(seq - start);
            let block = x.clone().narrow(1, start, len);
            (0..len).map(move |t| block.clone().narrow(1, t, 1).reshape([batch, features]))
        })
        .collect()
}

/// The inverse of [`steps`].
fn sequence<B: Backend>(steps: Vec<Tensor<B, 2>>) -> Tensor<B, 3> {
    Tensor::stack(steps, 1)
}

/// The time loop; with `record`, also the tape for the backward pass.
fn forward<B: Backend>(cell: Cell, inputs: Inputs<B>, reverse: bool, record: bool) -> (Tensor<B, 3>, Option<Tape<B>>) {
    let Inputs { projected, weight, bias } = inputs;
    let [batch, seq, width] = projected.dims();
    let hidden = width / cell.gates();
    let device = projected.device();
    let inputs = steps(projected);
    // Broadcast once: a broadcasting add costs CPU backends ~10× a same-shape one, at every step.
    let bias = Tensor::<B, 2>::zeros([batch, width], &device) + bias.unsqueeze::<2>();
    let gate = |x: &Tensor<B, 2>, k: usize, count: usize| x.clone().narrow(1, k * hidden, count * hidden);
    let mut outputs: Vec<Option<Tensor<B, 2>>> = vec![None; seq];
    let mut previous = Vec::with_capacity(if record { seq } else { 0 });
    let mut tapes = Vec::with_capacity(if record { seq } else { 0 });
    let mut h = Tensor::<B, 2>::zeros([batch, hidden], &device);
    let mut c = h.clone();
    for t in order(seq, reverse) {
        let recurrent = h.clone().matmul(weight.clone()) + bias.clone();
        let (next, tape) = match cell {
            Cell::Lstm => {
                let gates = recurrent + inputs[t].clone();
                let ifo = sigmoid(gate(&gates, 0, 3));
                let candidate = tanh(gate(&gates, 3, 1));
                let [i, f, o] = [0, 1, 2].map(|k| gate(&ifo, k, 1));
                let next_c = f * c.clone() + i * candidate.clone();
                let cell_tanh = tanh(next_c.clone());
                let next = o * cell_tanh.clone();
                let tape = StepTape::Lstm { ifo, candidate, cell: std::mem::replace(&mut c, next_c), cell_tanh };
                (next, tape)
            }
            Cell::Gru => {
                let x = &inputs[t];
                let zr = sigmoid(gate(&recurrent, 0, 2) + gate(x, 0, 2));
                let [z, r] = [0, 1].map(|k| gate(&zr, k, 1));
                let hidden_new = gate(&recurrent, 2, 1);
                let new = tanh(r * hidden_new.clone() + gate(x, 2, 1));
                // (1 − z) · n + z · h, with one multiplication.
                let next = new.clone() + z * (h.clone() - new.clone());
                (next, StepTape::Gru { zr, hidden_new, new })
            }
        };
        if record {
            previous.push(h);
            tapes.push(tape);
        }
        outputs[t] = Some(next.clone());
        h = next;
    }
    let outputs = outputs.into_iter().map(|h| h.expect("every step ran")).collect();
    let tape = record.then(|| Tape { cell, reverse, weight, previous, steps: tapes });
    (sequence(outputs), tape)
}

impl<B: Backend> Tape<B> {
    /// Back-propagation through time: the gradients of `projected`, `weight` and `bias` from the
    /// gradient of the output (`[batch, seq, hidden]`).
    fn backward(self, grad: Tensor<B, 3>) -> Inputs<B> {
        let [_, seq, hidden] = grad.dims();
        let grads = steps(grad);
        let gate = |x: &Tensor<B, 2>, k: usize| x.clone().narrow(1, k * hidden, hidden);
        let times = order(seq, self.reverse);
        let weight_t = self.weight.transpose();
        let mut projected: Vec<Option<Tensor<B, 2>>> = vec![None; seq];
        // Per step (in the order the steps ran, like `previous`): the gradient of `W_h · h + b`.
        let mut recurrent = Vec::with_capacity(seq);
        let mut dh: Option<Tensor<B, 2>> = None; // from the next step to run, through `W_h · h`
        let mut dc: Option<Tensor<B, 2>> = None; // LSTM: from the next step, through `f · c`
        for (s, step) in self.steps.into_iter().enumerate().rev() {
            let t = times[s];
            let dh_total = match dh.take() {
                Some(d) => d + grads[t].clone(),
                None => grads[t].clone(),
            };
            let (d_projected, d_recurrent, d_previous) = match step {
                StepTape::Lstm { ifo, candidate, cell, cell_tanh } => {
                    let [i, f, o] = [0, 1, 2].map(|k| gate(&ifo, k));
                    let d_o = dh_total.clone() * cell_tanh.clone();
                    let d_cell = tanh_derivative(cell_tanh) * o * dh_total;
                    let d_cell = match dc.take() {
                        Some(d) => d_cell + d,
                        None => d_cell,
                    };
                    let d_i = d_cell.clone() * candidate.clone();
                    let d_f = d_cell.clone() * cell;
                    let d_candidate = d_cell.clone() * i;
                    dc = Some(d_cell * f);
                    let d_ifo = Tensor::cat(vec![d_i, d_f, d_o], 1) * sigmoid_derivative(ifo);
                    let d_gates = Tensor::cat(vec![d_ifo, d_candidate * tanh_derivative(candidate)], 1);
                    (d_gates.clone(), d_gates, None)
                }
                StepTape::Gru { zr, hidden_new, new } => {
                    let [z, r] = [0, 1].map(|k| gate(&zr, k));
                    let d_direct = dh_total.clone() * z;
                    let d_z = (self.previous[s].clone() - new.clone()) * dh_total.clone();
                    let d_new = tanh_derivative(new) * (dh_total - d_direct.clone());
                    let d_zr = Tensor::cat(vec![d_z, d_new.clone() * hidden_new], 1) * sigmoid_derivative(zr);
                    let d_projected = Tensor::cat(vec![d_zr.clone(), d_new.clone()], 1);
                    let d_recurrent = Tensor::cat(vec![d_zr, d_new * r], 1);
                    (d_projected, d_recurrent, Some(d_direct))
                }
            };
            if s > 0 {
                let d_h = d_recurrent.clone().matmul(weight_t.clone());
                dh = Some(match d_previous {
                    Some(direct) => d_h + direct,
                    None => d_h,
                });
            }
            projected[t] = Some(d_projected);
            recurrent.push(d_recurrent);
        }
        recurrent.reverse();
        let width = self.cell.gates() * hidden;
        let recurrent = Tensor::cat(recurrent, 0); // [seq · batch, width], steps in run order
        let previous = Tensor::cat(self.previous, 0); // [seq · batch, hidden], the same order
        Inputs {
            projected: sequence(projected.into_iter().map(|d| d.expect("every step ran")).collect()),
            weight: previous.transpose().matmul(recurrent.clone()),
            bias: recurrent.sum_dim(0).reshape([width]),
        }
    }
}
