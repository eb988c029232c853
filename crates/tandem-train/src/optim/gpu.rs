//! AdamW on the GPU backends: one kernel per parameter (`tandem_models::adamw_step`), which also
//! applies global-norm clipping from the squared norm of all gradients, computed on the device in
//! one launch per gradient (`tandem_models::squared_sum`): a step never waits for the device
//! (reading each gradient's norm back, as the CPU backends do, would wait once per parameter).

use std::any::Any;
use std::cell::RefCell;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::{AdamWState, AdaptiveMomentumState, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::Tensor;

use super::HostAdamW;

/// Global-norm clipping of one optimizer step: the squared norm of all its gradients (a
/// `Tensor<B, 1>` of the step's backend) and the bound (∞: no clipping).
struct Clip {
    squared_norm: Box<dyn Any>,
    max_norm: f32,
}

thread_local! {
    /// The clipping the AdamW steps running on this thread apply: set by [`with_clipping`] around
    /// one optimizer step.
    static CLIP: RefCell<Option<Clip>> = const { RefCell::new(None) };
}

/// Whether AdamW runs as one kernel per parameter on `B` (an inner backend).
pub(super) fn kernel_on<B: Backend>() -> bool {
    tandem_models::adamw_kernel_on::<B>()
}

/// Runs `step` with every gradient of its AdamW steps on this thread clipped to `max_norm` (∞:
/// not clipped) by the norm whose square is `squared_norm`.
pub(super) fn with_clipping<B: Backend, T>(squared_norm: Tensor<B, 1>, max_norm: f64, step: impl FnOnce() -> T) -> T {
    /// Clears the clipping when the step ends, panicking or not.
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            CLIP.with(|c| c.borrow_mut().take());
        }
    }
    CLIP.with(|c| *c.borrow_mut() = Some(Clip { squared_norm: Box::new(squared_norm), max_norm: max_norm as f32 }));
    let _clear = Clear;
    step()
}

/// The clipping set by [`with_clipping`] for `B`, if one is set: `‖g‖²` and the bound.
fn clipping<B: Backend>() -> Option<(Tensor<B, 1>, f32)> {
    CLIP.with(|c| {
        let clip = c.borrow();
        let clip = clip.as_ref()?;
        Some((clip.squared_norm.downcast_ref::<Tensor<B, 1>>()?.clone(), clip.max_norm))
    })
}

/// 0, on the device of `module`'s parameters: the squared norm a step without clipping passes.
pub(super) fn zero<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) -> Tensor<B::InnerBackend, 1> {
    let device = module.devices().into_iter().next().unwrap_or_default();
    Tensor::zeros([1], &device)
}

/// The sum of every gradient's squared values, on the device: one launch per gradient where the
/// backend has the kernel (f32 gradients), else tensor operations.
pub(super) fn squared_norm_on_device<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
) -> Tensor<B::InnerBackend, 1> {
    let mut gradients = Gradients::<B::InnerBackend> { grads, all: Vec::new() };
    module.visit(&mut gradients);
    tandem_models::squared_sum(gradients.all).unwrap_or_else(|| {
        let mut squares = SquaredSum::<B::InnerBackend> { grads, total: None };
        module.visit(&mut squares);
        squares.total.unwrap_or_else(|| zero(module))
    })
}

/// Every gradient of a module, as float primitives (of any rank).
struct Gradients<'a, I: Backend> {
    grads: &'a GradientsParams,
    all: Vec<FloatTensor<I>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Gradients<'_, B::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            self.all.push(g.into_primitive().tensor());
        }
    }
}

/// The sum of every gradient's squared values as tensor operations.
struct SquaredSum<'a, I: Backend> {
    grads: &'a GradientsParams,
    total: Option<Tensor<I, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredSum<'_, B::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let squares = g.square().sum();
            self.total = Some(match self.total.take() {
                Some(total) => total + squares,
                None => squares,
            });
        }
    }
}

impl HostAdamW {
    /// The step as one GPU kernel (f32 values and state, checked by the caller), the gradient
    /// clipped as [`with_clipping`] says (not clipped without it).
    pub(super) fn gpu_step<B: Backend, const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<AdamWState<B, D>>,
    ) -> (Tensor<B, D>, Option<AdamWState<B, D>>) {
        let (squared_norm, clip_norm) =
            clipping::<B>().unwrap_or_else(|| (Tensor::zeros([1], &tensor.device()), f32::INFINITY));
        let (m, v, time) = match state {
            Some(s) => (s.momentum.moment_1, s.momentum.moment_2, s.momentum.time + 1),
            None => (tensor.zeros_like(), tensor.zeros_like(), 1),
        };
        let scalars = tandem_models::AdamWScalars {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            keep: self.keep(lr).unwrap_or(1.0),
            lr: lr as f32,
            time,
            clip_norm,
        };
        let [values, moment_1, moment_2] = tandem_models::adamw_step(&scalars, [tensor, grad, m, v], squared_norm)
            .expect("the caller checked the backend and the dtypes");
        let momentum = AdaptiveMomentumState { time, moment_1, moment_2, max_moment_2: None };
        (values, Some(AdamWState::new(momentum)))
    }
}
