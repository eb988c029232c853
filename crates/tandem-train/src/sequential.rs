//! The baseline strategy: one model on one device.

use burn::tensor::backend::AutodiffBackend;
use tandem_models::Classifier;

use crate::checkpoint::{load_model_bytes, model_bytes};
use crate::optim::AnyOptimizer;
use crate::{tested_gradients, EpochPlan, Strategy, StrategyFigures, Tally, TrainConfig, TrainError, TrainStats};
use crate::{StateError, StateParts};

/// Trains one model on one device, one global batch per optimizer step.
pub struct Sequential<B: AutodiffBackend> {
    model: Option<Classifier<B>>,
    optimizer: AnyOptimizer<Classifier<B>, B>,
    config: TrainConfig,
    device: B::Device,
}

impl<B: AutodiffBackend> Sequential<B> {
    /// Takes ownership of `model`, which must live on `device`.
    pub fn new(model: Classifier<B>, config: &TrainConfig, device: B::Device) -> Self {
        let optimizer = AnyOptimizer::for_model(config, &model);
        Self { model: Some(model), optimizer, config: config.clone(), device }
    }
}

impl<B: AutodiffBackend> Strategy<B> for Sequential<B> {
    fn name(&self) -> &str {
        "sequential"
    }

    fn devices(&self) -> Vec<String> {
        vec![format!("{:?}", self.device)]
    }

    fn train_epoch(&mut self, plan: &EpochPlan) -> Result<TrainStats, TrainError> {
        let mut model = self.model.take().expect("the model is always put back after a step");
        let mut tally = Tally::default();
        let (mut samples, mut steps) = (0, 0);
        for (i, indices) in plan.batches.iter().enumerate() {
            if (plan.interrupt)() {
                break;
            }
            tandem_ops::dropout::begin_step(plan.rng_seed, 0, plan.first_step + i);
            let batch = plan.data.batch::<B>(indices, &self.device);
            let (measured, grads) = tested_gradients(&model, batch);
            tally.add(measured, indices.len());
            model = self.optimizer.update(&self.config, model, grads, plan.first_step + i, plan.total_steps);
            samples += indices.len();
            (plan.on_batch)(indices.len());
            steps += 1;
        }
        self.model = Some(model);
        let (loss_sum, correct) = tally.read();
        Ok(TrainStats { loss_sum, samples, steps, tested: samples, correct, figures: StrategyFigures::Sequential })
    }

    fn model(&self) -> Classifier<B> {
        self.model.clone().expect("the model is always put back after a step")
    }

    fn state(&self) -> Result<StateParts, StateError> {
        let mut state = StateParts::default();
        state.put("model", model_bytes(&self.model())?);
        state.put("optimizer", self.optimizer.state()?.to_bytes());
        Ok(state)
    }

    fn restore(&mut self, state: &StateParts) -> Result<(), StateError> {
        self.model = Some(load_model_bytes(self.model(), state.get("model")?, &self.device)?);
        self.optimizer.restore(&StateParts::from_bytes(state.get("optimizer")?)?, &self.device)
    }
}
