//! The sum of the squares of many tensors — global-norm clipping's `‖g‖²` over every gradient —
//! in one launch per tensor and one final sum: each tensor's kernel writes one partial sum per
//! unit into its own range of a shared buffer, and one reduction adds the buffer up. (As tensor
//! operations it is a square, a sum and an addition per tensor.)

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::CubeDim;

/// Units per cube.
const UNITS: u32 = 256;
/// Cubes per tensor at most: enough to stream a large gradient, few partial sums to add up.
const MAX_CUBES: usize = 32;

/// Writes, for each unit, the sum of the squares of the elements `unit, unit + units, …` of
/// `values` (`len` elements, possibly a strided view) to `partials[offset + unit]`.
#[cube(launch)]
fn squares_kernel(values: &Tensor<f32>, partials: &mut Tensor<f32>, len: u32, offset: u32) {
    let units = CUBE_COUNT_X as usize * CUBE_DIM_X as usize;
    let unit = ABSOLUTE_POS;
    let mut sum = 0.0f32;
    let mut i = unit;
    while i < len as usize {
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
    partials[offset as usize + unit] = sum;
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
    let lens: Vec<usize> = tensors.iter().map(|t| t.shape().num_elements()).collect();
    let total: usize = lens.iter().map(|&len| cubes(len) * UNITS as usize).sum();
    let shape = Shape::new([total]);
    let handle = client.empty(total * dtype.size());
    let partials = CubeTensor::new_contiguous(client.clone(), device, shape, handle, dtype);
    let mut offset = 0;
    for (tensor, len) in tensors.into_iter().zip(lens) {
        let count = cubes(len);
        squares_kernel::launch::<R>(
            &client,
            CubeCount::Static(count as u32, 1, 1),
            CubeDim::new_1d(UNITS),
            tensor.into_tensor_arg(),
            partials.clone().into_tensor_arg(),
            len as u32,
            offset as u32,
        );
        offset += count * UNITS as usize;
    }
    partials
}
