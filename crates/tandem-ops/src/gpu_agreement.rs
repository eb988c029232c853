//! The GPU kernels of the rows and the optimizer on wgpu against Burn's operations on ndarray, at
//! the shapes a reference step runs (4,096 rows of 128; the 20,000 × 128 token table) and at odd
//! ones (one value, rows that do not fill a cube, rows longer than a cube's lanes).

use burn::backend::{Autodiff, NdArray, Wgpu};
use burn::module::Param;
use burn::nn::LayerNormConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::adamw::AdamWScalars;
use crate::ops::host_ops::{layer_norm, softmax_last};
use crate::optimizer::{adamw_step, squared_sum};

type Gpu = Autodiff<Wgpu>;
type Reference = Autodiff<NdArray>;

/// `count` values in [-2, 2), the same for a `seed` on every run.
fn values(count: usize, seed: u32) -> Vec<f32> {
    (0..count as u32)
        .map(|i| (crate::dropout::mix(i ^ seed.wrapping_mul(0x9e37_79b9)) >> 8) as f32 / 4_194_304.0 - 2.0)
        .collect()
}

fn tensor<B: Backend, const D: usize>(values: &[f32], shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(values.to_vec(), shape), &Default::default())
}

fn read<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor.into_data().to_vec().expect("f32 values")
}

/// Fails naming `what` where `got` is further than `tolerance` (relative to the largest reference
/// value) from `reference`.
fn assert_close(what: &str, reference: &[f32], got: &[f32], tolerance: f32) {
    assert_eq!(reference.len(), got.len(), "{what}: lengths");
    let scale = reference.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let worst = reference.iter().zip(got).fold(0f32, |m, (r, g)| m.max((r - g).abs() / scale));
    assert!(worst <= tolerance, "{what}: {worst:e} (relative) away from ndarray");
}

/// Odd shapes and the reference step's.
const SHAPES: [[usize; 2]; 6] = [[1, 1], [9, 7], [70, 33], [3, 1000], [4096, 128], [17, 256]];

#[test]
fn softmax_rows_agree_with_ndarray_forward_and_backward() {
    for (k, [rows, width]) in SHAPES.into_iter().enumerate() {
        let (x, weights) = (values(rows * width, k as u32), values(rows * width, 100 + k as u32));
        let x_gpu = tensor::<Gpu, 2>(&x, [rows, width]).require_grad();
        let y_gpu = softmax_last(x_gpu.clone());
        let d_gpu = x_gpu.grad(&(y_gpu.clone() * tensor(&weights, [rows, width])).sum().backward()).unwrap();
        let x_ref = tensor::<Reference, 2>(&x, [rows, width]).require_grad();
        let y_ref = burn::tensor::activation::softmax(x_ref.clone(), 1);
        let d_ref = x_ref.grad(&(y_ref.clone() * tensor(&weights, [rows, width])).sum().backward()).unwrap();
        let what = format!("softmax of {rows} × {width}");
        assert_close(&format!("{what}, output"), &read(y_ref), &read(y_gpu), 1e-4);
        assert_close(&format!("{what}, gradient"), &read(d_ref), &read(d_gpu), 1e-4);
    }
}

#[test]
fn layer_norm_agrees_with_ndarray_in_output_and_every_gradient() {
    let epsilon = 1e-5;
    for (k, [rows, width]) in SHAPES.into_iter().enumerate() {
        let seed = 10 * k as u32;
        let (x, weights) = (values(rows * width, seed), values(rows * width, seed + 1));
        let (gamma, beta) = (values(width, seed + 2), values(width, seed + 3));
        let mut norm = LayerNormConfig::new(width).with_epsilon(epsilon).init::<Gpu>(&Default::default());
        norm.gamma = Param::from_tensor(tensor(&gamma, [width]).require_grad());
        norm.beta = Some(Param::from_tensor(tensor(&beta, [width]).require_grad()));
        let x_gpu = tensor::<Gpu, 2>(&x, [rows, width]).require_grad();
        let y_gpu = layer_norm(&norm, x_gpu.clone(), epsilon);
        let grads = (y_gpu.clone() * tensor(&weights, [rows, width])).sum().backward();
        let beta_gpu = norm.beta.as_ref().unwrap().val();
        let got = [
            read(y_gpu),
            read(x_gpu.grad(&grads).unwrap()),
            read(norm.gamma.val().grad(&grads).unwrap()),
            read(beta_gpu.grad(&grads).unwrap()),
        ];

        // Burn's LayerNorm, written out: biased variance, then scale and shift.
        let x_ref = tensor::<Reference, 2>(&x, [rows, width]).require_grad();
        let gamma_ref = tensor::<Reference, 1>(&gamma, [width]).require_grad();
        let beta_ref = tensor::<Reference, 1>(&beta, [width]).require_grad();
        let (variance, mean) = x_ref.clone().var_mean_bias(1);
        let normalized = (x_ref.clone() - mean).div(variance.add_scalar(epsilon).sqrt());
        let y_ref = normalized * gamma_ref.clone().unsqueeze() + beta_ref.clone().unsqueeze();
        let grads = (y_ref.clone() * tensor(&weights, [rows, width])).sum().backward();
        let expected = [
            read(y_ref),
            read(x_ref.grad(&grads).unwrap()),
            read(gamma_ref.grad(&grads).unwrap()),
            read(beta_ref.grad(&grads).unwrap()),
        ];
        for ((part, e), g) in ["output", "∂x", "∂γ", "∂β"].iter().zip(expected).zip(got) {
            assert_close(&format!("layer norm of {rows} × {width}, {part}"), &e, &g, 1e-4);
        }
    }
}

/// The token table of the reference model, and a bias.
const TABLE: [usize; 2] = [20_000, 128];

#[test]
fn the_squared_norm_of_the_token_table_agrees_with_a_sum_in_f64() {
    let table = values(TABLE[0] * TABLE[1], 7);
    let bias = values(4, 8);
    let tensors = vec![
        tensor::<Wgpu, 2>(&table, TABLE).into_primitive().tensor(),
        tensor::<Wgpu, 1>(&bias, [4]).into_primitive().tensor(),
    ];
    let got = read(squared_sum::<Wgpu>(tensors).expect("a kernel on wgpu"))[0] as f64;
    let expected: f64 = table.iter().chain(&bias).map(|v| (*v as f64).powi(2)).sum();
    assert!((got - expected).abs() / expected < 1e-5, "squared norm {got} against {expected}");
}

#[test]
fn adamw_over_the_token_table_agrees_with_burns_arithmetic_on_ndarray() {
    let n = TABLE[0] * TABLE[1];
    let [param, grad, moment_1] = [1, 2, 3].map(|seed| values(n, seed));
    let moment_2: Vec<f32> = values(n, 4).iter().map(|v| v * v).collect();
    let squared_norm: f32 = grad.iter().map(|g| g * g).sum();
    let scalars = AdamWScalars {
        beta_1: 0.9,
        beta_2: 0.999,
        epsilon: 1e-8,
        keep: 1.0 - 1e-3 * 0.01,
        lr: 1e-3,
        time: 3,
        // Clipped: the gradients' norm is far above 1.
        clip_norm: 1.0,
    };
    let on = |values: &Vec<f32>| tensor::<Wgpu, 2>(values, TABLE);
    let got = adamw_step::<Wgpu, 2>(
        &scalars,
        [on(&param), on(&grad), on(&moment_1), on(&moment_2)],
        tensor(&[squared_norm], [1]),
    )
    .expect("a kernel on wgpu")
    .map(read);

    let on = |values: &Vec<f32>| tensor::<NdArray, 2>(values, TABLE);
    let (beta_1, beta_2) = (scalars.beta_1, scalars.beta_2);
    let (correction_1, correction_2) = scalars.corrections();
    let g = on(&grad).mul_scalar(scalars.clip_norm / (squared_norm.sqrt() + 1e-6));
    let m = on(&moment_1).mul_scalar(beta_1) + g.clone().mul_scalar(1.0 - beta_1);
    let v = on(&moment_2).mul_scalar(beta_2) + g.clone().mul(g).mul_scalar(1.0 - beta_2);
    let delta =
        m.clone().div_scalar(correction_1).div(v.clone().div_scalar(correction_2).sqrt().add_scalar(scalars.epsilon));
    let p = on(&param).mul_scalar(scalars.keep) - delta.mul_scalar(scalars.lr);
    // The parameter as its change, whose size the tolerance is relative to.
    let [p, m, v] = [p, m, v].map(read);
    let change = |after: &[f32]| after.iter().zip(&param).map(|(a, b)| a - b).collect::<Vec<f32>>();
    assert_close("AdamW over the token table, the parameters' change", &change(&p), &change(&got[0]), 1e-4);
    for ((part, e), g) in ["first moment", "second moment"].iter().zip([m, v]).zip(&got[1..]) {
        assert_close(&format!("AdamW over the token table, {part}"), &e, g, 1e-5);
    }
}
