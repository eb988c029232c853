//! A run on a concrete backend, set up: the memory check, the model initialised and the
//! strategy built around it on its devices (restored, for a resumed run).

use burn::tensor::backend::AutodiffBackend;
use tandem_models::{Classifier, InputSpec};
use tandem_parallel::Ingredients;
use tandem_train::Strategy;

use super::context::RunContext;

/// A run ready to train on backend `B`.
pub(super) struct Setup<B: AutodiffBackend> {
    pub strategy: Box<dyn Strategy<B>>,
    /// Where the model is evaluated: the first replica's or stage's device.
    pub device: B::Device,
    pub parameters: usize,
    /// Several replicas or stages on one GPU.
    pub shared_devices: bool,
}

/// Why a run could not be set up, with what was known by then.
pub(super) struct SetUpFailure {
    pub error: String,
    pub parameters: usize,
    pub shared_devices: bool,
}

/// Checks the memory, initialises the model and builds the strategy on `devices` (one per
/// replica or stage, started, `distinct` of them different; `cpu`: one device every replica or
/// stage shares, one core each), restoring a resumed run's state.
pub(super) fn set_up<B: AutodiffBackend>(
    devices: Vec<B::Device>,
    cpu: bool,
    distinct: usize,
    ctx: &RunContext,
) -> Result<Setup<B>, SetUpFailure> {
    let shared_devices = !cpu && distinct < devices.len();
    let mut failure = SetUpFailure { error: String::new(), parameters: 0, shared_devices };
    if shared_devices {
        eprintln!(
            "note: {} replicas or stages share {distinct} GPU(s): a correctness check, not a speedup measurement",
            devices.len()
        );
    }
    let device = devices[0].clone();
    let input = InputSpec {
        vocab_size: ctx.data.vocab.len(),
        max_len: ctx.data.train.max_len,
        num_classes: tandem_data::NUM_CLASSES,
    };
    crate::memory::check_fits_in_ram(cpu, &ctx.entry.config, &input, ctx.strategy.model_copies())
        .map_err(|error| SetUpFailure { error, ..failure })?;
    tandem_train::seed_backend::<B>(&device, ctx.seed);
    let model: Classifier<B> = tandem_train::number_parameters(ctx.entry.config.init(&input, &device));
    failure.parameters = model.parameter_count();
    let fail = |error: String| SetUpFailure { error, parameters: failure.parameters, shared_devices };
    let mut strategy = build_strategy(model, devices, ctx).map_err(fail)?;
    if let Some(checkpoint) = ctx.resume {
        strategy.restore(&checkpoint.strategy).map_err(|e| fail(format!("cannot resume: {e}")))?;
    }
    Ok(Setup { strategy, device, parameters: failure.parameters, shared_devices })
}

/// The run's strategy around `model`, on `devices`; a resumed run's model cut where the
/// interrupted one's was.
fn build_strategy<B: AutodiffBackend>(
    model: Classifier<B>,
    devices: Vec<B::Device>,
    ctx: &RunContext,
) -> Result<Box<dyn Strategy<B>>, String> {
    let mut config = ctx.strategy.clone();
    if let (Some(mp), Some(checkpoint)) = (config.model_parallel_mut(), ctx.resume) {
        if let Some(cuts) =
            tandem_parallel::checkpoint_cuts(&checkpoint.strategy).map_err(|e| format!("cannot resume: {e}"))?
        {
            mp.cuts = Some(cuts);
        }
    }
    config
        .build(Ingredients { model, train: &ctx.train, devices, data: &ctx.data.train, ranks: ctx.ranks })
        .map_err(|e| e.to_string())
}
