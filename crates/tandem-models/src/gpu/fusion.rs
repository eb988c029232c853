//! The recurrence kernels under Burn's fusion: each kernel call joins the fusion stream as one
//! custom operation, which runs the inner CubeCL backend's kernels on its tensors when the stream
//! executes. Fusion never fuses across it; the element-wise work around it still fuses.

use std::marker::PhantomData;

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::{recurrence::taped, rows::rows_of, GpuKernels, RecurrenceTape, RowOp, RowTape};
use crate::adamw::AdamWScalars;
use crate::kernels::recurrence::Cell;

type Handles<B> = HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// The forward kernel as a fusion operation: inputs `[projected, weight, bias]`, outputs
/// `[hidden states]`, with the tape `[…, values, previous]` when recording.
#[derive(Debug)]
struct Forward<B> {
    desc: CustomOpIr,
    cell: Cell,
    reverse: bool,
    _backend: PhantomData<B>,
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
struct Backward<B> {
    desc: CustomOpIr,
    cell: Cell,
    reverse: bool,
    _backend: PhantomData<B>,
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
struct AdamW<B> {
    desc: CustomOpIr,
    scalars: AdamWScalars,
    _backend: PhantomData<B>,
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
struct Concat<B> {
    desc: CustomOpIr,
    dim: usize,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for Concat<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let pieces = self.desc.inputs.iter().map(|input| handles.get_float_tensor::<B>(input)).collect();
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, B::concat(pieces, self.dim));
    }
}

/// The squared sum of many tensors as a fusion operation: inputs the tensors, output `[1]`.
#[derive(Debug)]
struct SquaredSum<B> {
    desc: CustomOpIr,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for SquaredSum<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let inputs = self.desc.inputs.iter().map(|input| handles.get_float_tensor::<B>(input)).collect();
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, B::squared_sum(inputs));
    }
}

/// A row operation's forward kernel as a fusion operation: input `[x]`, outputs `[output]` and,
/// for layer norm, `[…, 1 / √(var + ε)]`.
#[derive(Debug)]
struct RowsForward<B> {
    desc: CustomOpIr,
    op: RowOp,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + GpuKernels> Operation<B::FusionRuntime> for RowsForward<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let x = handles.get_float_tensor::<B>(&self.desc.inputs[0]);
        let (output, tape) = B::rows_forward(self.op, x);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, output);
        if let RowTape::Normalize { inverse, .. } = tape {
            handles.register_float_tensor::<B>(&self.desc.outputs[1].id, inverse);
        }
    }
}

/// A row operation's backward kernel as a fusion operation: inputs `[grad]` and the tape's
/// tensors, output the input's gradient.
#[derive(Debug)]
struct RowsBackward<B> {
    desc: CustomOpIr,
    tape: RowTape<TensorIr>,
    _backend: PhantomData<B>,
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
struct CrossEntropyForward<B> {
    desc: CustomOpIr,
    _backend: PhantomData<B>,
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
struct CrossEntropyBackward<B> {
    desc: CustomOpIr,
    _backend: PhantomData<B>,
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
struct Windows<B> {
    desc: CustomOpIr,
    /// `(width, positions)` forward; `(width, seq)` backward.
    width: usize,
    length: usize,
    forward: bool,
    _backend: PhantomData<B>,
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

impl<B: FusionBackend + GpuKernels> GpuKernels for Fusion<B> {
    fn concat(pieces: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        let client = pieces[0].client.clone();
        let shapes: Vec<Shape> = pieces.iter().map(|p| p.shape()).collect();
        let shape = Shape::cat(&shapes, dim).expect("the pieces match but along `dim`");
        let output = TensorIr::uninit(client.create_empty_handle(), shape, pieces[0].dtype);
        let streams = OperationStreams::with_inputs(&pieces);
        let inputs: Vec<TensorIr> = pieces.into_iter().map(|t| t.into_ir()).collect();
        let desc = CustomOpIr::new("tandem_concat", &inputs, &[output]);
        let operation = Concat::<B> { desc: desc.clone(), dim, _backend: PhantomData };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
        outputs.next().expect("the concatenation's output")
    }

    fn squared_sum(tensors: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        let client = tensors[0].client.clone();
        let output = TensorIr::uninit(client.create_empty_handle(), Shape::new([1]), tensors[0].dtype);
        let streams = OperationStreams::with_inputs(&tensors);
        let inputs: Vec<TensorIr> = tensors.into_iter().map(|t| t.into_ir()).collect();
        let desc = CustomOpIr::new("tandem_squared_sum", &inputs, &[output]);
        let operation = SquaredSum::<B> { desc: desc.clone(), _backend: PhantomData };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
        outputs.next().expect("the squared sum's output")
    }

    fn adamw(
        scalars: &AdamWScalars,
        tensors: Vec<[FloatTensor<Self>; 4]>,
        squared_norm: FloatTensor<Self>,
    ) -> Vec<[FloatTensor<Self>; 3]> {
        let client = squared_norm.client.clone();
        let outputs: Vec<TensorIr> = tensors
            .iter()
            .flat_map(|[param, ..]| {
                [0; 3].map(|_| TensorIr::uninit(client.create_empty_handle(), param.shape(), param.dtype))
            })
            .collect();
        let inputs: Vec<FloatTensor<Self>> = tensors.into_iter().flatten().chain([squared_norm]).collect();
        let streams = OperationStreams::with_inputs(&inputs);
        let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
        let desc = CustomOpIr::new("tandem_adamw", &inputs, &outputs);
        let operation = AdamW::<B> { desc: desc.clone(), scalars: *scalars, _backend: PhantomData };
        let mut results = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
        let mut three = || results.next().expect("three outputs a parameter");
        outputs.chunks_exact(3).map(|_| [three(), three(), three()]).collect()
    }

    fn recurrence_supports(cell: Cell, batch: usize, hidden: usize, device: &Self::Device) -> bool {
        B::recurrence_supports(cell, batch, hidden, device)
    }

    fn recurrence_forward(
        cell: Cell,
        projected: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        reverse: bool,
        record: bool,
    ) -> (FloatTensor<Self>, Option<RecurrenceTape<FloatTensor<Self>>>) {
        let client = projected.client.clone();
        let [batch, seq, _] = projected.shape().dims::<3>();
        let hidden = weight.shape().dims::<2>()[0];
        let dtype = projected.dtype;
        let out = |shape: Shape| TensorIr::uninit(client.create_empty_handle(), shape, dtype);
        let mut outputs = vec![out(Shape::new([batch, seq, hidden]))];
        if record {
            outputs.push(out(Shape::new([batch, seq, taped(cell == Cell::Lstm) * hidden])));
            outputs.push(out(Shape::new([batch, seq, hidden])));
        }
        let streams = OperationStreams::with_inputs([&projected, &weight, &bias]);
        let kept_weight = record.then(|| weight.clone());
        let desc = CustomOpIr::new(
            "tandem_recurrence_forward",
            &[projected.into_ir(), weight.into_ir(), bias.into_ir()],
            &outputs,
        );
        let operation = Forward::<B> { desc: desc.clone(), cell, reverse, _backend: PhantomData };
        let mut tensors = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
        let hidden_states = tensors.next().expect("the forward operation's first output");
        let tape = kept_weight.map(|weight| RecurrenceTape {
            cell,
            reverse,
            weight,
            values: tensors.next().expect("the tape's values"),
            previous: tensors.next().expect("the tape's starting states"),
        });
        (hidden_states, tape)
    }

    fn recurrence_backward(
        tape: RecurrenceTape<FloatTensor<Self>>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let client = grad.client.clone();
        let [batch, seq, hidden] = grad.shape().dims::<3>();
        let width = tape.cell.gates() * hidden;
        let dtype: DType = grad.dtype;
        let out = |shape: Shape| TensorIr::uninit(client.create_empty_handle(), shape, dtype);
        let outputs =
            [out(Shape::new([batch, seq, width])), out(Shape::new([hidden, width])), out(Shape::new([width]))];
        let streams = OperationStreams::with_inputs([&grad, &tape.weight, &tape.values, &tape.previous]);
        let inputs = [grad.into_ir(), tape.weight.into_ir(), tape.values.into_ir(), tape.previous.into_ir()];
        let desc = CustomOpIr::new("tandem_recurrence_backward", &inputs, &outputs);
        let operation =
            Backward::<B> { desc: desc.clone(), cell: tape.cell, reverse: tape.reverse, _backend: PhantomData };
        let [projected, weight, bias]: [FloatTensor<Self>; 3] = client
            .register(streams, OperationIr::Custom(desc), operation)
            .try_into()
            .expect("the backward operation's three outputs");
        (projected, weight, bias)
    }

    fn rows_forward(op: RowOp, x: FloatTensor<Self>) -> (FloatTensor<Self>, RowTape<FloatTensor<Self>>) {
        let client = x.client.clone();
        let shape = x.shape();
        let (rows, _) = rows_of(&shape);
        let out = |shape: Shape| TensorIr::uninit(client.create_empty_handle(), shape, x.dtype);
        let mut outputs = vec![out(shape.clone())];
        if let RowOp::Normalize { .. } = op {
            outputs.push(out(Shape::new([rows])));
        }
        let streams = OperationStreams::with_inputs([&x]);
        let input = x.clone();
        let desc = CustomOpIr::new("tandem_rows_forward", &[x.into_ir()], &outputs);
        let operation = RowsForward::<B> { desc: desc.clone(), op, _backend: PhantomData };
        let mut tensors = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
        let output = tensors.next().expect("the row operation's output");
        let tape = match op {
            RowOp::Gelu => RowTape::Gelu { input },
            RowOp::Softmax => RowTape::Softmax { output: output.clone() },
            RowOp::Normalize { .. } => {
                RowTape::Normalize { output: output.clone(), inverse: tensors.next().expect("layer norm's inverse") }
            }
        };
        (output, tape)
    }

    fn rows_backward(tape: RowTape<FloatTensor<Self>>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        let client = grad.client.clone();
        let output = TensorIr::uninit(client.create_empty_handle(), grad.shape(), grad.dtype);
        let streams = OperationStreams::with_inputs([&grad].into_iter().chain(tape.tensors()));
        let tape = tape.map(|t| t.into_ir());
        let inputs: Vec<TensorIr> = [grad.into_ir()].into_iter().chain(tape.tensors().into_iter().cloned()).collect();
        let desc = CustomOpIr::new("tandem_rows_backward", &inputs, &[output]);
        let operation = RowsBackward::<B> { desc: desc.clone(), tape, _backend: PhantomData };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
        outputs.next().expect("the row operation's gradient")
    }

    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let client = logits.client.clone();
        let out = |shape: Shape| TensorIr::uninit(client.create_empty_handle(), shape, logits.dtype);
        let outputs = [out(Shape::new([1])), out(logits.shape())];
        let streams = OperationStreams::with_inputs([&logits, &labels]);
        let desc = CustomOpIr::new("tandem_cross_entropy_forward", &[logits.into_ir(), labels.into_ir()], &outputs);
        let operation = CrossEntropyForward::<B> { desc: desc.clone(), _backend: PhantomData };
        let [loss, softmax]: [FloatTensor<Self>; 2] = client
            .register(streams, OperationIr::Custom(desc), operation)
            .try_into()
            .expect("the loss and the softmax");
        (loss, softmax)
    }

    fn cross_entropy_backward(
        softmax: FloatTensor<Self>,
        labels: IntTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let client = softmax.client.clone();
        let output = TensorIr::uninit(client.create_empty_handle(), softmax.shape(), softmax.dtype);
        let streams = OperationStreams::with_inputs([&softmax, &labels, &grad]);
        let inputs = [softmax.into_ir(), labels.into_ir(), grad.into_ir()];
        let desc = CustomOpIr::new("tandem_cross_entropy_backward", &inputs, &[output]);
        let operation = CrossEntropyBackward::<B> { desc: desc.clone(), _backend: PhantomData };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
        outputs.next().expect("the logits' gradient")
    }

    fn windows_forward(x: FloatTensor<Self>, width: usize, positions: usize) -> FloatTensor<Self> {
        let [batch, _, channels] = x.shape().dims::<3>();
        windows::<B>(x, Shape::new([batch, positions, width * channels]), width, positions, true)
    }

    fn windows_backward(grad: FloatTensor<Self>, seq: usize, width: usize) -> FloatTensor<Self> {
        let [batch, _, row] = grad.shape().dims::<3>();
        windows::<B>(grad, Shape::new([batch, seq, row / width]), width, seq, false)
    }
}

/// Registers a [`Windows`] operation on `input`, its output of `shape`.
fn windows<B: FusionBackend + GpuKernels>(
    input: FloatTensor<Fusion<B>>,
    shape: Shape,
    width: usize,
    length: usize,
    forward: bool,
) -> FloatTensor<Fusion<B>> {
    let client = input.client.clone();
    let output = TensorIr::uninit(client.create_empty_handle(), shape, input.dtype);
    let streams = OperationStreams::with_inputs([&input]);
    let desc = CustomOpIr::new("tandem_windows", &[input.into_ir()], &[output]);
    let operation = Windows::<B> { desc: desc.clone(), width, length, forward, _backend: PhantomData };
    let mut outputs = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
    outputs.next().expect("the windows' output")
}
