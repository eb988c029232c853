//! The embedding lookup with padding positions zeroed (and, for the Transformer, the learned
//! positions added) as one kernel forward and two backward, where Burn runs a gather per table,
//! the position ids, an addition and the padding mask's expansion and product forward, and per
//! table a zero fill and a scatter backward, with the mask's product again.
//!
//! Forward, one unit (thread) per output value. Backward, the token table's gradient is a
//! deterministic segment sum, parallel over the table: the first launch sorts the positions by
//! token (padding last) by computing each position's rank, the number of positions whose
//! (token, position) comes before its own, with the keys staged a cube's worth at a time in
//! shared memory; the second gives a unit to each value of the token table's gradient, which
//! finds its token's run of sorted positions by binary search and sums their gradients in position
//! order (zero where the token is absent), and, where there is a position table, a unit to each
//! value of its gradient, summed over the batch. No unit writes another's value and no sum
//! depends on scheduling.

use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::{empty_like, one_unit_each};
use crate::ledger::{note, Work};

/// Units of a cube of the sorting kernel: the keys it stages in shared memory at a time.
const TILE: u32 = 256;

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

/// The sort key of position `place`: its token, or `vocab` (after every token) at padding.
#[cube]
fn sort_key<I: Int>(ids: &Tensor<I>, padding: &Tensor<f32>, place: usize, vocab: u32) -> u32 {
    let mut key = vocab;
    if padding[place] < 0.5 {
        key = u32::cast_from(ids[place]);
    }
    key
}

/// One unit per position: its rank among all positions by (key, position), where it writes the
/// position (`order`) and its key (`keys`). Every unit of a cube takes part in each tile's load.
#[cube(launch)]
fn sort_kernel<I: Int>(
    ids: &Tensor<I>,
    padding: &Tensor<f32>,
    order: &mut Tensor<u32>,
    keys: &mut Tensor<u32>,
    places: u32,
    vocab: u32,
    #[define(I)] _id_type: StorageType,
) {
    let place = ABSOLUTE_POS;
    let places = places as usize;
    let unit = UNIT_POS_X as usize;
    let mut staged = SharedMemory::<u32>::new(TILE as usize);
    // Past the last position a unit neither writes nor is compared with: any key will do.
    let mut mine = vocab;
    if place < places {
        mine = sort_key(ids, padding, place, vocab);
    }
    let mut rank = 0usize;
    let mut start = 0usize;
    while start < places {
        let other = start + unit;
        let mut key = vocab;
        if other < places {
            key = sort_key(ids, padding, other, vocab);
        }
        staged[unit] = key;
        sync_cube();
        let mut end = places - start;
        if end > TILE as usize {
            end = TILE as usize;
        }
        for t in 0..end {
            let theirs = staged[t];
            if theirs < mine || (theirs == mine && start + t < place) {
                rank += 1;
            }
        }
        sync_cube();
        start += TILE as usize;
    }
    if place < places {
        order[rank] = u32::cast_from(place);
        keys[rank] = mine;
    }
}

#[cube(launch)]
fn lookup_backward_kernel(
    grad: &Tensor<f32>,
    padding: &Tensor<f32>,
    order: &Tensor<u32>,
    keys: &Tensor<u32>,
    d_tokens: &mut Tensor<f32>,
    d_positions: &mut Tensor<f32>,
    batch: u32,
    seq: u32,
    dim: u32,
    #[comptime] with_positions: bool,
) {
    let i = ABSOLUTE_POS;
    let (batch, seq, dim) = (batch as usize, seq as usize, dim as usize);
    if i < d_tokens.len() {
        token_gradient(grad, order, keys, d_tokens, i, batch * seq, dim);
    }
    if with_positions {
        position_gradient(grad, padding, d_positions, i, batch, seq, dim);
    }
}

/// Value `i` of the token table's gradient: the gradients of the positions holding token
/// `i / dim`, in position order, found in the sorted `keys` by binary search.
#[cube]
fn token_gradient(
    grad: &Tensor<f32>,
    order: &Tensor<u32>,
    keys: &Tensor<u32>,
    d_tokens: &mut Tensor<f32>,
    i: usize,
    places: usize,
    dim: usize,
) {
    let (token, column) = (u32::cast_from(i / dim), i % dim);
    // The first sorted place whose key is not below `token`.
    let mut low = 0usize;
    let mut high = places;
    while low < high {
        let middle = (low + high) / 2;
        if keys[middle] < token {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    let mut total = 0.0f32;
    while low < places && keys[low] == token {
        total += grad[order[low] as usize * dim + column];
        low += 1;
    }
    d_tokens[i] = total;
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
    // The id, then the token's row: two reads one after the other.
    let tables = if with_positions { 2 } else { 1 };
    note(|| Work::of("embedding::lookup_kernel", &count, cube_dim).moves((1 + tables) * batch * seq * dim).waits(2, 0));
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

/// From the output's gradient `grad` `[batch, seq, dim]`, the ids `[batch, seq]` and the padding
/// mask: the token table's gradient (`vocab` rows) and, where `position_rows` is given, the
/// position table's gradient (that many rows).
pub(crate) fn backward<R: CubeRuntime>(
    grad: CubeTensor<R>,
    ids: CubeTensor<R>,
    padding: CubeTensor<R>,
    vocab: usize,
    position_rows: Option<usize>,
) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    let [grad, ids, padding] = [grad, ids, padding].map(into_contiguous);
    let [batch, seq, dim] = grad.shape().dims::<3>();
    let places = batch * seq;
    let (order, keys) = sorted_places(&ids, &padding, places, vocab);
    let d_tokens = empty_like(&grad, Shape::new([vocab, dim]));
    let d_positions = position_rows.map(|rows| empty_like(&grad, Shape::new([rows, dim])));
    let units = vocab.max(position_rows.unwrap_or(0)) * dim;
    let (count, cube_dim) = one_unit_each(&grad, units);
    note(|| {
        // Each value written once, each gradient read once; a token's binary search and its
        // position's walk down the batch. A token's run adds two reads per position that holds
        // it: the ids are on the device, so the longest run is not known here (see the docs).
        let work = Work::of("embedding::lookup_backward_kernel", &count, cube_dim).moves(units + places * dim);
        let search = places.max(1).ilog2() as usize + 2;
        work.computes(places * dim).waits(search + if position_rows.is_some() { batch } else { 0 }, 0)
    });
    // Without positions the kernel writes nothing there; a buffer of its own keeps bindings apart.
    let positions_out = d_positions.clone().unwrap_or_else(|| empty_like(&grad, Shape::new([1])));
    lookup_backward_kernel::launch::<R>(
        &grad.client.clone(),
        count,
        cube_dim,
        grad.into_tensor_arg(),
        padding.into_tensor_arg(),
        order.into_tensor_arg(),
        keys.into_tensor_arg(),
        d_tokens.clone().into_tensor_arg(),
        positions_out.into_tensor_arg(),
        batch as u32,
        seq as u32,
        dim as u32,
        d_positions.is_some(),
    );
    (d_tokens, d_positions)
}

/// The `places` positions sorted by token, padding last, ties in position order: which position
/// each sorted place holds, and its key (the token, or `vocab` at padding), both u32.
fn sorted_places<R: CubeRuntime>(
    ids: &CubeTensor<R>,
    padding: &CubeTensor<R>,
    places: usize,
    vocab: usize,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let u32s = || {
        let handle = ids.client.empty(places.max(1) * DType::U32.size());
        CubeTensor::new_contiguous(ids.client.clone(), ids.device.clone(), Shape::new([places]), handle, DType::U32)
    };
    let (order, keys) = (u32s(), u32s());
    let cubes = places.div_ceil(TILE as usize).max(1) as u32;
    let (count, dim) = (CubeCount::Static(cubes, 1, 1), CubeDim::new_1d(TILE));
    // A tile of keys read at a time, then compared one by one from shared memory.
    let tiles = places.div_ceil(TILE as usize);
    note(|| Work::of("embedding::sort_kernel", &count, dim).moves(4 * places).waits(tiles, places));
    sort_kernel::launch::<R>(
        &ids.client.clone(),
        count,
        dim,
        ids.clone().into_tensor_arg(),
        padding.clone().into_tensor_arg(),
        order.clone().into_tensor_arg(),
        keys.clone().into_tensor_arg(),
        places as u32,
        vocab as u32,
        ids.dtype.into(),
    );
    (order, keys)
}
