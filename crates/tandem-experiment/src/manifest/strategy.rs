//! `[strategy]` (or `[[strategies]]`): the strategy kinds a manifest can name, each with its
//! settings; what a kind says of itself is its [`StrategyKind`].

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use tandem_models::{positive, Invalid};
use tandem_parallel::{BuildError, DataParallelConfig, Ingredients, ModelParallelConfig, StrategyKind};
use tandem_sync::{LocalLearningConfig, PredictiveSyncConfig};
use tandem_train::{Sequential, Strategy, TrainConfig};

/// `[strategy]` (or one `[[strategies]]` entry): how training is spread over devices.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum StrategyConfig {
    /// One model on one device.
    Sequential(SequentialConfig),
    /// Replicas on several devices, gradients averaged by all-reduce.
    DataParallel(DataParallelConfig),
    /// The model cut into stages on several devices, run by a pipeline schedule.
    ModelParallel(ModelParallelConfig),
    /// Model parallelism whose stages skip most exchanges, predicting their parameters instead.
    PredictiveSync(PredictiveSyncConfig),
    /// Model parallelism whose stages keep learning between real steps, each on a loss of its
    /// own (auxiliary heads, features replay, activations sent forward only).
    LocalLearning(LocalLearningConfig),
}

impl Default for StrategyConfig {
    fn default() -> Self {
        Self::Sequential(SequentialConfig::default())
    }
}

/// `kind = "sequential"`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SequentialConfig {
    /// Compute threads, overriding `[train] threads` (e.g. the baseline on all cores).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
}

/// `$body` on the settings of whichever kind `$config` is: the one list of the kinds' variants.
macro_rules! on_kind {
    ($config:expr, $settings:ident => $body:expr) => {
        match $config {
            StrategyConfig::Sequential($settings) => $body,
            StrategyConfig::DataParallel($settings) => $body,
            StrategyConfig::ModelParallel($settings) => $body,
            StrategyConfig::PredictiveSync($settings) => $body,
            StrategyConfig::LocalLearning($settings) => $body,
        }
    };
}

impl StrategyConfig {
    /// The kind's own account of itself: name, label, devices, checks.
    pub fn kind(&self) -> &dyn StrategyKind {
        on_kind!(self, settings => settings)
    }

    fn kind_mut(&mut self) -> &mut dyn StrategyKind {
        on_kind!(self, settings => settings)
    }

    /// The strategy these settings describe.
    pub fn build<B: AutodiffBackend>(&self, with: Ingredients<B>) -> Result<Box<dyn Strategy<B>>, BuildError> {
        on_kind!(self, settings => settings.build(with))
    }

    /// Name recorded in results.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Names the run folder: the kind plus what tells two entries of one kind apart.
    pub fn label(&self) -> String {
        self.kind().label()
    }

    /// The training settings a model whose `[train]` is `train` trains with under this strategy
    /// in a job of `ranks` processes (1: a single process).
    pub fn train_for(&self, train: &TrainConfig, ranks: usize) -> TrainConfig {
        self.kind().train_for(train, ranks)
    }

    /// Compute threads per device for a model trained with `train`.
    pub fn threads(&self, train: &TrainConfig) -> usize {
        self.kind().threads().unwrap_or(train.threads)
    }

    /// The stages of a strategy that cuts the model into stages.
    pub fn stages(&self) -> Option<usize> {
        self.kind().model_parallel().map(|(mp, _)| mp.stages)
    }

    /// The model-parallel settings of a strategy that cuts the model into stages.
    pub fn model_parallel_mut(&mut self) -> Option<&mut ModelParallelConfig> {
        self.kind_mut().model_parallel_mut()
    }

    /// Copies of the whole model one process trains.
    pub fn model_copies(&self) -> usize {
        self.kind().model_copies()
    }

    /// How long the strategy's workers (and the processes of a job) wait for each other.
    pub fn timeout(&self) -> std::time::Duration {
        self.kind().timeout()
    }

    /// Number of devices the strategy computes on.
    pub fn num_devices(&self) -> usize {
        self.kind().devices()
    }
}

impl StrategyKind for SequentialConfig {
    fn name(&self) -> &'static str {
        "sequential"
    }

    /// `sequential`, or `sequential-16t` with threads of its own.
    fn label(&self) -> String {
        match self.threads {
            None => "sequential".into(),
            Some(t) => format!("sequential-{t}t"),
        }
    }

    fn validate(&self) -> Result<(), Invalid> {
        self.threads.map_or(Ok(()), |threads| positive("threads", threads))
    }

    fn threads(&self) -> Option<usize> {
        self.threads
    }

    fn spans_ranks(&self) -> bool {
        false
    }

    fn build<B: AutodiffBackend>(&self, with: Ingredients<B>) -> Result<Box<dyn Strategy<B>>, BuildError> {
        let device = with.devices.into_iter().next();
        let device = device.ok_or_else(|| BuildError::Mismatch("a sequential run needs a device".into()))?;
        Ok(Box::new(Sequential::new(with.model, with.train, device)))
    }
}
