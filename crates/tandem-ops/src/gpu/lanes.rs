//! Rows worked by [`LANES`] units ("lanes") each, [`ROWS_PER_CUBE`] rows to a cube: a row's
//! lanes read neighbouring values together (one coalesced line a step) and combine their partial
//! results as a tree in shared memory, where one unit per row would walk the row alone, its
//! neighbours a row apart. Layer norm and softmax use them.

use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

/// Units that share a row: a plane's (warp's) width on NVIDIA hardware.
pub(crate) const LANES: u32 = 32;
/// Rows a cube takes.
pub(crate) const ROWS_PER_CUBE: u32 = 8;
/// Units of a cube, the values of its shared memory for one reduction.
pub(crate) const CUBE_UNITS: u32 = LANES * ROWS_PER_CUBE;

/// Cubes of `per_cube` (at most [`ROWS_PER_CUBE`]) rows of [`LANES`] lanes for `rows` rows,
/// followed by `extra` more cubes of the same units.
pub(crate) fn row_cubes<R: CubeRuntime>(
    like: &CubeTensor<R>,
    rows: usize,
    per_cube: u32,
    extra: usize,
) -> (CubeCount, CubeDim) {
    debug_assert!((1..=ROWS_PER_CUBE).contains(&per_cube));
    let cube_dim = CubeDim::new_2d(LANES, per_cube);
    let cubes = rows.div_ceil(per_cube as usize) + extra;
    (calculate_cube_count_elemwise(&like.client, cubes.max(1) * cube_dim.num_elems() as usize, cube_dim), cube_dim)
}

/// Dependent shared-memory reads of one [`tree`] over `count` units: a level each, and the total.
pub(crate) fn tree_reads(count: usize) -> usize {
    count.max(1).ilog2() as usize + 1
}

/// The row of this unit, and its lane.
#[cube]
pub(crate) fn row_and_lane() -> (usize, usize) {
    (CUBE_POS * CUBE_DIM_Y as usize + UNIT_POS_Y as usize, UNIT_POS_X as usize)
}

/// This unit's row of `rows` rows of `width` values: the row, its lane, where the row starts, and
/// how many of its values the lanes work on (none past the last row, which still takes part in
/// the cube's sums with nothing to add).
#[cube]
pub(crate) fn row_span(rows: u32, width: u32) -> (usize, usize, usize, usize) {
    let (row, lane) = row_and_lane();
    (row, lane, row * width as usize, select(row < rows as usize, width as usize, 0usize))
}

/// The sum (or, with `max`, the largest) of `value` over `count` (a power of two) units of the
/// cube whose places in `shared` start at `base`, this unit's place being `base + lane`: every
/// one of them gets it. Every unit of the cube calls it, as it waits for the cube.
#[cube]
pub(crate) fn tree(
    shared: &mut SharedMemory<f32>,
    base: usize,
    lane: usize,
    count: usize,
    value: f32,
    #[comptime] max: bool,
) -> f32 {
    shared[base + lane] = value;
    sync_cube();
    let mut stride = count / 2;
    while stride > 0 {
        if lane < stride {
            let other = shared[base + lane + stride];
            if max {
                shared[base + lane] = f32::max(shared[base + lane], other);
            } else {
                shared[base + lane] += other;
            }
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[base];
    // No unit overwrites the result before every one has read it.
    sync_cube();
    total
}

/// The sum of `value` over the lanes of this unit's row, in every lane.
#[cube]
pub(crate) fn row_sum(shared: &mut SharedMemory<f32>, value: f32) -> f32 {
    let lanes = LANES as usize;
    tree(shared, UNIT_POS_Y as usize * lanes, UNIT_POS_X as usize, lanes, value, false)
}

/// The largest `value` over the lanes of this unit's row, in every lane.
#[cube]
pub(crate) fn row_max(shared: &mut SharedMemory<f32>, value: f32) -> f32 {
    let lanes = LANES as usize;
    tree(shared, UNIT_POS_Y as usize * lanes, UNIT_POS_X as usize, lanes, value, true)
}
