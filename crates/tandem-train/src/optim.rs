//! Optimizers, learning-rate schedules and global-norm gradient clipping.

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::{
    Adam, AdamConfig, AdamState, AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, GradientsParams, Optimizer,
    SimpleOptimizer,
};
use burn::tensor::backend::{AutodiffBackend, Backend};

use burn::tensor::{DType, ElementConversion, IndexingUpdateOp, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use tandem_models::Classifier;
use tandem_simd::Kernel;

use crate::TrainConfig;

mod gpu;

mod state;

/// Which optimizer to use.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// Adam with L2 weight decay added to the gradient.
    Adam,
    /// Adam with decoupled weight decay (Loshchilov & Hutter).
    Adamw,
}

/// How Adam / AdamW update the token-embedding table.
///
/// A batch touches a few thousand of the table's rows; the others get a zero gradient. Exact
/// (`dense`) Adam still decays every row's moments and moves every row whose moments are non-zero,
/// which costs a pass over the whole table each step. `lazy` (TensorFlow's LazyAdam, PyTorch's
/// SparseAdam) updates only the rows with a non-zero gradient: an untouched row keeps its value
/// and moments, weight decay included, and the bias correction uses the global step count. It
/// equals dense Adam on rows that are touched at every step, and differs elsewhere.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum EmbeddingUpdate {
    Dense,
    Lazy,
}

/// How the learning rate evolves after the linear warm-up.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LrSchedule {
    Constant,
    /// Linear decay to `min_lr_fraction × learning_rate` at the last step.
    Linear,
    /// Cosine decay to `min_lr_fraction × learning_rate` at the last step.
    Cosine,
}

/// Learning rate at optimizer step `step` (0-based) of `total_steps`.
pub fn learning_rate(config: &TrainConfig, step: usize, total_steps: usize) -> f64 {
    let peak = config.learning_rate;
    if step < config.warmup_steps {
        return peak * (step + 1) as f64 / config.warmup_steps as f64;
    }
    let decay_steps = total_steps.saturating_sub(config.warmup_steps).max(1);
    let progress = ((step - config.warmup_steps) as f64 / decay_steps as f64).min(1.0);
    let floor = peak * config.min_lr_fraction;
    match config.lr_schedule {
        LrSchedule::Constant => peak,
        LrSchedule::Linear => floor + (peak - floor) * (1.0 - progress),
        LrSchedule::Cosine => floor + (peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
    }
}

/// Adam or AdamW over a module `M`, chosen at run time; optionally lazy on one embedding table.
#[derive(Clone)]
pub struct AnyOptimizer<M: AutodiffModule<B>, B: AutodiffBackend> {
    whole: Whole<M, B>,
    lazy: Option<LazyRows<B::InnerBackend>>,
}

#[derive(Clone)]
enum Whole<M: AutodiffModule<B>, B: AutodiffBackend> {
    Adam(OptimizerAdaptor<Adam, M, B>),
    AdamW(OptimizerAdaptor<HostAdamW, M, B>),
}

fn adam_config(config: &TrainConfig) -> AdamConfig {
    AdamConfig::new()
        .with_beta_1(config.beta1 as f32)
        .with_beta_2(config.beta2 as f32)
        .with_epsilon(config.epsilon as f32)
        .with_weight_decay((config.weight_decay > 0.0).then(|| WeightDecayConfig::new(config.weight_decay as f32)))
}

/// Burn's AdamW configured from `config` (betas, epsilon, weight decay).
pub fn adamw_config(config: &TrainConfig) -> AdamWConfig {
    AdamWConfig::new()
        .with_beta_1(config.beta1 as f32)
        .with_beta_2(config.beta2 as f32)
        .with_epsilon(config.epsilon as f32)
        .with_weight_decay(config.weight_decay as f32)
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> AnyOptimizer<M, B> {
    /// Builds the optimizer the training config asks for, dense on every parameter (clipping
    /// is done separately, globally). [`AnyOptimizer::for_model`] honours `embedding_update`.
    pub fn new(config: &TrainConfig) -> Self {
        let whole = match config.optimizer {
            OptimizerKind::Adam => Whole::Adam(adam_config(config).init()),
            OptimizerKind::Adamw => Whole::AdamW(OptimizerAdaptor::from(HostAdamW::new(config))),
        };
        Self { whole, lazy: None }
    }

    /// Whether the step runs AdamW's GPU kernel on every parameter, which takes the gradients'
    /// squared norm as a device value: the update then never waits for the device.
    fn on_gpu(&self) -> bool {
        matches!(self.whole, Whole::AdamW(_)) && self.lazy.is_none() && gpu::kernel_on::<B::InnerBackend>()
    }

    /// One optimizer step with learning rate `lr`.
    pub fn step(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        self.step_clipped(lr, module, grads, None)
    }

    /// [`Self::step`], on GPU backends with the gradients clipped inside AdamW's kernel by
    /// `clip`: their squared norm (a device value) and the bound (`None`: not clipped).
    fn step_clipped(
        &mut self,
        lr: f64,
        module: M,
        grads: GradientsParams,
        clip: Option<(Tensor<B::InnerBackend, 1>, f64)>,
    ) -> M {
        let on_gpu = self.on_gpu();
        match &mut self.whole {
            Whole::AdamW(adamw) if on_gpu => {
                let (squared_norm, max_norm) = clip.unwrap_or_else(|| (gpu::zero(&module), f64::INFINITY));
                gpu::step_all(adamw, lr, module, grads, squared_norm, max_norm)
            }
            _ => self.step_unscaled(lr, module, grads),
        }
    }

    /// [`Self::step`] with the gradients as they are.
    fn step_unscaled(&mut self, lr: f64, module: M, mut grads: GradientsParams) -> M {
        let module = match &mut self.lazy {
            Some(lazy) => match grads.remove::<B::InnerBackend, 2>(lazy.id) {
                Some(grad) => module.map(&mut LazyStep { rows: lazy, grad: Some(grad), lr }),
                None => module,
            },
            None => module,
        };
        match &mut self.whole {
            Whole::Adam(o) => o.step(lr, module, grads),
            Whole::AdamW(o) => o.step(lr, module, grads),
        }
    }

    /// The update every strategy applies once its gradients are final: clip their global norm
    /// (if `config` asks for it), then step with the learning rate of optimizer step `step` of
    /// `total_steps`.
    pub fn update(
        &mut self,
        config: &TrainConfig,
        module: M,
        mut grads: GradientsParams,
        step: usize,
        total_steps: usize,
    ) -> M {
        let lr = learning_rate(config, step, total_steps);
        match config.grad_clip_norm {
            Some(max_norm) if self.on_gpu() => {
                let squared_norm = gpu::squared_norm_on_device(&module, &grads);
                self.step_clipped(lr, module, grads, Some((squared_norm, max_norm)))
            }
            Some(max_norm) => {
                clip_gradient_norm(&module, &mut grads, max_norm);
                self.step(lr, module, grads)
            }
            None => self.step(lr, module, grads),
        }
    }
}

impl<B: AutodiffBackend> AnyOptimizer<Classifier<B>, B> {
    /// [`AnyOptimizer::new`], lazy on `model`'s token-embedding table when the config asks for
    /// it (and the model, or stage, holds that table).
    pub fn for_model(config: &TrainConfig, model: &Classifier<B>) -> Self {
        let mut optimizer = Self::new(config);
        if config.embedding_update == EmbeddingUpdate::Lazy {
            optimizer.lazy = model.token_embedding_id().map(|id| LazyRows::new(id, config));
        }
        optimizer
    }
}

/// Burn's AdamW (the same state, so the same records), whose step runs as **one pass** over the
/// values on the CPU backends (Flex, ndarray; f32) and on the GPU backends as **one kernel** for
/// all parameters (`tandem_ops::adamw_steps`, through `AnyOptimizer`; one per parameter when
/// Burn's adaptor steps it alone). Burn runs it as about fifteen tensor operations, each
/// a pass over the whole parameter that allocates its result: over a 2.56M-value embedding table
/// that was a third of a CNN training step on Flex, and on a GPU fifteen kernel launches per
/// parameter. Same arithmetic, element by element and in the same order, so the same results;
/// other backends run Burn's.
#[derive(Clone)]
pub struct HostAdamW {
    burn: AdamW,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
}

impl HostAdamW {
    /// AdamW with `config`'s betas, epsilon and weight decay.
    pub fn new(config: &TrainConfig) -> Self {
        Self {
            burn: adamw_config(config).build(),
            beta_1: config.beta1 as f32,
            beta_2: config.beta2 as f32,
            epsilon: config.epsilon as f32,
            weight_decay: config.weight_decay as f32,
        }
    }

    /// Whether the step runs as one pass on `B` (for f32 values; otherwise Burn's step runs).
    pub fn one_pass_on<B: Backend>() -> bool {
        tandem_ops::on_cpu::<B>()
    }

    /// Burn's weight-decay factor `1 − lr · decay` (computed in f64, used as f32), `None` without
    /// decay (the values are then not multiplied at all).
    pub(crate) fn keep(&self, lr: f64) -> Option<f32> {
        let decay_rate = lr * f64::from(self.weight_decay);
        (decay_rate != 0.0).then_some((1.0 - decay_rate) as f32)
    }
}

/// One AdamW step over a parameter's values and moments, with Burn's scalars.
struct AdamWStep<'a> {
    betas: (f32, f32),
    /// `1 − β₁`, `1 − β₂`.
    factors: (f32, f32),
    /// `1 − β₁ᵗ`, `1 − β₂ᵗ`.
    corrections: (f32, f32),
    epsilon: f32,
    /// `1 − lr · decay`, without weight decay `None` (the values are then not multiplied at all).
    keep: Option<f32>,
    lr: f32,
    values: &'a mut [f32],
    m: &'a mut [f32],
    v: &'a mut [f32],
    grad: &'a [f32],
}

/// Run by [`tandem_simd::run`]: compiled for wide vectors where the CPU has them.
impl Kernel for AdamWStep<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let ((beta_1, beta_2), (factor_1, factor_2), (correction_1, correction_2)) =
            (self.betas, self.factors, self.corrections);
        for (((p, m), v), &g) in self.values.iter_mut().zip(self.m.iter_mut()).zip(self.v.iter_mut()).zip(self.grad) {
            *m = *m * beta_1 + g * factor_1;
            *v = *v * beta_2 + g * g * factor_2;
            let delta = (*m / correction_1) / ((*v / correction_2).sqrt() + self.epsilon);
            let decayed = match self.keep {
                Some(keep) => *p * keep,
                None => *p,
            };
            *p = decayed - delta * self.lr;
        }
    }
}

impl<B: Backend> SimpleOptimizer<B> for HostAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<AdamWState<B, D>>,
    ) -> (Tensor<B, D>, Option<AdamWState<B, D>>) {
        let f32_state = state.as_ref().is_none_or(|s| {
            s.momentum.moment_1.dtype() == DType::F32
                && s.momentum.moment_2.dtype() == DType::F32
                && s.momentum.max_moment_2.is_none()
        });
        let f32_values = f32_state && tensor.dtype() == DType::F32 && grad.dtype() == DType::F32;
        if f32_values && gpu::kernel_on::<B>() {
            return self.gpu_step(lr, tensor, grad, state);
        }
        if !(Self::one_pass_on::<B>() && f32_values) {
            return self.burn.step(lr, tensor, grad, state);
        }
        let (device, shape) = (tensor.device(), tensor.shape());
        let mut values = tensor.into_data();
        let grad = grad.into_data();
        let (mut m, mut v, time) = match state {
            Some(s) => (s.momentum.moment_1.into_data(), s.momentum.moment_2.into_data(), s.momentum.time + 1),
            None => (TensorData::zeros::<f32, _>(shape.clone()), TensorData::zeros::<f32, _>(shape.clone()), 1),
        };
        // Burn's scalars: `1 − β`, the bias corrections, and the f64 decay factor and learning rate as f32.
        let f32s = "checked above: f32";
        tandem_simd::run(AdamWStep {
            betas: (self.beta_1, self.beta_2),
            factors: (1.0 - self.beta_1, 1.0 - self.beta_2),
            corrections: (1f32 - self.beta_1.powi(time as i32), 1f32 - self.beta_2.powi(time as i32)),
            epsilon: self.epsilon,
            keep: self.keep(lr),
            lr: lr as f32,
            values: values.as_mut_slice::<f32>().expect(f32s),
            m: m.as_mut_slice::<f32>().expect(f32s),
            v: v.as_mut_slice::<f32>().expect(f32s),
            grad: grad.as_slice::<f32>().expect(f32s),
        });
        let tensor = |data: TensorData| Tensor::<B, D>::from_data(data, &device);
        let momentum = AdaptiveMomentumState { time, moment_1: tensor(m), moment_2: tensor(v), max_moment_2: None };
        (tensor(values), Some(AdamWState::new(momentum)))
    }

    fn to_device<const D: usize>(state: AdamWState<B, D>, device: &B::Device) -> AdamWState<B, D> {
        <AdamW as SimpleOptimizer<B>>::to_device(state, device)
    }
}

/// Adam / AdamW state of one 2-D table, updated only on the rows a step's gradient touches.
#[derive(Clone)]
struct LazyRows<B: Backend> {
    id: ParamId,
    rule: LazyRule,
    /// First and second moments of every row (zeros before the first step).
    moments: Option<(Tensor<B, 2>, Tensor<B, 2>)>,
    /// Steps taken (the bias correction's global step count).
    time: usize,
}

/// Burn's own Adam / AdamW, applied to the touched rows only.
#[derive(Clone)]
enum LazyRule {
    Adam(Adam),
    AdamW(AdamW),
}

impl<B: Backend> LazyRows<B> {
    fn new(id: ParamId, config: &TrainConfig) -> Self {
        let rule = match config.optimizer {
            OptimizerKind::Adam => LazyRule::Adam(adam_config(config).build()),
            OptimizerKind::Adamw => LazyRule::AdamW(adamw_config(config).build()),
        };
        Self { id, rule, moments: None, time: 0 }
    }

    /// `table` after one step with `grad`, on the rows where `grad` is non-zero.
    fn step(&mut self, lr: f64, table: Tensor<B, 2>, grad: Tensor<B, 2>) -> Tensor<B, 2> {
        let (m, v) = self.moments.take().unwrap_or_else(|| (table.zeros_like(), table.zeros_like()));
        let rows: Tensor<B, 1, Int> =
            grad.clone().abs().sum_dim(1).squeeze_dim::<1>(1).greater_elem(0.0).argwhere().squeeze_dim(1);
        if rows.dims()[0] == 0 {
            self.moments = Some((m, v));
            self.time += 1;
            return table;
        }
        let pick = |t: &Tensor<B, 2>| t.clone().select(0, rows.clone());
        let (old_rows, old_m, old_v) = (pick(&table), pick(&m), pick(&v));
        let momentum = AdaptiveMomentumState {
            time: self.time,
            moment_1: old_m.clone(),
            moment_2: old_v.clone(),
            max_moment_2: None,
        };
        let (new_rows, momentum) = match &self.rule {
            LazyRule::Adam(o) => {
                let (rows, state) = o.step(lr, old_rows.clone(), pick(&grad), Some(AdamState::new(momentum)));
                (rows, state.expect("Adam keeps a state").momentum)
            }
            LazyRule::AdamW(o) => {
                let (rows, state) = o.step(lr, old_rows.clone(), pick(&grad), Some(AdamWState::new(momentum)));
                (rows, state.expect("AdamW keeps a state").momentum)
            }
        };
        // Written back as increments: `select_assign` adds on every backend.
        let update = |t: Tensor<B, 2>, new: Tensor<B, 2>, old: Tensor<B, 2>| {
            t.select_assign(0, rows.clone(), new - old, IndexingUpdateOp::Add)
        };
        self.moments = Some((update(m, momentum.moment_1, old_m), update(v, momentum.moment_2, old_v)));
        self.time = momentum.time;
        update(table, new_rows, old_rows)
    }
}

/// Applies a [`LazyRows`] step to the one parameter it owns.
struct LazyStep<'a, B: AutodiffBackend> {
    rows: &'a mut LazyRows<B::InnerBackend>,
    grad: Option<Tensor<B::InnerBackend, 2>>,
    lr: f64,
}

impl<B: AutodiffBackend> ModuleMapper<B> for LazyStep<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if param.id != self.rows.id || D != 2 {
            return param;
        }
        let Some(grad) = self.grad.take() else { return param };
        param.map(|tensor| {
            let dims = tensor.dims();
            let table = tensor.inner().reshape([dims[0], dims[1]]);
            let updated = self.rows.step(self.lr, table, grad);
            Tensor::from_inner(updated.reshape(dims)).require_grad()
        })
    }
}

/// Sums the squared L2 norms of the gradients of a module's parameters.
struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    total: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            self.total += tandem_ops::squared_sum_without_copy(&g)
                .unwrap_or_else(|| g.square().sum().into_scalar().elem::<f64>());
        }
    }
}

/// Multiplies every gradient of a module's parameters by a factor.
struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads.register::<B::InnerBackend, D>(param.id, g.mul_scalar(self.factor));
        }
    }
}

/// Global L2 norm of all of `module`'s gradients (as PyTorch's `clip_grad_norm_` measures it).
pub fn gradient_norm<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M, grads: &GradientsParams) -> f64 {
    let mut visitor = SquaredNorm { grads, total: 0.0 };
    module.visit(&mut visitor);
    visitor.total.sqrt()
}

/// Multiplies all of `module`'s gradients by `factor`.
pub fn scale_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M, grads: &mut GradientsParams, factor: f64) {
    module.visit(&mut Scale { grads, factor });
}

/// Rescales the gradients so their global norm is at most `max_norm`; returns the norm before clipping.
pub fn clip_gradient_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> f64 {
    let norm = gradient_norm(module, grads);
    let factor = clip_factor(norm, max_norm);
    if factor != 1.0 {
        scale_gradients(module, grads, factor);
    }
    norm
}

/// The factor that brings gradients of global norm `norm` down to at most `max_norm`
/// (1 when they are already within it).
pub fn clip_factor(norm: f64, max_norm: f64) -> f64 {
    if norm > max_norm {
        max_norm / (norm + 1e-6)
    } else {
        1.0
    }
}
