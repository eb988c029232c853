//! Tandem's kernels under Burn's fusion: each kernel call joins the fusion stream as one custom
//! operation ([`operations`]), which runs the inner CubeCL backend's kernels on its tensors when
//! the stream executes. Fusion never fuses across it; the element-wise work around it still fuses.

mod operations;

use std::marker::PhantomData;

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_fusion::stream::OperationStreams;
use burn_fusion::{Fusion, FusionBackend};
use burn_ir::{CustomOpIr, OperationIr, TensorIr};

use super::{
    recurrence::taped, AttentionSpec, AttentionTape, GpuKernels, LayerNormTape, RecurrenceTape, RowOp, RowTape,
};
use crate::adamw::AdamWScalars;
use crate::cpu::recurrence::Cell;
use operations::{
    AdamW, AttentionBackward, AttentionForward, Backward, Concat, CrossEntropyBackward, CrossEntropyForward, Forward,
    LayerNormBackward, LayerNormForward, LookupBackward, LookupForward, RowsBackward, RowsForward, SquaredSum, Windows,
};

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
        let output = TensorIr::uninit(client.create_empty_handle(), x.shape(), x.dtype);
        let streams = OperationStreams::with_inputs([&x]);
        let input = x.clone();
        let desc = CustomOpIr::new("tandem_rows_forward", &[x.into_ir()], &[output]);
        let operation = RowsForward::<B> { desc: desc.clone(), op, _backend: PhantomData };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
        let output = outputs.next().expect("the row operation's output");
        let tape = match op {
            RowOp::Gelu => RowTape::Gelu { input },
            RowOp::Softmax => RowTape::Softmax { output: output.clone() },
            RowOp::Dropout(draw) => RowTape::Dropout(draw),
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

    fn attention_supports(seq: usize, device: &Self::Device) -> bool {
        B::attention_supports(seq, device)
    }

    fn attention_forward(
        spec: AttentionSpec,
        projected: FloatTensor<Self>,
        padding: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, AttentionTape<FloatTensor<Self>>) {
        let client = projected.client.clone();
        let [batch, seq] = padding.shape().dims::<2>();
        let out = |shape: Shape| TensorIr::uninit(client.create_empty_handle(), shape, projected.dtype);
        let width = projected.shape().dims::<2>()[1] / 3;
        let outputs = [out(Shape::new([batch * seq, width])), out(Shape::new([batch, spec.heads, seq, seq]))];
        let streams = OperationStreams::with_inputs([&projected, &padding]);
        let inputs = [&projected, &padding].map(|t| t.clone().into_ir());
        let desc = CustomOpIr::new("tandem_attention_forward", &inputs, &outputs);
        let operation = AttentionForward::<B> { desc: desc.clone(), spec, _backend: PhantomData };
        let [context, weights]: [FloatTensor<Self>; 2] = client
            .register(streams, OperationIr::Custom(desc), operation)
            .try_into()
            .expect("the context and the weights");
        (context, AttentionTape { spec, projected, padding, weights })
    }

    fn attention_backward(tape: AttentionTape<FloatTensor<Self>>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        let AttentionTape { spec, projected, padding, weights } = tape;
        let client = grad.client.clone();
        let output = TensorIr::uninit(client.create_empty_handle(), projected.shape(), projected.dtype);
        let tensors = [grad, projected, padding, weights];
        let streams = OperationStreams::with_inputs(&tensors);
        let inputs = tensors.map(|t| t.into_ir());
        let desc = CustomOpIr::new("tandem_attention_backward", &inputs, &[output]);
        let operation = AttentionBackward::<B> { desc: desc.clone(), spec, _backend: PhantomData };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
        outputs.next().expect("the projections' gradient")
    }

    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, LayerNormTape<FloatTensor<Self>>) {
        let client = x.client.clone();
        let rows = x.shape().num_elements() / gamma.shape().num_elements().max(1);
        let out = |shape: Shape| TensorIr::uninit(client.create_empty_handle(), shape, x.dtype);
        let outputs = [out(x.shape()), out(x.shape()), out(Shape::new([rows]))];
        let streams = OperationStreams::with_inputs([&x, &gamma, &beta]);
        let inputs = [x, gamma.clone(), beta].map(|t| t.into_ir());
        let desc = CustomOpIr::new("tandem_layer_norm_forward", &inputs, &outputs);
        let operation = LayerNormForward::<B> { desc: desc.clone(), epsilon, _backend: PhantomData };
        let [output, normalized, inverse]: [FloatTensor<Self>; 3] = client
            .register(streams, OperationIr::Custom(desc), operation)
            .try_into()
            .expect("the output, the normalized input and the inverse deviations");
        (output, LayerNormTape { normalized, inverse, gamma })
    }

    fn layer_norm_backward(tape: LayerNormTape<FloatTensor<Self>>, grad: FloatTensor<Self>) -> [FloatTensor<Self>; 3] {
        let LayerNormTape { normalized, inverse, gamma } = tape;
        let client = grad.client.clone();
        let out = |shape: Shape| TensorIr::uninit(client.create_empty_handle(), shape, grad.dtype);
        let outputs = [out(grad.shape()), out(gamma.shape()), out(gamma.shape())];
        let tensors = [grad, normalized, inverse, gamma];
        let streams = OperationStreams::with_inputs(&tensors);
        let inputs = tensors.map(|t| t.into_ir());
        let desc = CustomOpIr::new("tandem_layer_norm_backward", &inputs, &outputs);
        let operation = LayerNormBackward::<B> { desc: desc.clone(), _backend: PhantomData };
        client
            .register(streams, OperationIr::Custom(desc), operation)
            .try_into()
            .expect("the input's, γ's and β's gradients")
    }
    fn lookup_forward(
        tokens: FloatTensor<Self>,
        positions: Option<FloatTensor<Self>>,
        ids: IntTensor<Self>,
        padding: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let client = tokens.client.clone();
        let [batch, seq] = ids.shape().dims::<2>();
        let dim = tokens.shape().dims::<2>()[1];
        let output = TensorIr::uninit(client.create_empty_handle(), Shape::new([batch, seq, dim]), tokens.dtype);
        let tensors: Vec<_> = [tokens, ids, padding].into_iter().chain(positions).collect();
        let streams = OperationStreams::with_inputs(&tensors);
        let inputs: Vec<TensorIr> = tensors.into_iter().map(|t| t.into_ir()).collect();
        let desc = CustomOpIr::new("tandem_lookup_forward", &inputs, &[output]);
        let operation = LookupForward::<B> { desc: desc.clone(), _backend: PhantomData };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
        outputs.next().expect("the embedded sequence")
    }

    fn lookup_backward(
        grad: FloatTensor<Self>,
        ids: IntTensor<Self>,
        padding: FloatTensor<Self>,
        vocab: usize,
        position_rows: Option<usize>,
    ) -> (FloatTensor<Self>, Option<FloatTensor<Self>>) {
        let client = grad.client.clone();
        let dim = grad.shape().dims::<3>()[2];
        let out = |shape: Shape| TensorIr::uninit(client.create_empty_handle(), shape, grad.dtype);
        let outputs: Vec<TensorIr> =
            [Some(Shape::new([vocab, dim])), position_rows.map(|rows| Shape::new([rows, dim]))]
                .into_iter()
                .flatten()
                .map(out)
                .collect();
        let streams = OperationStreams::with_inputs([&grad, &ids, &padding]);
        let inputs = [grad.into_ir(), ids.into_ir(), padding.into_ir()];
        let desc = CustomOpIr::new("tandem_lookup_backward", &inputs, &outputs);
        let operation = LookupBackward::<B> { desc: desc.clone(), vocab, position_rows, _backend: PhantomData };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), operation).into_iter();
        (outputs.next().expect("the token table's gradient"), outputs.next())
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
