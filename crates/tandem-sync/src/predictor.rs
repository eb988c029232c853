//! Forecasting a stage's next parameter update from its own history of *real* updates
//! (Δ = θ_after − θ_before of each synchronised step), with element-wise arithmetic only: no
//! forward pass, no backward pass, no gradient. One [`Forecaster`] per parameter tensor, on its
//! values flattened to one dimension, on the stage's own device.
//!
//! The series every predictor models is the sequence of real updates Δ₁, Δ₂, …, Δₙ; a forecast
//! `h` steps ahead is the update to apply on the `h`-th predicted step after the last real one.
//! A linear parameter trajectory (constant Δ) is forecast exactly by `velocity` (damping 1),
//! `ema`, `holt` and `least-squares`; `kalman` converges on it; `static` forecasts no change.

use std::collections::VecDeque;

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use serde::{Deserialize, Serialize};

use tandem_models::Invalid;
use tandem_train::bytes::{Reader, Writer};
use tandem_train::StateError;

/// `[strategy.predictor]`: which forecast predicted steps apply.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PredictorConfig {
    /// No change: predicted steps only skip their batches (the control every predictor must beat).
    Static,
    /// The last real update, times `damping`^h.
    Velocity {
        /// Factor applied once per predicted step (1: the same update again and again).
        #[serde(default = "one")]
        damping: f64,
    },
    /// An exponential moving average of the real updates, weight `alpha` on the newest.
    Ema {
        /// Weight of the newest real update in the average.
        #[serde(default = "ema_alpha")]
        #[schemars(range(min = 0.0, max = 1.0))]
        alpha: f64,
    },
    /// Damped Holt linear trend: level weight `alpha`, trend weight `beta`, damping `phi`.
    Holt {
        /// Weight of the newest real update in the level.
        #[serde(default = "holt_alpha")]
        #[schemars(range(min = 0.0, max = 1.0))]
        alpha: f64,
        /// Weight of the newest level change in the trend.
        #[serde(default = "holt_beta")]
        #[schemars(range(min = 0.0, max = 1.0))]
        beta: f64,
        /// Damping of the trend per predicted step (1: a straight line).
        #[serde(default = "holt_phi")]
        #[schemars(range(min = 0.0, max = 1.0))]
        phi: f64,
    },
    /// A straight line fitted by least squares to the last `window` real updates, extrapolated.
    LeastSquares {
        /// Real updates the line is fitted to.
        #[serde(default = "window")]
        #[schemars(range(min = 2))]
        window: usize,
    },
    /// Local-linear-trend Kalman filter per element. `level_noise` and `trend_noise` are the
    /// process variances relative to the observation variance; the forecast variance is
    /// available to triggers.
    Kalman {
        /// Process variance of the level, relative to the observation variance.
        #[serde(default = "level_noise")]
        level_noise: f64,
        /// Process variance of the trend, relative to the observation variance.
        #[serde(default = "trend_noise")]
        trend_noise: f64,
    },
}

fn one() -> f64 {
    1.0
}
fn ema_alpha() -> f64 {
    0.3
}
fn holt_alpha() -> f64 {
    0.5
}
fn holt_beta() -> f64 {
    0.1
}
fn holt_phi() -> f64 {
    0.98
}
fn window() -> usize {
    8
}
fn level_noise() -> f64 {
    0.1
}
fn trend_noise() -> f64 {
    0.01
}

impl Default for PredictorConfig {
    fn default() -> Self {
        Self::Holt { alpha: holt_alpha(), beta: holt_beta(), phi: holt_phi() }
    }
}

impl PredictorConfig {
    /// The predictor's name as manifests write it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::Velocity { .. } => "velocity",
            Self::Ema { .. } => "ema",
            Self::Holt { .. } => "holt",
            Self::LeastSquares { .. } => "least-squares",
            Self::Kalman { .. } => "kalman",
        }
    }

    /// The name, followed by each setting that differs from its default (`velocity-damping0.9`),
    /// so that runs of one predictor with different settings get different names.
    pub fn label(&self) -> String {
        let set = |key: &str, value: f64, default: f64| (value != default).then(|| format!("-{key}{value:?}"));
        let settings: Vec<Option<String>> = match *self {
            Self::Static => vec![],
            Self::Velocity { damping } => vec![set("damping", damping, one())],
            Self::Ema { alpha } => vec![set("alpha", alpha, ema_alpha())],
            Self::Holt { alpha, beta, phi } => {
                vec![set("alpha", alpha, holt_alpha()), set("beta", beta, holt_beta()), set("phi", phi, holt_phi())]
            }
            Self::LeastSquares { window: w } => vec![(w != window()).then(|| format!("-window{w}"))],
            Self::Kalman { level_noise, trend_noise } => vec![
                set("level_noise", level_noise, self::level_noise()),
                set("trend_noise", trend_noise, self::trend_noise()),
            ],
        };
        settings.into_iter().flatten().fold(self.name().to_string(), |label, s| label + &s)
    }

    /// Checks values serde cannot; the message names the field.
    pub fn validate(&self) -> Result<(), Invalid> {
        let unit = |name: &str, v: f64, closed_low: bool| {
            let ok = if closed_low { (0.0..=1.0).contains(&v) } else { v > 0.0 && v <= 1.0 };
            if ok {
                Ok(())
            } else {
                let low = if closed_low { "[0" } else { "(0" };
                Err(Invalid::at(name, format!("predictor `{name}` must be in {low}, 1], got {v}")))
            }
        };
        match *self {
            Self::Static => Ok(()),
            Self::Velocity { damping } => unit("damping", damping, true),
            Self::Ema { alpha } => unit("alpha", alpha, false),
            Self::Holt { alpha, beta, phi } => {
                unit("alpha", alpha, false).and(unit("beta", beta, true)).and(unit("phi", phi, true))
            }
            Self::LeastSquares { window } if !(2..=64).contains(&window) => {
                Err(Invalid::at("window", format!("predictor `window` must be in [2, 64], got {window}")))
            }
            Self::LeastSquares { .. } => Ok(()),
            Self::Kalman { level_noise, trend_noise } => {
                for (name, v) in [("level_noise", level_noise), ("trend_noise", trend_noise)] {
                    if !(v > 0.0 && v <= 1e6) {
                        return Err(Invalid::at(name, format!("predictor `{name}` must be in (0, 1e6], got {v}")));
                    }
                }
                Ok(())
            }
        }
    }
}

/// The forecasting state of one flattened parameter tensor.
#[derive(Clone, Debug)]
pub struct Forecaster<B: Backend> {
    config: PredictorConfig,
    state: State<B>,
}

#[derive(Clone, Debug)]
enum State<B: Backend> {
    Empty,
    /// Velocity: the last update. EMA: the average.
    One(Tensor<B, 1>),
    Holt {
        level: Tensor<B, 1>,
        trend: Tensor<B, 1>,
    },
    Window(VecDeque<Tensor<B, 1>>),
    /// Level and trend per element; `p` is their 2 × 2 covariance (shared by all elements, in
    /// units of the observation variance, which does not depend on the data); `noise` tracks the
    /// observation variance itself from the innovations.
    Kalman {
        level: Tensor<B, 1>,
        trend: Tensor<B, 1>,
        p: [[f64; 2]; 2],
        noise: f64,
    },
}

impl<B: Backend> Forecaster<B> {
    pub fn new(config: &PredictorConfig) -> Self {
        Self { config: config.clone(), state: State::Empty }
    }

    /// Records the update Δ of a real (synchronised) step.
    pub fn observe(&mut self, delta: Tensor<B, 1>) {
        let state = std::mem::replace(&mut self.state, State::Empty);
        self.state = match (&self.config, state) {
            (PredictorConfig::Static, _) => State::Empty,
            (PredictorConfig::Velocity { .. }, _) => State::One(delta),
            (PredictorConfig::Ema { alpha }, State::One(avg)) => {
                State::One(delta.mul_scalar(*alpha) + avg.mul_scalar(1.0 - alpha))
            }
            (PredictorConfig::Ema { .. }, _) => State::One(delta),
            (&PredictorConfig::Holt { alpha, beta, phi }, State::Holt { level, trend }) => {
                let damped = trend.mul_scalar(phi);
                let new_level = delta.mul_scalar(alpha) + (level.clone() + damped.clone()).mul_scalar(1.0 - alpha);
                let new_trend = (new_level.clone() - level).mul_scalar(beta) + damped.mul_scalar(1.0 - beta);
                State::Holt { level: new_level, trend: new_trend }
            }
            (PredictorConfig::Holt { .. }, _) => State::Holt { trend: delta.zeros_like(), level: delta },
            (&PredictorConfig::LeastSquares { window }, state) => {
                let mut history = match state {
                    State::Window(h) => h,
                    _ => VecDeque::with_capacity(window),
                };
                if history.len() == window {
                    history.pop_front();
                }
                history.push_back(delta);
                State::Window(history)
            }
            (&PredictorConfig::Kalman { level_noise, trend_noise }, State::Kalman { level, trend, p, noise }) => {
                // Predict: x ← F x, P ← F P Fᵀ + Q, with F = [[1, 1], [0, 1]].
                let pp = [
                    [p[0][0] + 2.0 * p[0][1] + p[1][1] + level_noise, p[0][1] + p[1][1]],
                    [p[0][1] + p[1][1], p[1][1] + trend_noise],
                ];
                let predicted = level + trend.clone();
                // Update with the observation (variance 1 in these units).
                let s = pp[0][0] + 1.0;
                let (k0, k1) = (pp[0][0] / s, pp[1][0] / s);
                let innovation = delta - predicted.clone();
                let mean_square = mean_square(&innovation);
                let noise = 0.9 * noise + 0.1 * mean_square / s;
                let p = [
                    [(1.0 - k0) * pp[0][0], (1.0 - k0) * pp[0][1]],
                    [pp[1][0] - k1 * pp[0][0], pp[1][1] - k1 * pp[0][1]],
                ];
                State::Kalman {
                    level: predicted + innovation.clone().mul_scalar(k0),
                    trend: trend + innovation.mul_scalar(k1),
                    p,
                    noise,
                }
            }
            (PredictorConfig::Kalman { .. }, _) => {
                let noise = mean_square(&delta).max(1e-30);
                State::Kalman { trend: delta.zeros_like(), level: delta, p: [[1.0, 0.0], [0.0, 1.0]], noise }
            }
        };
    }

    /// The update to apply on the `h`-th predicted step (h ≥ 1) after the last real one; `None`
    /// when there is nothing to apply (static, or no history yet).
    pub fn forecast(&self, h: usize) -> Option<Tensor<B, 1>> {
        let h = h.max(1);
        match (&self.config, &self.state) {
            (&PredictorConfig::Velocity { damping }, State::One(last)) => {
                Some(last.clone().mul_scalar(damping.powi(h as i32)))
            }
            (PredictorConfig::Ema { .. }, State::One(avg)) => Some(avg.clone()),
            (&PredictorConfig::Holt { phi, .. }, State::Holt { level, trend }) => {
                let damping: f64 = (1..=h).map(|i| phi.powi(i as i32)).sum();
                Some(level.clone() + trend.clone().mul_scalar(damping))
            }
            (PredictorConfig::LeastSquares { .. }, State::Window(history)) => Some(least_squares(history, h)),
            (PredictorConfig::Kalman { .. }, State::Kalman { level, trend, .. }) => {
                Some(level.clone() + trend.clone().mul_scalar(h as f64))
            }
            _ => None,
        }
    }

    /// Variance of one element of the `h`-step forecast (Kalman only): how unsure the predictor is.
    pub fn forecast_variance(&self, h: usize) -> Option<f64> {
        match &self.state {
            State::Kalman { p, noise, .. } => {
                let h = h.max(1) as f64;
                // Var(level + h·trend) under the filtered covariance, plus the observation noise.
                Some((p[0][0] + 2.0 * h * p[0][1] + h * h * p[1][1] + 1.0) * noise)
            }
            _ => None,
        }
    }
}

impl<B: Backend> Forecaster<B> {
    /// Bytes of the tensors it keeps (4 per value).
    pub fn held_bytes(&self) -> usize {
        self.parts().1.iter().map(|t| t.shape().num_elements() * size_of::<f32>()).sum()
    }

    /// The forecasting state, for checkpoints: a tag, its tensors and its scalars.
    pub(crate) fn write_state(&self, out: &mut Writer) {
        let (tag, tensors, scalars) = self.parts();
        out.count(tag).count(tensors.len());
        tensors.into_iter().for_each(|t| {
            out.tensor(t);
        });
        out.scalars(&scalars);
    }

    /// The state as a tag, its tensors and its scalars.
    fn parts(&self) -> (usize, Vec<&Tensor<B, 1>>, Vec<f64>) {
        match &self.state {
            State::Empty => (0, vec![], vec![]),
            State::One(t) => (1, vec![t], vec![]),
            State::Holt { level, trend } => (2, vec![level, trend], vec![]),
            State::Window(history) => (3, history.iter().collect(), vec![]),
            State::Kalman { level, trend, p, noise } => {
                (4, vec![level, trend], vec![p[0][0], p[0][1], p[1][0], p[1][1], *noise])
            }
        }
    }

    /// Continues from [`Forecaster::write_state`], on `device`.
    pub(crate) fn read_state(&mut self, input: &mut Reader, device: &B::Device) -> Result<(), StateError> {
        let tag = input.count()?;
        let tensors = (0..input.count()?).map(|_| input.tensor::<B, 1>(device)).collect::<Result<Vec<_>, _>>()?;
        let scalars = input.scalars()?;
        let damaged = || StateError::Damaged("a predictor's state in the checkpoint is damaged".to_string());
        let mut tensors = tensors.into_iter();
        self.state = match (tag, scalars.as_slice()) {
            (0, _) => State::Empty,
            (1, _) => State::One(tensors.next().ok_or_else(damaged)?),
            (2, _) => {
                State::Holt { level: tensors.next().ok_or_else(damaged)?, trend: tensors.next().ok_or_else(damaged)? }
            }
            (3, _) => State::Window(tensors.collect()),
            (4, &[p00, p01, p10, p11, noise]) => State::Kalman {
                level: tensors.next().ok_or_else(damaged)?,
                trend: tensors.next().ok_or_else(damaged)?,
                p: [[p00, p01], [p10, p11]],
                noise,
            },
            _ => return Err(damaged()),
        };
        Ok(())
    }
}

/// The mean of the squared elements (one value read back from the device).
fn mean_square<B: Backend>(t: &Tensor<B, 1>) -> f64 {
    (t.clone() * t.clone()).mean().into_scalar().elem()
}

/// Extrapolates the straight line fitted to `history` (indices 0..k) to index k − 1 + h: a
/// weighted sum of the stored updates, the weights being those of the least-squares fit.
fn least_squares<B: Backend>(history: &VecDeque<Tensor<B, 1>>, h: usize) -> Tensor<B, 1> {
    let k = history.len();
    if k == 1 {
        return history[0].clone();
    }
    let mean_i = (k - 1) as f64 / 2.0;
    let spread: f64 = (0..k).map(|i| (i as f64 - mean_i).powi(2)).sum();
    let target = (k - 1 + h) as f64;
    history
        .iter()
        .enumerate()
        .map(|(i, d)| d.clone().mul_scalar(1.0 / k as f64 + (target - mean_i) * (i as f64 - mean_i) / spread))
        .reduce(|a, b| a + b)
        .expect("k ≥ 2")
}
