//! AdamW on the GPU backends: every parameter's step in one launch per group of parameters
//! (`tandem_ops::adamw_steps`), which also applies global-norm clipping from the squared norm
//! of all gradients, computed on the device in one launch per group of gradients
//! (`tandem_ops::squared_sum`): a step never waits for the device (reading each gradient's
//! norm back, as the CPU backends do, would wait once per parameter).

use std::any::Any;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::record::AdaptorRecord;
use burn::optim::{AdamWState, AdaptiveMomentumState, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use tandem_ops::Floats;

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

/// Whether AdamW runs as GPU kernels on `B` (an inner backend).
pub(super) fn kernel_on<B: Backend>() -> bool {
    tandem_ops::adamw_kernel_on::<B>()
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

/// The sum of every gradient's squared values, on the device: one launch per group of gradients
/// where the backend has the kernel (f32 gradients), else tensor operations.
pub(super) fn squared_norm_on_device<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
) -> Tensor<B::InnerBackend, 1> {
    let mut gradients = Gradients::<B::InnerBackend> { grads, all: Vec::new() };
    module.visit(&mut gradients);
    tandem_ops::squared_sum(gradients.all).unwrap_or_else(|| {
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
    /// The scalars of step `time` (from 1) at learning rate `lr`, clipping at `clip_norm`.
    fn scalars(&self, lr: f64, time: usize, clip_norm: f32) -> tandem_ops::AdamWScalars {
        tandem_ops::AdamWScalars {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            keep: self.keep(lr).unwrap_or(1.0),
            lr: lr as f32,
            time,
            clip_norm,
        }
    }

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
        let scalars = self.scalars(lr, time, clip_norm);
        let [values, moment_1, moment_2] = tandem_ops::adamw_step(&scalars, [tensor, grad, m, v], squared_norm)
            .expect("the caller checked the backend and the dtypes");
        let momentum = AdaptiveMomentumState { time, moment_1, moment_2, max_moment_2: None };
        (values, Some(AdamWState::new(momentum)))
    }
}

/// AdamW's state of every parameter, as Burn's adaptor keeps it.
type States<B> = HashMap<ParamId, AdaptorRecord<HostAdamW, B>>;

/// `module` after one AdamW step of `optimizer` on every parameter with a gradient, clipped by
/// `squared_norm` and `max_norm` (∞: not clipped): the f32 parameters in one launch per group of
/// them (and per step count, which bias-corrects), any other by the adaptor, parameter by
/// parameter.
pub(super) fn step_all<B: AutodiffBackend, M: AutodiffModule<B>>(
    optimizer: &mut OptimizerAdaptor<HostAdamW, M, B>,
    lr: f64,
    module: M,
    mut grads: GradientsParams,
    squared_norm: Tensor<B::InnerBackend, 1>,
    max_norm: f64,
) -> M {
    let adamw = optimizer.optim().clone();
    let mut states: States<B> = optimizer.to_record().into_iter().collect();
    let mut steps = Steps::<B> { grads: &mut grads, states: &mut states, by_time: BTreeMap::new() };
    module.visit(&mut steps);
    let mut results = HashMap::new();
    for (time, Group { ids, tensors }) in std::mem::take(&mut steps.by_time) {
        let scalars = adamw.scalars(lr, time, max_norm as f32);
        let stepped = tandem_ops::adamw_steps(&scalars, tensors, squared_norm.clone())
            .expect("the caller checked the backend, the visitor the dtypes");
        results.extend(ids.into_iter().zip(stepped.into_iter().map(|three| (time, three))));
    }
    let module = module.map(&mut Stepped::<B> { results, states: &mut states });
    *optimizer = optimizer.clone().load_record(states.into_iter().collect());
    with_clipping(squared_norm, max_norm, || optimizer.step(lr, module, grads))
}

/// Takes the f32 parameters' gradients and states for [`step_all`], grouped by step count.
struct Steps<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    states: &'a mut States<B>,
    /// The parameters by the step count after this step.
    by_time: BTreeMap<usize, Group<B::InnerBackend>>,
}

/// Parameters stepped in one launch (or one per group of them).
struct Group<I: Backend> {
    ids: Vec<ParamId>,
    /// `[param, grad, moment 1, moment 2]` of each parameter.
    tensors: Vec<Floats<I, 4>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Steps<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let values = param.val().inner();
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else { return };
        let state = self.states.remove(&param.id).map(|record| record.into_state::<D>());
        let f32s = |tensors: &[&Tensor<B::InnerBackend, D>]| tensors.iter().all(|t| t.dtype() == DType::F32);
        let eligible = values.device() == grad.device()
            && f32s(&[&values, &grad])
            && state.as_ref().is_none_or(|s| {
                f32s(&[&s.momentum.moment_1, &s.momentum.moment_2]) && s.momentum.max_moment_2.is_none()
            });
        if !eligible {
            // Left to the adaptor.
            self.grads.register(param.id, grad);
            if let Some(state) = state {
                self.states.insert(param.id, AdaptorRecord::from_state(state));
            }
            return;
        }
        let (moment_1, moment_2, time) = match state {
            Some(s) => (s.momentum.moment_1, s.momentum.moment_2, s.momentum.time + 1),
            None => (values.zeros_like(), values.zeros_like(), 1),
        };
        let four = [values, grad, moment_1, moment_2].map(|t| t.into_primitive().tensor());
        let group = self.by_time.entry(time).or_insert_with(|| Group { ids: Vec::new(), tensors: Vec::new() });
        group.ids.push(param.id);
        group.tensors.push(four);
    }
}

/// Puts the stepped parameters into the module and their states into the records.
struct Stepped<'a, B: AutodiffBackend> {
    /// The step count and `[param, moment 1, moment 2]` after the step, by parameter.
    results: HashMap<ParamId, (usize, Floats<B::InnerBackend, 3>)>,
    states: &'a mut States<B>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Stepped<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some((time, [values, moment_1, moment_2])) = self.results.remove(&param.id) else { return param };
        let float = |primitive| Tensor::<B::InnerBackend, D>::from_primitive(TensorPrimitive::Float(primitive));
        let momentum =
            AdaptiveMomentumState { time, moment_1: float(moment_1), moment_2: float(moment_2), max_moment_2: None };
        self.states.insert(param.id, AdaptorRecord::from_state(AdamWState::new(momentum)));
        let (id, tensor, mapper) = param.consume();
        let mut stepped = Tensor::from_inner(float(values));
        if tensor.is_require_grad() {
            stepped = stepped.require_grad();
        }
        Param::from_mapped_value(id, stepped, mapper)
    }
}
