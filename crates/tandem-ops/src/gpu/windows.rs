//! The CNN's windows (im2col) as one kernel forward and one backward: row `p` of a sample holds
//! its positions `p .. p + width` side by side, zeros past the end. As tensor operations the
//! windows are shifted views laid side by side, and the backward pass of each view is a fill and
//! a slice-assign, added up.

use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::{empty_like, one_unit_each};
use crate::ledger::{note, Work};

/// `windows[b, p, k · C + c] = x[b, p + k, c]`, zero where `p + k` is past the end.
#[cube(launch)]
fn forward_kernel(x: &Tensor<f32>, windows: &mut Tensor<f32>, seq: u32, positions: u32, width: u32, channels: u32) {
    let i = ABSOLUTE_POS;
    if i < windows.len() {
        let (seq, positions, width, channels) = (seq as usize, positions as usize, width as usize, channels as usize);
        let row = width * channels;
        let (b, p, column) = (i / (positions * row), (i / row) % positions, i % row);
        let (k, c) = (column / channels, column % channels);
        let mut value = 0.0f32;
        if p + k < seq {
            value = x[(b * seq + p + k) * channels + c];
        }
        windows[i] = value;
    }
}

/// `∂x[b, t, c] = Σ_k ∂windows[b, t − k, k · C + c]` over the windows that hold position `t`.
#[cube(launch)]
fn backward_kernel(grad: &Tensor<f32>, out: &mut Tensor<f32>, seq: u32, positions: u32, width: u32, channels: u32) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let (seq, positions, width, channels) = (seq as usize, positions as usize, width as usize, channels as usize);
        let (b, t, c) = (i / (seq * channels), (i / channels) % seq, i % channels);
        let mut sum = 0.0f32;
        for k in 0..width {
            if t >= k && t - k < positions {
                sum += grad[(b * positions + t - k) * width * channels + k * channels + c];
            }
        }
        out[i] = sum;
    }
}

/// The `positions` windows of `width` positions of `x` `[batch, seq, channels]` (f32):
/// `[batch, positions, width · channels]`.
pub(crate) fn forward<R: CubeRuntime>(x: CubeTensor<R>, width: usize, positions: usize) -> CubeTensor<R> {
    let x = into_contiguous(x);
    let [batch, seq, channels] = x.shape().dims::<3>();
    let windows = empty_like(&x, Shape::new([batch, positions, width * channels]));
    let (count, dim) = one_unit_each(&x, batch * positions * width * channels);
    let values = batch * (positions * width + seq) * channels;
    note(|| Work::of("windows::forward_kernel", &count, dim).moves(values).waits(1, 0));
    forward_kernel::launch::<R>(
        &x.client.clone(),
        count,
        dim,
        x.into_tensor_arg(),
        windows.clone().into_tensor_arg(),
        seq as u32,
        positions as u32,
        width as u32,
        channels as u32,
    );
    windows
}

/// The gradient of `x` `[batch, seq, channels]` from the windows' gradient.
pub(crate) fn backward<R: CubeRuntime>(grad: CubeTensor<R>, seq: usize, width: usize) -> CubeTensor<R> {
    let grad = into_contiguous(grad);
    let [batch, positions, row] = grad.shape().dims::<3>();
    let channels = row / width;
    let out = empty_like(&grad, Shape::new([batch, seq, channels]));
    let (count, dim) = one_unit_each(&grad, batch * seq * channels);
    let values = batch * (positions * width + seq) * channels;
    note(|| {
        Work::of("windows::backward_kernel", &count, dim)
            .moves(values)
            .computes(batch * seq * channels * width)
            .waits(width, 0)
    });
    backward_kernel::launch::<R>(
        &grad.client.clone(),
        count,
        dim,
        grad.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        seq as u32,
        positions as u32,
        width as u32,
        channels as u32,
    );
    out
}
