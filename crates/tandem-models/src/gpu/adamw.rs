//! One AdamW step over a parameter tensor as one kernel: the parameter, its gradient and both
//! moments read once, the three results written once. Burn's step is about fifteen tensor
//! operations per parameter, each a launch and a pass over the values.

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::adamw::AdamWScalars;

/// Burn's AdamW arithmetic, in its order, value by value (f32). The gradient may be a strided
/// view (a slice of a concatenated weight's gradient) and is first clipped: multiplied by
/// `clip_norm / (‖g‖ + 1e-6)` where `‖g‖ = √squared_norm[0]` exceeds `clip_norm` (∞ without
/// clipping); the other tensors are contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn adamw_kernel(
    param: &Tensor<f32>,
    grad: &Tensor<f32>,
    moment_1: &Tensor<f32>,
    moment_2: &Tensor<f32>,
    squared_norm: &Tensor<f32>,
    out_param: &mut Tensor<f32>,
    out_moment_1: &mut Tensor<f32>,
    out_moment_2: &mut Tensor<f32>,
    beta_1: f32,
    beta_2: f32,
    correction_1: f32,
    correction_2: f32,
    epsilon: f32,
    keep: f32,
    lr: f32,
    clip_norm: f32,
) {
    let norm = squared_norm[0].sqrt();
    let mut factor = 1.0f32;
    if norm > clip_norm {
        factor = clip_norm / (norm + 1e-6);
    }
    let i = ABSOLUTE_POS;
    if i < param.len() {
        let mut at = 0;
        for d in 0..param.rank() {
            at += param.coordinate(i, d) * grad.stride(d);
        }
        let g = grad[at] * factor;
        let m = moment_1[i] * beta_1 + g * (1.0 - beta_1);
        let v = moment_2[i] * beta_2 + g * g * (1.0 - beta_2);
        let delta = (m / correction_1) / ((v / correction_2).sqrt() + epsilon);
        out_param[i] = param[i] * keep - delta * lr;
        out_moment_1[i] = m;
        out_moment_2[i] = v;
    }
}

/// A contiguous f32 tensor shaped like `like`, its values not set.
fn empty_like<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    let shape: Shape = like.shape();
    let handle = like.client.empty((shape.num_elements() * like.dtype.size()).max(4));
    CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), shape, handle, like.dtype)
}

/// The parameter and both moments after one step (all f32, of one shape), the gradient clipped
/// by `squared_norm` (one value, `‖g‖²`).
pub(crate) fn step<R: CubeRuntime>(
    scalars: &AdamWScalars,
    [param, grad, moment_1, moment_2, squared_norm]: [CubeTensor<R>; 5],
) -> [CubeTensor<R>; 3] {
    let [param, moment_1, moment_2, squared_norm] = [param, moment_1, moment_2, squared_norm].map(into_contiguous);
    let outputs = [empty_like(&param), empty_like(&param), empty_like(&param)];
    let client = param.client.clone();
    let cube_dim = CubeDim::new_1d(256);
    let count = calculate_cube_count_elemwise(&client, param.shape().num_elements(), cube_dim);
    let (correction_1, correction_2) = scalars.corrections();
    adamw_kernel::launch::<R>(
        &client,
        count,
        cube_dim,
        param.into_tensor_arg(),
        grad.into_tensor_arg(),
        moment_1.into_tensor_arg(),
        moment_2.into_tensor_arg(),
        squared_norm.into_tensor_arg(),
        outputs[0].clone().into_tensor_arg(),
        outputs[1].clone().into_tensor_arg(),
        outputs[2].clone().into_tensor_arg(),
        scalars.beta_1,
        scalars.beta_2,
        correction_1,
        correction_2,
        scalars.epsilon,
        scalars.keep,
        scalars.lr,
        scalars.clip_norm,
    );
    outputs
}
