//! Convolutions of several widths, each followed by a max over the positions where its kernel
//! fits, as **one operation** with a hand-written backward pass on the CPU backends.
//!
//! Max pooling passes each (sample, filter) gradient to a single position, so the gradients of
//! the convolution are sparse: one window per (sample, filter). Burn's autodiff does not know
//! that, and runs the backward of the im2col matmul as two dense matmuls (window gradients and
//! weight gradients over every position), plus the backward of the window construction (a
//! zero-filled input-sized tensor per kernel offset). Here the backward adds, per (sample,
//! filter), one window scaled by its gradient to that filter's weight gradient and the filter's
//! weights to the window's inputs: `batch × filters × width × channels` multiply-adds in all,
//! about 1/positions of the dense matmuls.
//!
//! On `Autodiff<I>` for a CPU backend `I` compiled into this crate (Flex, ndarray) the operation
//! is one autodiff node; on those backends without autodiff it runs the same forward pass; on any
//! other backend (GPUs) it runs as ordinary tensor operations. The forward pass is the same
//! everywhere: windows of the widest kernel (zeros past the end), one matmul per width over the
//! columns that width uses, max over the positions where the kernel fits.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};

use super::windows::windows;
use crate::backend::Which;
use crate::cpu::dispatch::{host_f32, record_node, same_type, values};
use crate::cpu::host_gemm::transposed;

/// The kernel width and filter count of each convolution, in the order of the weight's columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Widths(pub(crate) Vec<(usize, usize)>);

impl Widths {
    pub(crate) fn widest(&self) -> usize {
        self.0.iter().map(|&(w, _)| w).max().expect("at least one convolution")
    }

    fn narrowest(&self) -> usize {
        self.0.iter().map(|&(w, _)| w).min().expect("at least one convolution")
    }

    fn filters(&self) -> usize {
        self.0.iter().map(|&(_, f)| f).sum()
    }

    /// Each convolution's width, filter count and first column.
    fn columns(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.0.iter().scan(0, |first, &(w, f)| {
            *first += f;
            Some((w, f, *first - f))
        })
    }
}

/// `x` (`[batch, seq, channels]`) through convolutions without bias whose weights are the
/// columns of `weight` (`[widest × channels, filters]`, row `k × channels + c` = kernel offset
/// `k`, channel `c`; zero past a narrower kernel's width), then the max over the
/// positions where each kernel fits: `[batch, filters]`.
pub(crate) fn conv_max<B: Backend>(x: Tensor<B, 3>, weight: Tensor<B, 2>, widths: &Widths) -> Tensor<B, 2> {
    let [_, seq, channels] = x.dims();
    assert!(
        seq >= widths.widest() && weight.dims() == [widths.widest() * channels, widths.filters()],
        "conv_max: {:?} input, {:?} weight for widths {widths:?}",
        x.dims(),
        weight.dims()
    );
    match own_backward::<B>() {
        Some(run) => run(x, weight, widths),
        None if Which::of::<B>().on_cpu() => forward(x, weight, widths).0,
        None => ordinary(x, weight, widths),
    }
}

/// [`conv_max`] as one autodiff node on `B` = `Autodiff<I>`.
type OneNode<B> = fn(Tensor<B, 3>, Tensor<B, 2>, &Widths) -> Tensor<B, 2>;

/// The one-node path of `B`, if `B` is `Autodiff<I>` for a CPU backend `I` compiled into this crate.
fn own_backward<B: Backend>() -> Option<OneNode<B>> {
    match Which::of::<B>() {
        #[cfg(feature = "flex")]
        Which::AutodiffFlex => {
            Some(|x, w, widths| same_type(tracked::<burn::backend::Flex>(same_type(x), same_type(w), widths)))
        }
        #[cfg(feature = "ndarray")]
        Which::AutodiffNdArray => {
            Some(|x, w, widths| same_type(tracked::<burn::backend::NdArray>(same_type(x), same_type(w), widths)))
        }
        _ => None,
    }
}

/// Whether [`conv_max`] runs with its own backward pass on `B`.
pub(crate) fn has_own_backward<B: Backend>() -> bool {
    own_backward::<B>().is_some()
}

/// The same maths as ordinary tensor operations (GPU backends): the windows as one `cat` of
/// shifted views, one matmul, −∞ where a kernel would run past the end, max over positions.
fn ordinary<B: Backend>(x: Tensor<B, 3>, weight: Tensor<B, 2>, widths: &Widths) -> Tensor<B, 2> {
    let [batch, seq, channels] = x.dims();
    let device = x.device();
    let (widest, narrowest, filters) = (widths.widest(), widths.narrowest(), widths.filters());
    // The widest window starts wherever the narrowest one fits (zeros past the end).
    let positions = seq - narrowest + 1;
    let windows = windows(x, widest, positions).reshape([batch * positions, widest * channels]);
    let mut outside = Vec::with_capacity(positions * filters);
    for p in 0..positions {
        for &(width, count) in &widths.0 {
            outside.extend(std::iter::repeat_n(if p + width > seq { f32::NEG_INFINITY } else { 0.0 }, count));
        }
    }
    let outside = Tensor::<B, 2>::from_data(TensorData::new(outside, [positions, filters]), &device);
    // Added as one shared row per sample: CPU backends broadcast that in a vectorised loop.
    let out = (windows.matmul(weight).reshape([batch, positions * filters])
        + outside.reshape([1, positions * filters]))
    .reshape([batch, positions, filters]);
    out.max_dim(1).squeeze_dim(1)
}

/// What the backward pass needs: the input, the weight, and the position each (sample, filter)
/// maximum came from.
#[derive(Clone, Debug)]
struct Saved {
    x: TensorData,
    weight: TensorData,
    widths: Widths,
    argmax: Vec<u32>,
}

/// The forward pass on a CPU backend: the pooled maxima and what the backward pass needs.
fn forward<B: Backend>(x: Tensor<B, 3>, weight: Tensor<B, 2>, widths: &Widths) -> (Tensor<B, 2>, Saved) {
    let [batch, seq, channels] = x.dims();
    let device = x.device();
    let (widest, filters) = (widths.widest(), widths.filters());
    let positions = seq - widths.narrowest() + 1;
    let x = host_f32(x);
    // Position-major windows: row (b, p) = x[b, p .. p + widest], zeros past the end.
    let row = widest * channels;
    let mut windows = Vec::with_capacity(batch * positions * row);
    for sample in values(&x).chunks_exact(seq * channels) {
        for p in 0..positions {
            let inside = &sample[p * channels..(p + widest).min(seq) * channels];
            windows.extend_from_slice(inside);
            windows.resize(windows.len() + row - inside.len(), 0.0);
        }
    }
    let windows = Tensor::<B, 2>::from_data(TensorData::new(windows, [batch * positions, row]), &device);
    let mut pooled = vec![0f32; batch * filters];
    let mut argmax = vec![0u32; batch * filters];
    for (width, count, first) in widths.columns() {
        // Only the columns this width uses: its own weights, no zero padding.
        let used = width * channels;
        let out = windows.clone().narrow(1, 0, used).matmul(weight.clone().narrow(0, 0, used).narrow(1, first, count));
        let out = host_f32(out);
        let out = values(&out);
        let fits = seq - width + 1;
        for b in 0..batch {
            let best = &mut pooled[b * filters + first..][..count];
            let at = &mut argmax[b * filters + first..][..count];
            best.copy_from_slice(&out[b * positions * count..][..count]);
            at.fill(0);
            for p in 1..fits {
                let values = &out[(b * positions + p) * count..][..count];
                for ((best, at), &v) in best.iter_mut().zip(at.iter_mut()).zip(values) {
                    if v > *best {
                        *best = v;
                        *at = p as u32;
                    }
                }
            }
        }
    }
    let pooled = Tensor::from_data(TensorData::new(pooled, [batch, filters]), &device);
    (pooled, Saved { x, weight: host_f32(weight), widths: widths.clone(), argmax })
}

impl Saved {
    /// The gradients of `x` and `weight` from the gradient of the pooled maxima.
    fn backward(self, grad: &[f32]) -> (TensorData, TensorData) {
        let [batch, seq, channels] = self.x.shape[..] else { unreachable!("a 3-D input") };
        let x = values(&self.x);
        let (widest, filters) = (self.widths.widest(), self.widths.filters());
        let row = widest * channels;
        // The weight transposed, `[filters, widest × channels]`, so each filter's kernel is a row.
        let kernels = transposed(values(&self.weight), row, filters);
        let mut grad_x = vec![0f32; batch * seq * channels];
        let mut grad_kernels = vec![0f32; filters * row];
        for (width, count, first) in self.widths.columns() {
            let used = width * channels;
            for b in 0..batch {
                for f in first..first + count {
                    let g = grad[b * filters + f];
                    if g == 0.0 {
                        continue; // ReLU cut it, or nothing depends on it
                    }
                    let start = (b * seq + self.argmax[b * filters + f] as usize) * channels;
                    // The window that won: its inputs get the kernel, the kernel gets the window.
                    add_scaled(&mut grad_kernels[f * row..][..used], g, &x[start..start + used]);
                    add_scaled(&mut grad_x[start..start + used], g, &kernels[f * row..][..used]);
                }
            }
        }
        let grad_weight = transposed(&grad_kernels, filters, row);
        (TensorData::new(grad_x, [batch, seq, channels]), TensorData::new(grad_weight, [row, filters]))
    }
}

/// `into += scale × values`.
fn add_scaled(into: &mut [f32], scale: f32, values: &[f32]) {
    for (into, v) in into.iter_mut().zip(values) {
        *into += scale * v;
    }
}

/// Runs the forward pass on `I` and registers one autodiff node for it.
fn tracked<I: Backend>(
    x: Tensor<Autodiff<I>, 3>,
    weight: Tensor<Autodiff<I>, 2>,
    widths: &Widths,
) -> Tensor<Autodiff<I>, 2> {
    let parents = [x.into_primitive().tensor(), weight.into_primitive().tensor()];
    let output = record_node(ConvMaxBackward, parents, |[x, weight], record| {
        let (pooled, saved) = forward::<I>(
            Tensor::from_primitive(TensorPrimitive::Float(x)),
            Tensor::from_primitive(TensorPrimitive::Float(weight)),
            widths,
        );
        (pooled.into_primitive().tensor(), record.then_some(saved))
    });
    Tensor::from_primitive(TensorPrimitive::Float(output))
}

/// The autodiff node of one [`conv_max`].
#[derive(Debug)]
struct ConvMaxBackward;

impl<I: Backend> Backward<I, 2> for ConvMaxBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = Tensor::<I, 2>::from_primitive(TensorPrimitive::Float(grads.consume::<I>(&ops.node)));
        let device = grad.device();
        let grad = host_f32(grad);
        let (grad_x, grad_weight) = ops.state.backward(values(&grad));
        let [x_node, weight_node] = ops.parents;
        if let Some(node) = x_node {
            grads.register::<I>(node.id, Tensor::<I, 3>::from_data(grad_x, &device).into_primitive().tensor());
        }
        if let Some(node) = weight_node {
            grads.register::<I>(node.id, Tensor::<I, 2>::from_data(grad_weight, &device).into_primitive().tensor());
        }
    }
}
