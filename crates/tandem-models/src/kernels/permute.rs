//! Permuting the dimensions of a tensor as a contiguous copy on the CPU backends (attention's
//! head split and merge).
//!
//! Burn permutes as a view, and the first reshape of that view (forward, or in the backward
//! pass) copies it on Flex one value at a time through a strided index: 10 % of a Transformer
//! training step (`perf`). Here the permutation is one copy, by rows where the last dimension
//! stays last, forward and backward ([`crate::host_op`]); other backends keep the view.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::dispatch::values;
use crate::host_op::{self, HostOp};

/// `x` with dimension `axes[i]` as dimension `i` (as `Tensor::permute`), contiguous on the CPU
/// backends (a view elsewhere).
pub fn permute<B: Backend>(x: Tensor<B, 4>, axes: [usize; 4]) -> Tensor<B, 4> {
    host_op::apply(Permute(axes), x.clone()).unwrap_or_else(|| x.permute(axes))
}

#[derive(Clone, Copy, Debug)]
struct Permute([usize; 4]);

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

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::{Distribution, Tensor};

    use super::permute;

    type B = Autodiff<NdArray>;

    #[test]
    fn equals_burns_permute_forward_and_backward() {
        let device = Default::default();
        for axes in [[0, 2, 1, 3], [0, 2, 3, 1], [3, 1, 0, 2]] {
            let x = Tensor::<B, 4>::random([2, 3, 4, 5], Distribution::Normal(0.0, 1.0), &device).require_grad();
            let weights =
                Tensor::<B, 4>::random(x.clone().permute(axes).dims(), Distribution::Normal(0.0, 1.0), &device);
            let ours = permute(x.clone(), axes);
            let burns = x.clone().permute(axes);
            assert_eq!(ours.clone().into_data(), burns.clone().into_data(), "{axes:?} forward");
            let gradient = |y: Tensor<B, 4>| {
                x.grad(&(y * weights.clone()).sum().backward()).expect("x requires a gradient").into_data()
            };
            assert_eq!(gradient(ours), gradient(burns), "{axes:?} backward");
        }
    }
}
