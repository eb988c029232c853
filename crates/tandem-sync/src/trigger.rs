//! When the next synchronised step is due. Each stage evaluates its trigger on what it can see
//! locally (its own prediction error, drift and forecast uncertainty, the loss at sync steps);
//! a sync happens for all stages when any stage asks for one (for `safe-zone`, that costs the
//! asking stage one small alert message).

use serde::{Deserialize, Serialize};
use tandem_models::Invalid;

/// `[strategy.trigger]`: when a predictive-sync run really synchronises its stages.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum TriggerConfig {
    /// A sync step every `every` steps (1: every step, which is vanilla model parallelism).
    Periodic {
        /// Steps from one sync step to the next.
        #[schemars(range(min = 1))]
        every: usize,
    },
    /// The number of predicted steps between syncs (the horizon) doubles while the relative
    /// prediction error measured at a sync, ‖Δ̂ − Δ‖ / ‖Δ‖, stays under `low`, halves when it
    /// exceeds `high` or the loss rose, within [1, `max_horizon`].
    Adaptive {
        /// Relative prediction error under which the horizon doubles.
        #[serde(default = "low")]
        low: f64,
        /// Relative prediction error over which the horizon halves.
        #[serde(default = "high")]
        high: f64,
        /// Most predicted steps between two syncs.
        #[serde(default = "max_horizon")]
        #[schemars(range(min = 1))]
        max_horizon: usize,
    },
    /// Geometric monitoring: a stage raises an alert when its drift since the last sync,
    /// ‖θ − θ_sync‖, or its predictor's forecast standard deviation (norm over its elements)
    /// exceeds the threshold: `threshold`, or, when absent, `auto_factor` × the mean norm of
    /// the real updates seen so far.
    SafeZone {
        /// Drift (parameter-norm distance) that raises an alert (unset: from `auto_factor`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        threshold: Option<f64>,
        /// Without `threshold`: alert when the drift exceeds this many mean real-update norms.
        #[serde(default = "auto_factor")]
        auto_factor: f64,
        /// Most predicted steps between two syncs, alert or not.
        #[serde(default = "max_horizon")]
        #[schemars(range(min = 1))]
        max_horizon: usize,
    },
    /// Sync steps make up `fraction` of all steps, spread evenly.
    Budget {
        /// Share of steps that are sync steps.
        #[schemars(range(min = 0.0, max = 1.0))]
        fraction: f64,
    },
    /// Local evidence (local learning): a device raises an alert when the own loss of its first
    /// stage that learns between real steps (an exponential average over its local steps) has
    /// moved by more than `threshold`, relative to where it stood at the last real step — its
    /// features changed enough for the next stage to lag (a falling loss), or it is diverging
    /// (a rising one).
    LocalLoss {
        /// Relative change of the local loss, |ℓ − ℓ_sync| / ℓ_sync, that raises an alert
        /// (positive).
        #[serde(default = "local_threshold")]
        #[schemars(range(min = 0.0))]
        threshold: f64,
        /// Fewest steps without a real one between two real steps, alert or not.
        #[serde(default = "min_horizon")]
        #[schemars(range(min = 1))]
        min_horizon: usize,
        /// Most steps without a real one between two real steps, alert or not.
        #[serde(default = "max_horizon")]
        #[schemars(range(min = 1))]
        max_horizon: usize,
    },
}

fn low() -> f64 {
    0.5
}
fn high() -> f64 {
    1.0
}
fn max_horizon() -> usize {
    64
}
fn auto_factor() -> f64 {
    8.0
}
fn local_threshold() -> f64 {
    0.25
}
fn min_horizon() -> usize {
    8
}
/// Weight of the newest local loss in a stage's running average.
const LOCAL_LOSS_WEIGHT: f64 = 0.1;

impl Default for TriggerConfig {
    fn default() -> Self {
        Self::Adaptive { low: low(), high: high(), max_horizon: max_horizon() }
    }
}

impl TriggerConfig {
    /// `local-loss` with its defaults (local learning's default trigger).
    pub fn local_loss() -> Self {
        Self::LocalLoss { threshold: local_threshold(), min_horizon: min_horizon(), max_horizon: max_horizon() }
    }

    /// The trigger's name as manifests write it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Periodic { .. } => "periodic",
            Self::Adaptive { .. } => "adaptive",
            Self::SafeZone { .. } => "safe-zone",
            Self::Budget { .. } => "budget",
            Self::LocalLoss { .. } => "local-loss",
        }
    }

    /// The trigger in run names: `periodic4`, `budget0.1`, or its name.
    pub fn label(&self) -> String {
        match self {
            Self::Periodic { every } => format!("periodic{every}"),
            Self::Budget { fraction } => format!("budget{fraction}"),
            Self::LocalLoss { threshold, min_horizon, max_horizon } => {
                format!("local-loss{threshold}-{min_horizon}to{max_horizon}")
            }
            other => other.name().to_string(),
        }
    }

    /// Whether the trigger reads the stage's drift and forecast uncertainty ([`Evidence`]).
    pub fn needs_evidence(&self) -> bool {
        matches!(self, Self::SafeZone { .. })
    }

    /// Whether a sync this trigger asks for is one the other stages cannot foresee, so that
    /// asking costs one alert message.
    pub fn alerts(&self) -> bool {
        matches!(self, Self::SafeZone { .. } | Self::Adaptive { .. } | Self::LocalLoss { .. })
    }

    /// Whether the trigger reads the stages' own losses between real steps (local learning).
    pub fn needs_local_loss(&self) -> bool {
        matches!(self, Self::LocalLoss { .. })
    }

    /// Whether every stage needs the loss of each sync step (sent by the last stage).
    pub fn needs_loss(&self) -> bool {
        matches!(self, Self::Adaptive { .. })
    }

    /// Checks values serde cannot; the message names the field.
    pub fn validate(&self) -> Result<(), Invalid> {
        let refuse = |field: &str, message: String| Err(Invalid::at(field, format!("trigger `{field}` {message}")));
        let horizon = |field: &str, h: usize| match (1..=100_000).contains(&h) {
            true => Ok(()),
            false => refuse(field, format!("must be in [1, 100000], got {h}")),
        };
        match *self {
            Self::Periodic { every } if !(1..=100_000).contains(&every) => {
                refuse("every", format!("must be in [1, 100000], got {every}"))
            }
            Self::Periodic { .. } => Ok(()),
            Self::Adaptive { low, high, max_horizon } => {
                if !(low > 0.0 && low < high && high.is_finite()) {
                    return refuse("low", format!("and `high` must satisfy 0 < low < high, got {low} and {high}"));
                }
                horizon("max_horizon", max_horizon)
            }
            Self::SafeZone { threshold, auto_factor, max_horizon } => {
                if let Some(t) = threshold.filter(|t| !(*t > 0.0 && t.is_finite())) {
                    return refuse("threshold", format!("must be positive, got {t}"));
                }
                if !(auto_factor > 0.0 && auto_factor.is_finite()) {
                    return refuse("auto_factor", format!("must be positive, got {auto_factor}"));
                }
                horizon("max_horizon", max_horizon)
            }
            Self::Budget { fraction } if !(fraction > 0.0 && fraction <= 1.0) => {
                refuse("fraction", format!("must be in (0, 1], got {fraction}"))
            }
            Self::Budget { .. } => Ok(()),
            Self::LocalLoss { threshold, min_horizon, max_horizon } => {
                if !(threshold > 0.0 && threshold.is_finite()) {
                    return refuse("threshold", format!("must be positive, got {threshold}"));
                }
                if min_horizon > max_horizon {
                    return refuse(
                        "min_horizon",
                        format!("({min_horizon}) must not exceed `max_horizon` ({max_horizon})"),
                    );
                }
                horizon("min_horizon", min_horizon).and(horizon("max_horizon", max_horizon))
            }
        }
    }
}

/// What a stage measured, for its trigger.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Evidence {
    /// ‖θ − θ at the last sync‖ over the stage's parameters.
    pub drift: f64,
    /// The forecast's standard deviation as a norm over the stage's parameters (Kalman only).
    pub uncertainty: Option<f64>,
}

/// A stage's trigger state over a run (serialised whole into checkpoints).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trigger {
    config: TriggerConfig,
    /// Steps decided so far, and how many of them were syncs.
    steps: u64,
    syncs: u64,
    /// Predicted steps since the last sync.
    since_sync: usize,
    /// Adaptive: the current horizon.
    horizon: usize,
    last_loss: Option<f64>,
    /// Safe zone: sum and count of the real update norms seen.
    update_norms: (f64, u64),
    /// Local loss: the running average of the stage's own losses, and its value at the last sync.
    #[serde(default)]
    local_loss: Option<f64>,
    #[serde(default)]
    local_loss_at_sync: Option<f64>,
}

impl Trigger {
    pub fn new(config: &TriggerConfig) -> Self {
        Self {
            config: config.clone(),
            steps: 0,
            syncs: 0,
            since_sync: 0,
            horizon: 1,
            last_loss: None,
            update_norms: (0.0, 0),
            local_loss: None,
            local_loss_at_sync: None,
        }
    }

    /// Whether this stage asks for the coming step to be a sync step. The first step always is:
    /// predictors need a history.
    pub fn wants_sync(&self, evidence: &Evidence) -> bool {
        if self.syncs == 0 {
            return true;
        }
        match self.config {
            TriggerConfig::Periodic { every } => self.since_sync + 1 >= every,
            TriggerConfig::Adaptive { .. } => self.since_sync >= self.horizon,
            TriggerConfig::SafeZone { threshold, auto_factor, max_horizon } => {
                let limit =
                    threshold.unwrap_or_else(|| auto_factor * self.update_norms.0 / self.update_norms.1.max(1) as f64);
                self.since_sync >= max_horizon
                    || evidence.drift > limit
                    || evidence.uncertainty.is_some_and(|u| u > limit)
            }
            // Sync whenever the syncs so far fall short of the budget for the steps so far.
            TriggerConfig::Budget { fraction } => (self.syncs as f64) < fraction * (self.steps + 1) as f64,
            TriggerConfig::LocalLoss { threshold, min_horizon, max_horizon } => {
                let moved = match (self.local_loss, self.local_loss_at_sync) {
                    (Some(now), Some(then)) if then > 0.0 => (now - then).abs() / then > threshold,
                    _ => false,
                };
                self.since_sync >= max_horizon || (moved && self.since_sync >= min_horizon)
            }
        }
    }

    /// Records the stage's own loss on a local step (local learning).
    pub fn observe_local_loss(&mut self, loss: f64) {
        if loss.is_finite() {
            self.local_loss = Some(match self.local_loss {
                Some(average) => average + LOCAL_LOSS_WEIGHT * (loss - average),
                None => loss,
            });
        }
    }

    /// Records a sync step: the relative error of the forecast the predictor would have made
    /// for it (none before a history exists), the norm of the real update, and the step's loss.
    pub fn synced(&mut self, relative_error: Option<f64>, update_norm: f64, loss: f64) {
        if let TriggerConfig::Adaptive { low, high, max_horizon } = self.config {
            let loss_rose = self.last_loss.is_some_and(|last| loss > last);
            match relative_error {
                Some(e) if e > high || loss_rose => self.horizon = (self.horizon / 2).max(1),
                Some(e) if e < low => self.horizon = (self.horizon * 2).min(max_horizon),
                _ => {}
            }
        }
        self.last_loss = Some(loss);
        self.local_loss_at_sync = self.local_loss;
        self.update_norms.0 += update_norm;
        self.update_norms.1 += 1;
        self.steps += 1;
        self.syncs += 1;
        self.since_sync = 0;
    }

    /// Records a predicted step.
    pub fn predicted(&mut self) {
        self.steps += 1;
        self.since_sync += 1;
    }

    /// The trigger's settings.
    pub fn config(&self) -> &TriggerConfig {
        &self.config
    }

    /// Predicted steps since the last sync (the horizon of the next forecast is this + 1).
    pub fn since_sync(&self) -> usize {
        self.since_sync
    }

    /// The adaptive trigger's current horizon.
    pub fn horizon(&self) -> usize {
        self.horizon
    }

    /// Steps decided and sync steps among them.
    pub fn counts(&self) -> (u64, u64) {
        (self.steps, self.syncs)
    }
}
