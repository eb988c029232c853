//! The embedding lookup with padding positions zeroed (and, for the Transformer, the learned
//! positions added) as one kernel forward and two launches backward, where Burn runs a gather per
//! table, the position ids, an addition and the padding mask's expansion and product forward,
//! and per table a zero fill and a scatter backward, with the mask's product again.
//!
//! Forward, one unit (thread) per output value. Backward, one launch whose units write the output
//! gradient with padding positions zeroed and, for the first row of each position, sum the
//! position table's gradient over the batch (no two units write one place); the token table's
//! gradient, where one token may sit at many positions, is an indexed addition of that masked
//! gradient into zeros, as Burn's `embedding_backward` (two launches).

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::{empty_like, one_unit_each};

#[cube(launch)]
fn lookup_kernel<I: Int>(
    tokens: &Tensor<f32>,
    positions: &Tensor<f32>,
    ids: &Tensor<I>,
    padding: &Tensor<f32>,
    out: &mut Tensor<f32>,
    seq: u32,
    dim: u32,
    #[comptime] with_positions: bool,
    #[define(I)] _id_type: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let (seq, dim) = (seq as usize, dim as usize);
        let (place, column) = (i / dim, i % dim);
        let mut value = 0.0f32;
        if padding[place] < 0.5 {
            value = tokens[u32::cast_from(ids[place]) as usize * dim + column];
            if with_positions {
                value += positions[(place % seq) * dim + column];
            }
        }
        out[i] = value;
    }
}

#[cube(launch)]
fn lookup_backward_kernel(
    grad: &Tensor<f32>,
    padding: &Tensor<f32>,
    masked: &mut Tensor<f32>,
    d_positions: &mut Tensor<f32>,
    batch: u32,
    seq: u32,
    dim: u32,
    #[comptime] with_positions: bool,
) {
    let i = ABSOLUTE_POS;
    let (batch, seq, dim) = (batch as usize, seq as usize, dim as usize);
    if i < masked.len() {
        let mut value = 0.0f32;
        if padding[i / dim] < 0.5 {
            value = grad[i];
        }
        masked[i] = value;
    }
    if with_positions {
        position_gradient(grad, padding, d_positions, i, batch, seq, dim);
    }
}

/// Value `i` of the position table's gradient: position `i / dim` summed over the batch, zero past
/// the sequence.
#[cube]
fn position_gradient(
    grad: &Tensor<f32>,
    padding: &Tensor<f32>,
    d_positions: &mut Tensor<f32>,
    i: usize,
    batch: usize,
    seq: usize,
    dim: usize,
) {
    if i < d_positions.len() {
        let (position, column) = (i / dim, i % dim);
        let mut total = 0.0f32;
        if position < seq {
            for sample in 0..batch {
                let at = sample * seq + position;
                if padding[at] < 0.5 {
                    total += grad[at * dim + column];
                }
            }
        }
        d_positions[i] = total;
    }
}

/// The rows of `tokens` `[vocab, dim]` named by `ids` `[batch, seq]`, plus row `s` of `positions`
/// `[≥ seq, dim]` at position `s` where given, zero where `padding` `[batch, seq]` is 1:
/// `[batch, seq, dim]`.
pub(crate) fn forward<R: CubeRuntime>(
    tokens: CubeTensor<R>,
    positions: Option<CubeTensor<R>>,
    ids: CubeTensor<R>,
    padding: CubeTensor<R>,
) -> CubeTensor<R> {
    let [tokens, ids, padding] = [tokens, ids, padding].map(into_contiguous);
    let [batch, seq] = ids.shape().dims::<2>();
    let dim = tokens.shape().dims::<2>()[1];
    let out = empty_like(&tokens, Shape::new([batch, seq, dim]));
    let (count, cube_dim) = one_unit_each(&tokens, batch * seq * dim);
    let with_positions = positions.is_some();
    // Without positions the kernel reads nothing there.
    let positions = positions.map(into_contiguous).unwrap_or_else(|| tokens.clone());
    let id_type = ids.dtype;
    lookup_kernel::launch::<R>(
        &tokens.client.clone(),
        count,
        cube_dim,
        tokens.into_tensor_arg(),
        positions.into_tensor_arg(),
        ids.into_tensor_arg(),
        padding.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        seq as u32,
        dim as u32,
        with_positions,
        id_type.into(),
    );
    out
}

/// From the output's gradient `grad` `[batch, seq, dim]`: that gradient with padding positions
/// zeroed (what the token table's rows receive) and, where `position_rows` is given, the position
/// table's gradient (that many rows).
pub(crate) fn backward<R: CubeRuntime>(
    grad: CubeTensor<R>,
    padding: CubeTensor<R>,
    position_rows: Option<usize>,
) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    let [grad, padding] = [grad, padding].map(into_contiguous);
    let [batch, seq, dim] = grad.shape().dims::<3>();
    let masked = empty_like(&grad, grad.shape());
    let d_positions = position_rows.map(|rows| empty_like(&grad, Shape::new([rows, dim])));
    let units = (batch * seq).max(position_rows.unwrap_or(0)) * dim;
    let (count, cube_dim) = one_unit_each(&grad, units);
    // Without positions the kernel writes nothing there; a buffer of its own keeps bindings apart.
    let positions_out = d_positions.clone().unwrap_or_else(|| empty_like(&grad, Shape::new([1])));
    lookup_backward_kernel::launch::<R>(
        &grad.client.clone(),
        count,
        cube_dim,
        grad.into_tensor_arg(),
        padding.into_tensor_arg(),
        masked.clone().into_tensor_arg(),
        positions_out.into_tensor_arg(),
        batch as u32,
        seq as u32,
        dim as u32,
        d_positions.is_some(),
    );
    (masked, d_positions)
}
