//! Optimizers, learning-rate schedules and global-norm gradient clipping.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::{Adam, AdamConfig, AdamW, AdamWConfig, GradientsParams, Optimizer, adaptor::OptimizerAdaptor};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use serde::{Deserialize, Serialize};

use crate::TrainConfig;

/// Which optimizer to use.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// Adam with L2 weight decay added to the gradient.
    Adam,
    /// Adam with decoupled weight decay (Loshchilov & Hutter).
    Adamw,
}

/// How the learning rate evolves after the linear warm-up.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
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

/// Adam or AdamW over a module `M`, chosen at run time.
#[derive(Clone)]
pub enum AnyOptimizer<M: AutodiffModule<B>, B: AutodiffBackend> {
    Adam(OptimizerAdaptor<Adam, M, B>),
    AdamW(OptimizerAdaptor<AdamW, M, B>),
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> AnyOptimizer<M, B> {
    /// Builds the optimizer the training config asks for (clipping is done separately, globally).
    pub fn new(config: &TrainConfig) -> Self {
        let (b1, b2, eps) = (config.beta1 as f32, config.beta2 as f32, config.epsilon as f32);
        match config.optimizer {
            OptimizerKind::Adam => Self::Adam(
                AdamConfig::new()
                    .with_beta_1(b1)
                    .with_beta_2(b2)
                    .with_epsilon(eps)
                    .with_weight_decay((config.weight_decay > 0.0).then(|| WeightDecayConfig::new(config.weight_decay as f32)))
                    .init(),
            ),
            OptimizerKind::Adamw => Self::AdamW(
                AdamWConfig::new()
                    .with_beta_1(b1)
                    .with_beta_2(b2)
                    .with_epsilon(eps)
                    .with_weight_decay(config.weight_decay as f32)
                    .init(),
            ),
        }
    }

    /// One optimizer step with learning rate `lr`.
    pub fn step(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        match self {
            Self::Adam(o) => o.step(lr, module, grads),
            Self::AdamW(o) => o.step(lr, module, grads),
        }
    }

    /// The update every strategy applies once its gradients are final: clip their global norm
    /// (if `config` asks for it), then step with the learning rate of optimizer step `step` of
    /// `total_steps`.
    pub fn update(&mut self, config: &TrainConfig, module: M, mut grads: GradientsParams, step: usize, total_steps: usize) -> M {
        if let Some(max_norm) = config.grad_clip_norm {
            clip_gradient_norm(&module, &mut grads, max_norm);
        }
        self.step(learning_rate(config, step, total_steps), module, grads)
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
            self.total += g.square().sum().into_scalar().elem::<f64>();
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
    if norm > max_norm { max_norm / (norm + 1e-6) } else { 1.0 }
}
