//! The sum of the squares of many tensors — global-norm clipping's `‖g‖²` over every gradient —
//! in one launch per group of tensors and one final sum: each cube row of a launch reads one
//! tensor of the group, each unit writes one partial sum into the row's range of a shared buffer,
//! and one reduction adds the buffer up. (As tensor operations it is a square, a sum and an
//! addition per tensor.)

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::CubeDim;

use super::groups;
use crate::ledger::{note, Work};

/// Units per cube.
const UNITS: u32 = 256;
/// Cubes per tensor at most: enough to stream a large gradient, few partial sums to add up.
const MAX_CUBES: usize = 32;

/// Writes, for unit `u` of cube row `k`, the sum of the squares of the elements `u, u + units, …`
/// of the group's tensor `k` (possibly a strided view) to `partials[offset + k · units + u]`.
#[cube(launch)]
fn squares_kernel(values: &Sequence<Tensor<f32>>, partials: &mut Tensor<f32>, offset: u32) {
    let units = CUBE_COUNT_X as usize * CUBE_DIM_X as usize;
    let unit = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    let row = CUBE_POS_Y as usize;
    let count = comptime![values.len()];
    let mut sum = 0.0f32;
    #[unroll]
    for k in 0..count {
        if row == k {
            sum = squares(values.index(k), unit, units);
        }
    }
    partials[offset as usize + row * units + unit] = sum;
}

/// The sum of the squares of the elements `unit, unit + units, …` of `values`.
#[cube]
fn squares(values: &Tensor<f32>, unit: usize, units: usize) -> f32 {
    let mut sum = 0.0f32;
    let mut i = unit;
    while i < values.len() {
        // The element's place in `values`: its coordinates in row-major order, times the strides.
        let mut rest = i;
        let mut at = 0;
        let mut d = values.rank();
        while d > 0 {
            d -= 1;
            let extent = values.shape(d);
            at += (rest % extent) * values.stride(d);
            rest /= extent;
        }
        let v = values[at];
        sum += v * v;
        i += units;
    }
    sum
}

/// Cubes for a tensor of `len` elements.
fn cubes(len: usize) -> usize {
    len.div_ceil(UNITS as usize).clamp(1, MAX_CUBES)
}

/// The partial sums of the squares of every tensor of `tensors` (f32, on one device; at least
/// one), one per unit: their sum is the sum of the squares of all.
pub(crate) fn partial_squares<R: CubeRuntime>(tensors: Vec<CubeTensor<R>>) -> CubeTensor<R> {
    let first = &tensors[0];
    let (client, device, dtype) = (first.client.clone(), first.device.clone(), first.dtype);
    // A tensor and the partial sums: the bindings of a launch of one tensor.
    let groups = groups(tensors, 1, 1, &client);
    let widths: Vec<usize> =
        groups.iter().map(|g| g.iter().map(|t| cubes(t.shape().num_elements())).max().unwrap_or(1)).collect();
    let total: usize = groups.iter().zip(&widths).map(|(g, &w)| g.len() * w * UNITS as usize).sum();
    let handle = client.empty(total * dtype.size());
    let partials = CubeTensor::new_contiguous(client.clone(), device, Shape::new([total]), handle, dtype);
    let mut offset = 0;
    for (group, width) in groups.into_iter().zip(widths) {
        let rows = group.len();
        let (count, dim) = (CubeCount::Static(width as u32, rows as u32, 1), CubeDim::new_1d(UNITS));
        let elements: usize = group.iter().map(|t| t.shape().num_elements()).sum();
        let longest = group.iter().map(|t| t.shape().num_elements()).max().unwrap_or(0);
        note(|| {
            let work = Work::of("norm::squares_kernel", &count, dim).moves(elements + rows * width * UNITS as usize);
            work.computes(2 * elements).waits(longest.div_ceil(width * UNITS as usize), 0)
        });
        let values: SequenceArg<R, Tensor<f32>> = group.into_iter().map(|t| t.into_tensor_arg()).collect();
        squares_kernel::launch::<R>(&client, count, dim, values, partials.clone().into_tensor_arg(), offset as u32);
        offset += rows * width * UNITS as usize;
    }
    partials
}
