//! A linear layer over rows, `x · W + b`, as **one operation** with a hand-written backward pass
//! on the CPU backends, its three matmuls written straight into host buffers
//! ([`crate::cpu::host_gemm`]).
//!
//! Burn runs it as a matmul and a broadcast add: on Flex the matmul's output is allocated and
//! copied twice, and the add and its backward (a sum over every row for `b`) run element by
//! element. On `Autodiff<I>` for a CPU backend `I` compiled into this crate (Flex, ndarray) it
//! is one autodiff node; on those backends without autodiff it runs the same forward pass; on
//! any other backend (GPUs) it is Burn's matmul and add.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};

use crate::backend::Which;
use crate::cpu::dispatch::{host_f32, record_node, same_type, values};
use crate::cpu::host_gemm::{host_matmul, host_product, Matrix};

/// `x · weight (+ bias)` for `x` `[rows, in]`, `weight` `[in, out]` (Burn's `Linear` layout) and
/// `bias` `[out]`: `[rows, out]`.
pub(crate) fn linear_rows<B: Backend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, 2> {
    let ([_, d_in], [w_in, d_out]) = (x.dims(), weight.dims());
    assert!(
        w_in == d_in && bias.as_ref().is_none_or(|b| b.dims() == [d_out]),
        "linear_rows: {:?} · {:?} + {:?}",
        x.dims(),
        weight.dims(),
        bias.as_ref().map(|b| b.dims())
    );
    match Which::of::<B>() {
        #[cfg(feature = "flex")]
        Which::AutodiffFlex => {
            same_type(tracked::<burn::backend::Flex>(same_type(x), same_type(weight), bias.map(same_type)))
        }
        #[cfg(feature = "ndarray")]
        Which::AutodiffNdArray => {
            same_type(tracked::<burn::backend::NdArray>(same_type(x), same_type(weight), bias.map(same_type)))
        }
        Which::Flex | Which::NdArray => {
            let device = x.device();
            let (out, _) = forward(host_f32(x), host_f32(weight), bias.map(host_f32));
            Tensor::from_data(out, &device)
        }
        _ => {
            let out = x.matmul(weight);
            match bias {
                Some(bias) => out + bias.unsqueeze(),
                None => out,
            }
        }
    }
}

/// What the backward pass needs: the input (for the weight's gradient) and the weight (for the
/// input's).
#[derive(Clone, Debug)]
struct Saved {
    x: TensorData,
    weight: TensorData,
}

/// The forward pass in host memory. With a bias, every output row starts as the bias and
/// `x · W` is added to it; without, gemm writes the rows of a new buffer.
fn forward(x: TensorData, weight: TensorData, bias: Option<TensorData>) -> (TensorData, Saved) {
    let ([rows, d_in], d_out) = ([x.shape[0], x.shape[1]], weight.shape[1]);
    let (a, b) = (Matrix::rows(values(&x), rows, d_in), Matrix::rows(values(&weight), d_in, d_out));
    let out = match bias {
        Some(bias) => {
            let mut out = values(&bias).repeat(rows);
            host_matmul(&mut out, a, b, true);
            out
        }
        None => host_product(a, b),
    };
    (TensorData::new(out, [rows, d_out]), Saved { x, weight })
}

/// Runs the forward pass on `I` and registers one autodiff node for it.
fn tracked<I: Backend>(
    x: Tensor<Autodiff<I>, 2>,
    weight: Tensor<Autodiff<I>, 2>,
    bias: Option<Tensor<Autodiff<I>, 1>>,
) -> Tensor<Autodiff<I>, 2> {
    let device = x.device();
    let [x, weight] = [x, weight].map(|t| t.into_primitive().tensor());
    let host = |t: FloatTensor<I>| host_f32(Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(t)));
    let run = |x, weight, bias: Option<FloatTensor<I>>, record: bool| {
        let (out, saved) = forward(host(x), host(weight), bias.map(host));
        (Tensor::<I, 2>::from_data(out, &device).into_primitive().tensor(), record.then_some(saved))
    };
    let output = match bias {
        Some(bias) => {
            record_node(LinearBackward, [x, weight, bias.into_primitive().tensor()], |[x, weight, bias], record| {
                run(x, weight, Some(bias), record)
            })
        }
        None => record_node(LinearBackward, [x, weight], |[x, weight], record| run(x, weight, None, record)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(output))
}

/// The autodiff node of one [`linear_rows`]: parents `[x, weight]` or `[x, weight, bias]`.
#[derive(Debug)]
struct LinearBackward;

impl<I: Backend, const N: usize> Backward<I, N> for LinearBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = Tensor::<I, 2>::from_primitive(TensorPrimitive::Float(grads.consume::<I>(&ops.node)));
        let device = grad.device();
        let Saved { x, weight } = ops.state;
        let ([rows, d_in], d_out) = ([x.shape[0], x.shape[1]], weight.shape[1]);
        let grad_values = host_f32(grad);
        let grad = Matrix::rows(values(&grad_values), rows, d_out);
        let tensor = |values: Vec<f32>, shape: [usize; 2]| {
            Tensor::<I, 2>::from_data(TensorData::new(values, shape), &device).into_primitive().tensor()
        };
        let mut parents = ops.parents.into_iter();
        let (x_node, weight_node, bias_node) =
            (parents.next().flatten(), parents.next().flatten(), parents.next().flatten());
        if let Some(node) = x_node {
            let d_x = host_product(grad, Matrix::rows(values(&weight), d_in, d_out).t());
            grads.register::<I>(node.id, tensor(d_x, [rows, d_in]));
        }
        if let Some(node) = weight_node {
            let d_weight = host_product(Matrix::rows(values(&x), rows, d_in).t(), grad);
            grads.register::<I>(node.id, tensor(d_weight, [d_in, d_out]));
        }
        if let Some(node) = bias_node {
            // Column sums, a row at a time (each a vectorised pass).
            let mut d_bias = vec![0f32; d_out];
            for row in values(&grad_values).chunks_exact(d_out.max(1)) {
                for (sum, g) in d_bias.iter_mut().zip(row) {
                    *sum += g;
                }
            }
            grads.register::<I>(
                node.id,
                Tensor::<I, 1>::from_data(TensorData::new(d_bias, [d_out]), &device).into_primitive().tensor(),
            );
        }
    }
}
