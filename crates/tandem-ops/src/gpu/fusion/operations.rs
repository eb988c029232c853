//! The fusion operations behind [`super`]: each runs the inner CubeCL backend's kernels on the
//! tensors fusion hands it when the stream executes; their inputs and outputs are in the order
//! [`super`] registers them.

use std::marker::PhantomData;

use burn_fusion::stream::Operation;
use burn_fusion::{FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, TensorIr};

use crate::adamw::AdamWScalars;
use crate::cpu::recurrence::Cell;
use crate::gpu::{AttentionSpec, AttentionTape, GpuKernels, LayerNormTape, RecurrenceTape, RowOp, RowTape};

pub(super) type Handles<B> = HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// The forward kernel as a fusion operation: inputs `[projected, weight, bias]`, outputs
/// `[hidden states]`, with the tape `[…, values, previous]` when recording.
#[derive(Debug)]
pub(super) struct Forward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) cell: Cell,
    pub(super) reverse: bool,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for Forward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let [projected, weight, bias] = [0, 1, 2].map(|i| handles.get_float_tensor::<B>(&self.desc.inputs[i]));
        let record = self.desc.outputs.len() == 3;
        let (hidden, tape) = B::recurrence_forward(self.cell, projected, weight, bias, self.reverse, record);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, hidden);
        if let Some(tape) = tape {
            handles.register_float_tensor::<B>(&self.desc.outputs[1].id, tape.values);
            handles.register_float_tensor::<B>(&self.desc.outputs[2].id, tape.previous);
        }
    }
}

/// The backward pass as a fusion operation: inputs `[grad, weight, values, previous]`, outputs
/// the gradients `[projected, weight, bias]`.
#[derive(Debug)]
pub(super) struct Backward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) cell: Cell,
    pub(super) reverse: bool,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for Backward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let [grad, weight, values, previous] =
            [0, 1, 2, 3].map(|i| handles.get_float_tensor::<B>(&self.desc.inputs[i]));
        let tape = RecurrenceTape { cell: self.cell, reverse: self.reverse, weight, values, previous };
        let (projected, weight, bias) = B::recurrence_backward(tape, grad);
        for (output, gradient) in self.desc.outputs.iter().zip([projected, weight, bias]) {
            handles.register_float_tensor::<B>(&output.id, gradient);
        }
    }
}

/// One AdamW step of many parameters as a fusion operation: inputs `[param, grad, moment 1,
/// moment 2]` of each parameter in turn and then `‖g‖²`, outputs each parameter and both its
/// moments after it, in turn.
#[derive(Debug)]
pub(super) struct AdamW<B> {
    pub(super) desc: CustomOpIr,
    pub(super) scalars: AdamWScalars,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for AdamW<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let (norm, parameters) = self.desc.inputs.split_last().expect("the squared norm");
        let tensors = parameters
            .chunks_exact(4)
            .map(|four| [0, 1, 2, 3].map(|i| handles.get_float_tensor::<B>(&four[i])))
            .collect();
        let squared_norm = handles.get_float_tensor::<B>(norm);
        let results = B::adamw(&self.scalars, tensors, squared_norm).into_iter().flatten();
        for (output, tensor) in self.desc.outputs.iter().zip(results) {
            handles.register_float_tensor::<B>(&output.id, tensor);
        }
    }
}

/// Tensors side by side as a fusion operation: inputs the pieces, output the whole.
#[derive(Debug)]
pub(super) struct Concat<B> {
    pub(super) desc: CustomOpIr,
    pub(super) dim: usize,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for Concat<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let pieces = self.desc.inputs.iter().map(|input| handles.get_float_tensor::<B>(input)).collect();
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, B::concat(pieces, self.dim));
    }
}

/// The squared sum of many tensors as a fusion operation: inputs the tensors, output `[1]`.
#[derive(Debug)]
pub(super) struct SquaredSum<B> {
    pub(super) desc: CustomOpIr,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for SquaredSum<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let inputs = self.desc.inputs.iter().map(|input| handles.get_float_tensor::<B>(input)).collect();
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, B::squared_sum(inputs));
    }
}

/// A row operation's forward kernel as a fusion operation: input `[x]`, output `[output]`.
#[derive(Debug)]
pub(super) struct RowsForward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) op: RowOp,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for RowsForward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let x = handles.get_float_tensor::<B>(&self.desc.inputs[0]);
        let (output, _) = B::rows_forward(self.op, x);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, output);
    }
}

/// A row operation's backward kernel as a fusion operation: inputs `[grad]` and the tape's
/// tensors, output the input's gradient.
#[derive(Debug)]
pub(super) struct RowsBackward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) tape: RowTape<TensorIr>,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for RowsBackward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let grad = handles.get_float_tensor::<B>(&self.desc.inputs[0]);
        let tape = self.tape.clone().map(|ir| handles.get_float_tensor::<B>(&ir));
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, B::rows_backward(tape, grad));
    }
}

/// The cross-entropy's forward kernel as a fusion operation: inputs `[logits, labels]`, outputs
/// `[loss, softmax]`.
#[derive(Debug)]
pub(super) struct CrossEntropyForward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for CrossEntropyForward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let logits = handles.get_float_tensor::<B>(&self.desc.inputs[0]);
        let labels = handles.get_int_tensor::<B>(&self.desc.inputs[1]);
        let (loss, softmax) = B::cross_entropy_forward(logits, labels);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, loss);
        handles.register_float_tensor::<B>(&self.desc.outputs[1].id, softmax);
    }
}

/// The cross-entropy's backward kernel as a fusion operation: inputs `[softmax, labels, grad]`,
/// output the logits' gradient.
#[derive(Debug)]
pub(super) struct CrossEntropyBackward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for CrossEntropyBackward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let softmax = handles.get_float_tensor::<B>(&self.desc.inputs[0]);
        let labels = handles.get_int_tensor::<B>(&self.desc.inputs[1]);
        let grad = handles.get_float_tensor::<B>(&self.desc.inputs[2]);
        let logits = B::cross_entropy_backward(softmax, labels, grad);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, logits);
    }
}

/// The windows of a sequence as a fusion operation, forward (input `x`, output the windows) or
/// backward (input their gradient, output `x`'s).
#[derive(Debug)]
pub(super) struct Windows<B> {
    pub(super) desc: CustomOpIr,
    /// `(width, positions)` forward; `(width, seq)` backward.
    pub(super) width: usize,
    pub(super) length: usize,
    pub(super) forward: bool,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for Windows<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let input = handles.get_float_tensor::<B>(&self.desc.inputs[0]);
        let output = match self.forward {
            true => B::windows_forward(input, self.width, self.length),
            false => B::windows_backward(input, self.length, self.width),
        };
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, output);
    }
}

/// Attention's forward kernel as a fusion operation: inputs `[projected, padding]`, outputs
/// `[context, weights]`.
#[derive(Debug)]
pub(super) struct AttentionForward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) spec: AttentionSpec,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for AttentionForward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let [projected, padding] = [0, 1].map(|i| handles.get_float_tensor::<B>(&self.desc.inputs[i]));
        let (context, tape) = B::attention_forward(self.spec, projected, padding);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, context);
        handles.register_float_tensor::<B>(&self.desc.outputs[1].id, tape.weights);
    }
}

/// Attention's backward kernels as a fusion operation: inputs `[grad, projected, padding,
/// weights]`, output the gradient of `projected`.
#[derive(Debug)]
pub(super) struct AttentionBackward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) spec: AttentionSpec,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for AttentionBackward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let [grad, projected, padding, weights] =
            [0, 1, 2, 3].map(|i| handles.get_float_tensor::<B>(&self.desc.inputs[i]));
        let tape = AttentionTape { spec: self.spec, projected, padding, weights };
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, B::attention_backward(tape, grad));
    }
}

/// Layer norm's forward kernel as a fusion operation: inputs `[x, gamma, beta]`, outputs
/// `[output, normalized, inverse]`.
#[derive(Debug)]
pub(super) struct LayerNormForward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) epsilon: f32,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for LayerNormForward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let [x, gamma, beta] = [0, 1, 2].map(|i| handles.get_float_tensor::<B>(&self.desc.inputs[i]));
        let (output, tape) = B::layer_norm_forward(x, gamma, beta, self.epsilon);
        for (ir, tensor) in self.desc.outputs.iter().zip([output, tape.normalized, tape.inverse]) {
            handles.register_float_tensor::<B>(&ir.id, tensor);
        }
    }
}

/// Layer norm's backward kernel as a fusion operation: inputs `[grad, normalized, inverse,
/// gamma]`, outputs the gradients `[x, gamma, beta]`.
#[derive(Debug)]
pub(super) struct LayerNormBackward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for LayerNormBackward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let [grad, normalized, inverse, gamma] =
            [0, 1, 2, 3].map(|i| handles.get_float_tensor::<B>(&self.desc.inputs[i]));
        let tape = LayerNormTape { normalized, inverse, gamma };
        for (output, gradient) in self.desc.outputs.iter().zip(B::layer_norm_backward(tape, grad)) {
            handles.register_float_tensor::<B>(&output.id, gradient);
        }
    }
}

/// The embedding lookup's forward kernel as a fusion operation: inputs `[tokens, ids, padding]`
/// and, with positions, `[…, positions]`; output the embedded sequence.
#[derive(Debug)]
pub(super) struct LookupForward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for LookupForward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let tokens = handles.get_float_tensor::<B>(&self.desc.inputs[0]);
        let ids = handles.get_int_tensor::<B>(&self.desc.inputs[1]);
        let padding = handles.get_float_tensor::<B>(&self.desc.inputs[2]);
        let positions = self.desc.inputs.get(3).map(|ir| handles.get_float_tensor::<B>(ir));
        let out = B::lookup_forward(tokens, positions, ids, padding);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, out);
    }
}

/// The embedding lookup's backward kernels as a fusion operation: inputs `[grad, ids, padding]`,
/// outputs the token table's gradient and, with positions, the position table's.
#[derive(Debug)]
pub(super) struct LookupBackward<B> {
    pub(super) desc: CustomOpIr,
    pub(super) vocab: usize,
    pub(super) position_rows: Option<usize>,
    pub(super) _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for LookupBackward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let grad = handles.get_float_tensor::<B>(&self.desc.inputs[0]);
        let ids = handles.get_int_tensor::<B>(&self.desc.inputs[1]);
        let padding = handles.get_float_tensor::<B>(&self.desc.inputs[2]);
        let (d_tokens, d_positions) = B::lookup_backward(grad, ids, padding, self.vocab, self.position_rows);
        for (output, tensor) in self.desc.outputs.iter().zip([Some(d_tokens), d_positions].into_iter().flatten()) {
            handles.register_float_tensor::<B>(&output.id, tensor);
        }
    }
}
