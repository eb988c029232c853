//! Permuting the dimensions of a 4-D tensor as one contiguous copy (by rows where the last
//! dimension stays last), forward and backward.

use burn::tensor::TensorData;

use super::dispatch::values;
use super::host_op::HostOp;

/// A permutation of four dimensions as a [`HostOp`]: dimension `axes[i]` becomes dimension `i`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Permute(pub(crate) [usize; 4]);

/// `x` copied with dimension `axes[i]` as dimension `i`.
fn permuted(x: &TensorData, axes: [usize; 4]) -> TensorData {
    debug_assert!((0..4).all(|d| axes.contains(&d)), "{axes:?} is not a permutation");
    let dims: [usize; 4] = [0, 1, 2, 3].map(|i| x.shape[i]);
    let strides = [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1];
    let (out_dims, step) = (axes.map(|a| dims[a]), axes.map(|a| strides[a]));
    let x = values(x);
    let mut out = Vec::with_capacity(x.len());
    for i in 0..out_dims[0] {
        for j in 0..out_dims[1] {
            for k in 0..out_dims[2] {
                let start = i * step[0] + j * step[1] + k * step[2];
                if step[3] == 1 {
                    out.extend_from_slice(&x[start..][..out_dims[3]]);
                } else {
                    out.extend((0..out_dims[3]).map(|l| x[start + l * step[3]]));
                }
            }
        }
    }
    TensorData::new(out, out_dims)
}

impl HostOp for Permute {
    const ON_NDARRAY: bool = true;
    const WITHOUT_AUTODIFF: bool = true; // a reshape of Burn's view copies it value by value
    type Kept = ();

    fn forward(self, x: TensorData) -> (TensorData, ()) {
        (permuted(&x, self.0), ())
    }

    /// The inverse permutation of the gradient.
    fn backward(self, _: &(), grad: TensorData) -> TensorData {
        let mut inverse = [0; 4];
        for (i, &a) in self.0.iter().enumerate() {
            inverse[a] = i;
        }
        permuted(&grad, inverse)
    }
}
