//! Predictive synchronisation for model-parallel training over a data stream.
//!
//! In vanilla model parallelism every batch costs a forward and a backward transfer at each stage
//! boundary. Here most steps are *predicted*: each stage advances its parameters by a forecast of
//! its next update, made from its own history of real updates ([`predictor`]), and no tensor
//! crosses a boundary. A [`trigger`] decides, from what each stage sees locally, when a real
//! (synchronised) model-parallel step is due.
//!
//! [`PredictiveSyncConfig::build`] makes the strategy: a [`tandem_parallel::ModelParallel`] whose
//! devices each run a [`PredictivePolicy`]. With a sync on every step it is vanilla model
//! parallelism, exactly.
//!
//! [`LocalLearningConfig::build`] makes the other protocol: stages that keep learning between
//! real steps on losses of their own (auxiliary heads, features replay, activations sent
//! forward only, optionally compressed), each device running a [`LocalPolicy`] and each stage
//! carrying a [`LocalStage`].

pub mod local;
pub mod local_stage;
pub mod policy;
pub mod predictor;
pub mod strategy;
pub mod trigger;

pub use local::{LaterStages, LocalPolicy};
pub use local_stage::LocalStage;
pub use policy::PredictivePolicy;
pub use predictor::{Forecaster, PredictorConfig};
pub use strategy::{LocalLearningConfig, PredictiveSyncConfig};
pub use trigger::{Evidence, Trigger, TriggerConfig};
