//! AdamW steps over many parameter tensors in one launch per group of them: for each parameter
//! its gradient and both moments are read once and the three results written once. Burn's step
//! is about fifteen tensor operations per parameter, each a launch and a pass over the values.

use burn::tensor::TensorMetadata;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;
use cubecl::CubeDim;

use super::{empty_like, groups};
use crate::adamw::AdamWScalars;
use crate::ledger::{note, Work};

/// Units per cube.
const UNITS: u32 = 256;
/// Cubes per parameter at most: a larger parameter is streamed by the same units.
const MAX_CUBES: usize = 64;

/// Burn's AdamW arithmetic, in its order, value by value (f32), on the group's parameter `k` in
/// cube row `k`, its units striding over the elements. A gradient may be a strided view (a slice
/// of a concatenated weight's gradient) and is first clipped: multiplied by
/// `clip_norm / (‖g‖ + 1e-6)` where `‖g‖ = √squared_norm[0]` exceeds `clip_norm` (∞ without
/// clipping); the other tensors are contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn adamw_kernel(
    params: &Sequence<Tensor<f32>>,
    grads: &Sequence<Tensor<f32>>,
    moments_1: &Sequence<Tensor<f32>>,
    moments_2: &Sequence<Tensor<f32>>,
    squared_norm: &Tensor<f32>,
    out_params: &mut Sequence<Tensor<f32>>,
    out_moments_1: &mut Sequence<Tensor<f32>>,
    out_moments_2: &mut Sequence<Tensor<f32>>,
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
    let units = CUBE_COUNT_X as usize * CUBE_DIM_X as usize;
    let unit = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    let row = CUBE_POS_Y as usize;
    let count = comptime![params.len()];
    #[unroll]
    for k in 0..count {
        if row == k {
            let (param, grad) = (params.index(k), grads.index(k));
            let (moment_1, moment_2) = (moments_1.index(k), moments_2.index(k));
            let out_param = out_params.index_mut(k);
            let out_moment_1 = out_moments_1.index_mut(k);
            let out_moment_2 = out_moments_2.index_mut(k);
            let mut i = unit;
            while i < param.len() {
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
                i += units;
            }
        }
    }
}

/// Every parameter and both its moments after one step (`[param, grad, moment 1, moment 2]`,
/// f32, of one shape per parameter, on one device), the gradients clipped by `squared_norm` (one
/// value, `‖g‖²`).
pub(crate) fn steps<R: CubeRuntime>(
    scalars: &AdamWScalars,
    tensors: Vec<[CubeTensor<R>; 4]>,
    squared_norm: CubeTensor<R>,
) -> Vec<[CubeTensor<R>; 3]> {
    let squared_norm = into_contiguous(squared_norm);
    let client = squared_norm.client.clone();
    let (correction_1, correction_2) = scalars.corrections();
    let mut results = Vec::with_capacity(tensors.len());
    // Seven tensors a parameter, and the squared norm.
    for group in groups(tensors, 7, 1, &client) {
        let rows = group.len();
        let width = group.iter().map(|[p, ..]| p.shape().num_elements().div_ceil(UNITS as usize)).max().unwrap_or(1);
        let elements: usize = group.iter().map(|[p, ..]| p.shape().num_elements()).sum();
        let mut inputs: [SequenceArg<R, Tensor<f32>>; 4] = Default::default();
        let mut outputs: [SequenceArg<R, Tensor<f32>>; 3] = Default::default();
        for [param, grad, moment_1, moment_2] in group {
            let [param, moment_1, moment_2] = [param, moment_1, moment_2].map(into_contiguous);
            let out = [0; 3].map(|_| empty_like(&param, param.shape()));
            for (args, tensor) in inputs.iter_mut().zip([param, grad, moment_1, moment_2]) {
                args.push(tensor.into_tensor_arg());
            }
            for (args, tensor) in outputs.iter_mut().zip(out.clone()) {
                args.push(tensor.into_tensor_arg());
            }
            results.push(out);
        }
        let [params, grads, moments_1, moments_2] = inputs;
        let [out_params, out_moments_1, out_moments_2] = outputs;
        let (count, dim) =
            (CubeCount::Static(width.clamp(1, MAX_CUBES) as u32, rows as u32, 1), CubeDim::new_1d(UNITS));
        note(|| {
            // Four values read and three written per element; a unit's loop strides over the
            // largest parameter.
            let work = Work::of("adamw::adamw_kernel", &count, dim).moves(7 * elements + 1).computes(16 * elements);
            work.waits(width.div_ceil(MAX_CUBES), 0)
        });
        adamw_kernel::launch::<R>(
            &client,
            count,
            dim,
            params,
            grads,
            moments_1,
            moments_2,
            squared_norm.clone().into_tensor_arg(),
            out_params,
            out_moments_1,
            out_moments_2,
            scalars.beta_1,
            scalars.beta_2,
            correction_1,
            correction_2,
            scalars.epsilon,
            scalars.keep,
            scalars.lr,
            scalars.clip_norm,
        );
    }
    results
}
