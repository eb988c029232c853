//! The GPU kernels behind [`crate::ops`] and [`crate::optimizer`] (CubeCL, compiled for wgpu and
//! CUDA), and the seam that runs them behind a generic `B: Backend`: [`GpuKernels`], implemented
//! by Burn's CubeCL backends and, with Burn's fusion, by fusion over them ([`fusion`]).

mod adamw;
#[cfg(feature = "fusion")]
mod fusion;
mod norm;
pub(crate) mod recurrence;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use crate::adamw::AdamWScalars;
use crate::kernels::recurrence::Cell;

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
/// backward, AdamW as one kernel per parameter, and the squared norm of the gradients in one
/// launch per gradient.
pub(crate) trait GpuKernels: Backend {
    /// One AdamW step: `[param, grad, moment 1, moment 2, ‖g‖²]` (f32; one shape, `‖g‖²` one
    /// value, for clipping) → the parameter and both moments after it.
    fn adamw(scalars: &AdamWScalars, tensors: [FloatTensor<Self>; 5]) -> [FloatTensor<Self>; 3];

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
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> GpuKernels for CubeBackend<R, F, I, BT> {
    fn adamw(scalars: &AdamWScalars, tensors: [FloatTensor<Self>; 5]) -> [FloatTensor<Self>; 3] {
        adamw::step(scalars, tensors)
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
}

/// A float primitive as a tensor of `D` dimensions.
fn float<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    debug_assert_eq!(primitive.shape().num_dims(), D);
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}
