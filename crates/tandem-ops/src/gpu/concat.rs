//! Tensors laid side by side along one dimension in one launch: each output element is read from
//! the piece that holds its place. (Burn's `cat` writes one piece per launch.)

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::ledger::{note, Work};

/// Writes each element of `output` from the piece of `pieces` that holds its place along `dim`
/// (the pieces in order; any strides).
#[cube(launch)]
fn concat_kernel(pieces: &Sequence<Tensor<f32>>, output: &mut Tensor<f32>, dim: u32) {
    let i = ABSOLUTE_POS;
    if i < output.len() {
        let dim = dim as usize;
        let place = output.coordinate(i, dim);
        let mut start = 0;
        let count = comptime![pieces.len()];
        #[unroll]
        for k in 0..count {
            let piece = pieces.index(k);
            let width = piece.shape(dim);
            if place >= start && place < start + width {
                let mut at = 0;
                for d in 0..output.rank() {
                    let mut coordinate = output.coordinate(i, d);
                    if d == dim {
                        coordinate -= start;
                    }
                    at += coordinate * piece.stride(d);
                }
                output[i] = piece[at];
            }
            start += width;
        }
    }
}

/// `pieces` (f32, on one device, of one shape but along `dim`; as many as one launch binds, see
/// `per_launch`) side by side along `dim`, contiguous.
pub(crate) fn concat<R: CubeRuntime>(pieces: Vec<CubeTensor<R>>, dim: usize) -> CubeTensor<R> {
    let first = &pieces[0];
    let (client, device, dtype) = (first.client.clone(), first.device.clone(), first.dtype);
    let shapes: Vec<Shape> = pieces.iter().map(|p| p.shape()).collect();
    let shape = Shape::cat(&shapes, dim).expect("the pieces match but along `dim`");
    let elements = shape.num_elements();
    let handle = client.empty((elements * dtype.size()).max(4));
    let output = CubeTensor::new_contiguous(client.clone(), device, shape, handle, dtype);
    let cube_dim = CubeDim::new_1d(256);
    let count = calculate_cube_count_elemwise(&client, elements, cube_dim);
    note(|| Work::of("concat::concat_kernel", &count, cube_dim).moves(2 * elements).waits(1, 0));
    let pieces: SequenceArg<R, Tensor<f32>> = pieces.into_iter().map(|p| p.into_tensor_arg()).collect();
    concat_kernel::launch::<R>(&client, count, cube_dim, pieces, output.clone().into_tensor_arg(), dim as u32);
    output
}
