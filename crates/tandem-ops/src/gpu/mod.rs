//! The GPU kernels behind [`crate::ops`] and [`crate::optimizer`] (CubeCL, compiled for wgpu and
//! CUDA), and the seam that runs them behind a generic `B: Backend`: [`GpuKernels`], implemented
//! by Burn's CubeCL backends and, with Burn's fusion, by fusion over them ([`fusion`]).

mod adamw;
mod attention;
mod concat;
mod embedding;
#[cfg(feature = "fusion")]
mod fusion;
mod lanes;
mod layer_norm;
mod loss;
mod norm;
pub(crate) mod recurrence;
mod rows;
mod windows;

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{Shape, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::client::ComputeClient;
use cubecl::prelude::CubeCount;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::adamw::AdamWScalars;
use crate::cpu::recurrence::Cell;

pub(crate) use attention::{AttentionSpec, AttentionTape};
pub(crate) use layer_norm::LayerNormTape;
pub(crate) use rows::{RowOp, RowTape};

/// What the forward kernel keeps for the backward one, as tensors `T` of the backend.
#[derive(Clone, Debug)]
pub(crate) struct RecurrenceTape<T> {
    pub cell: Cell,
    pub reverse: bool,
    /// The hidden weight `[H, G·H]` the forward pass ran with.
    pub weight: T,
    /// Per sample, step and hidden unit the values the backward pass needs, `[batch, seq, T·H]`
    /// (see [`recurrence::taped`]).
    pub values: T,
    /// The hidden state each step started from, `[batch, seq, H]`.
    pub previous: T,
}

/// A backend with Tandem's GPU kernels: the recurrent time loop as one kernel forward and one
/// backward, GELU, softmax, layer norm, dropout, the cross-entropy loss, the CNN's windows and the
/// embedding lookup as one each way (the lookup two backward), attention's core as one forward and two backward, AdamW over all parameters and the squared norm of all gradients each in one launch
/// per group of tensors ([`groups`]).
pub(crate) trait GpuKernels: Backend {
    /// One AdamW step of many parameters, each `[param, grad, moment 1, moment 2]` (f32, one
    /// shape per parameter, on one device), clipped by `‖g‖²` (one value) → each parameter and
    /// both its moments after it.
    fn adamw(
        scalars: &AdamWScalars,
        tensors: Vec<[FloatTensor<Self>; 4]>,
        squared_norm: FloatTensor<Self>,
    ) -> Vec<[FloatTensor<Self>; 3]>;

    /// `pieces` (f32, on one device, of one shape but along `dim`; at least one) side by side
    /// along `dim`: one launch where the device's bindings take them all, else Burn's `cat`.
    fn concat(pieces: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self>;

    /// The sum of the squares of every element of `tensors` (f32, at least one), one value.
    fn squared_sum(tensors: Vec<FloatTensor<Self>>) -> FloatTensor<Self>;

    /// Whether the kernels run `cell` over `batch` rows of `hidden` units on `device`.
    fn recurrence_supports(cell: Cell, batch: usize, hidden: usize, device: &Self::Device) -> bool;

    /// The hidden states `[batch, seq, H]` of `cell` over `projected` `[batch, seq, G·H]` with
    /// hidden weight `weight` `[H, G·H]` and bias `[G·H]`, and the tape when `record`. The shape
    /// must be one [`Self::recurrence_supports`] accepts.
    fn recurrence_forward(
        cell: Cell,
        projected: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        reverse: bool,
        record: bool,
    ) -> (FloatTensor<Self>, Option<RecurrenceTape<FloatTensor<Self>>>);

    /// The gradients of `projected`, `weight` and `bias` from the gradient of the output.
    fn recurrence_backward(
        tape: RecurrenceTape<FloatTensor<Self>>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// `op` over the last dimension of `x` (f32): the output, and what [`Self::rows_backward`] reads.
    fn rows_forward(op: RowOp, x: FloatTensor<Self>) -> (FloatTensor<Self>, RowTape<FloatTensor<Self>>);

    /// The gradient of the input of the row operation that kept `tape`, from the output's.
    fn rows_backward(tape: RowTape<FloatTensor<Self>>, grad: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The mean cross-entropy `[1]` of `logits` `[rows, classes]` (f32) against `labels`
    /// `[rows]`, and the rows' softmax, which [`Self::cross_entropy_backward`] reads.
    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The gradient of the logits from the forward pass's softmax, the labels and the loss's
    /// gradient `[1]`.
    fn cross_entropy_backward(
        softmax: FloatTensor<Self>,
        labels: IntTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// The first `positions` windows of `width` positions of `x` `[batch, seq, channels]` (f32):
    /// `[batch, positions, width · channels]`, zeros past the end.
    fn windows_forward(x: FloatTensor<Self>, width: usize, positions: usize) -> FloatTensor<Self>;

    /// The gradient of `x` `[batch, seq, channels]` from the windows' gradient.
    fn windows_backward(grad: FloatTensor<Self>, seq: usize, width: usize) -> FloatTensor<Self>;

    /// Whether the attention kernels take `seq` positions on `device`.
    fn attention_supports(seq: usize, device: &Self::Device) -> bool;

    /// Self-attention's context `[batch · seq, heads · d_k]` from the queries, keys and values side
    /// by side, `projected` `[batch · seq, 3 · heads · d_k]` (f32), under `padding` `[batch, seq]`
    /// (1 at padding), and what [`Self::attention_backward`] reads.
    fn attention_forward(
        spec: AttentionSpec,
        projected: FloatTensor<Self>,
        padding: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, AttentionTape<FloatTensor<Self>>);

    /// The gradient of `projected` from the context's.
    fn attention_backward(tape: AttentionTape<FloatTensor<Self>>, grad: FloatTensor<Self>) -> FloatTensor<Self>;

    /// Layer norm of `x` over its last dimension with scale `gamma` and shift `beta` (f32, that
    /// dimension's length), and what [`Self::layer_norm_backward`] reads.
    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, LayerNormTape<FloatTensor<Self>>);

    /// The gradients of the input, γ and β from the output's.
    fn layer_norm_backward(tape: LayerNormTape<FloatTensor<Self>>, grad: FloatTensor<Self>) -> [FloatTensor<Self>; 3];

    /// The rows of `tokens` `[vocab, dim]` (f32) named by `ids` `[batch, seq]`, plus row `s` of
    /// `positions` `[≥ seq, dim]` at position `s` where given, zero where `padding` `[batch, seq]`
    /// is 1: `[batch, seq, dim]`.
    fn lookup_forward(
        tokens: FloatTensor<Self>,
        positions: Option<FloatTensor<Self>>,
        ids: IntTensor<Self>,
        padding: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// From the lookup's output gradient, its ids and padding mask: the token table's gradient of
    /// `vocab` rows and, where `position_rows` is given, the position table's of that many rows.
    fn lookup_backward(
        grad: FloatTensor<Self>,
        ids: IntTensor<Self>,
        padding: FloatTensor<Self>,
        vocab: usize,
        position_rows: Option<usize>,
    ) -> (FloatTensor<Self>, Option<FloatTensor<Self>>);
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> GpuKernels for CubeBackend<R, F, I, BT> {
    fn adamw(
        scalars: &AdamWScalars,
        tensors: Vec<[FloatTensor<Self>; 4]>,
        squared_norm: FloatTensor<Self>,
    ) -> Vec<[FloatTensor<Self>; 3]> {
        adamw::steps(scalars, tensors, squared_norm)
    }

    fn concat(pieces: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        // A piece each, and the output.
        match pieces.len() <= per_launch(1, 1, &pieces[0].client) {
            true => concat::concat(pieces, dim),
            false => Self::float_cat(pieces, dim),
        }
    }

    fn squared_sum(tensors: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        float::<Self, 1>(norm::partial_squares(tensors)).sum().into_primitive().tensor()
    }

    fn recurrence_supports(cell: Cell, batch: usize, hidden: usize, device: &Self::Device) -> bool {
        recurrence::plan::<R>(cell, batch, hidden, device).is_some()
    }

    fn recurrence_forward(
        cell: Cell,
        projected: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        reverse: bool,
        record: bool,
    ) -> (FloatTensor<Self>, Option<RecurrenceTape<FloatTensor<Self>>>) {
        recurrence::forward(cell, projected, weight, bias, reverse, record)
    }

    fn recurrence_backward(
        tape: RecurrenceTape<FloatTensor<Self>>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let weight_t = float::<Self, 2>(tape.weight.clone()).transpose().into_primitive().tensor();
        let (d_projected, d_recurrent, previous) = recurrence::backward(tape, grad, weight_t);
        let d_recurrent = float::<Self, 2>(d_recurrent);
        let width = d_recurrent.dims()[1];
        let d_weight = float::<Self, 2>(previous).transpose().matmul(d_recurrent.clone());
        let d_bias = d_recurrent.sum_dim(0).reshape([width]);
        (d_projected, d_weight.into_primitive().tensor(), d_bias.into_primitive().tensor())
    }

    fn rows_forward(op: RowOp, x: FloatTensor<Self>) -> (FloatTensor<Self>, RowTape<FloatTensor<Self>>) {
        rows::forward(op, x)
    }

    fn rows_backward(tape: RowTape<FloatTensor<Self>>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        rows::backward(tape, grad)
    }

    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        labels: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        loss::forward(logits, labels)
    }

    fn cross_entropy_backward(
        softmax: FloatTensor<Self>,
        labels: IntTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        loss::backward(softmax, labels, grad)
    }

    fn windows_forward(x: FloatTensor<Self>, width: usize, positions: usize) -> FloatTensor<Self> {
        windows::forward(x, width, positions)
    }

    fn windows_backward(grad: FloatTensor<Self>, seq: usize, width: usize) -> FloatTensor<Self> {
        windows::backward(grad, seq, width)
    }

    fn attention_supports(seq: usize, device: &Self::Device) -> bool {
        attention::supports::<R>(seq, device)
    }

    fn attention_forward(
        spec: AttentionSpec,
        projected: FloatTensor<Self>,
        padding: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, AttentionTape<FloatTensor<Self>>) {
        attention::forward(spec, projected, padding)
    }

    fn attention_backward(tape: AttentionTape<FloatTensor<Self>>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        attention::backward(tape, grad)
    }

    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, LayerNormTape<FloatTensor<Self>>) {
        layer_norm::forward(x, gamma, beta, epsilon)
    }

    fn layer_norm_backward(tape: LayerNormTape<FloatTensor<Self>>, grad: FloatTensor<Self>) -> [FloatTensor<Self>; 3] {
        layer_norm::backward(tape, grad)
    }

    fn lookup_forward(
        tokens: FloatTensor<Self>,
        positions: Option<FloatTensor<Self>>,
        ids: IntTensor<Self>,
        padding: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        embedding::forward(tokens, positions, ids, padding)
    }

    fn lookup_backward(
        grad: FloatTensor<Self>,
        ids: IntTensor<Self>,
        padding: FloatTensor<Self>,
        vocab: usize,
        position_rows: Option<usize>,
    ) -> (FloatTensor<Self>, Option<FloatTensor<Self>>) {
        embedding::backward(grad, ids, padding, vocab, position_rows)
    }
}

/// Cubes of 256 units for `units` units, one per item of the work (at least one).
fn one_unit_each<R: CubeRuntime>(like: &CubeTensor<R>, units: usize) -> (CubeCount, CubeDim) {
    let cube_dim = CubeDim::new_1d(256);
    (calculate_cube_count_elemwise(&like.client, units.max(1), cube_dim), cube_dim)
}

/// A contiguous tensor of `shape` with `like`'s client, device and dtype, its values not set.
fn empty_like<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape) -> CubeTensor<R> {
    let bytes = shape.num_elements() * like.dtype.size();
    let handle = like.client.empty(bytes.max(like.dtype.size()));
    CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), shape, handle, like.dtype)
}

/// Tensors a kernel over a list of tensors takes in one launch, at most: the kernel's body is
/// compiled once for each of them.
const GROUP: usize = 48;

/// How many items one launch of a kernel over a list takes on `client`'s device: at most
/// [`GROUP`], within the bindings a kernel may have there — `per_item` buffers for each item,
/// `shared` for the launch, one for shapes and strides.
fn per_launch<R: CubeRuntime>(per_item: usize, shared: usize, client: &ComputeClient<R>) -> usize {
    let bindings = client.properties().hardware.max_bindings as usize;
    (bindings.saturating_sub(shared + 1) / per_item).clamp(1, GROUP)
}

/// `items` in launches of [`per_launch`] items.
fn groups<T, R: CubeRuntime>(items: Vec<T>, per_item: usize, shared: usize, client: &ComputeClient<R>) -> Vec<Vec<T>> {
    groups_within(items, per_launch(per_item, shared, client))
}

/// `items` in order, in groups of `size` (the last one shorter).
fn groups_within<T>(items: Vec<T>, size: usize) -> Vec<Vec<T>> {
    let mut groups: Vec<Vec<T>> = Vec::new();
    for item in items {
        match groups.last_mut() {
            Some(group) if group.len() < size => group.push(item),
            _ => groups.push(vec![item]),
        }
    }
    groups
}

/// A float primitive as a tensor of `D` dimensions.
fn float<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    debug_assert_eq!(primitive.shape().num_dims(), D);
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

#[cfg(test)]
mod tests {
    use super::groups_within;

    #[test]
    fn groups_keep_the_order_and_fill_all_but_the_last() {
        assert_eq!(groups_within((0..5).collect(), 2), vec![vec![0, 1], vec![2, 3], vec![4]]);
        assert_eq!(groups_within((0..3).collect(), 48), vec![vec![0, 1, 2]]);
        assert_eq!(groups_within(Vec::<u8>::new(), 1), Vec::<Vec<u8>>::new());
    }
}
