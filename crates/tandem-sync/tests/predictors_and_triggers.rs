//! Predictors on known parameter trajectories, and the triggers' sync decisions.

use burn::backend::NdArray;
use burn::tensor::Tensor;
use tandem_sync::{Evidence, Forecaster, PredictorConfig, Trigger, TriggerConfig};

type B = NdArray;

fn tensor(values: &[f32]) -> Tensor<B, 1> {
    Tensor::from_floats(values, &Default::default())
}

fn values(t: Tensor<B, 1>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

fn assert_close(actual: &[f32], expected: &[f32], tolerance: f32, what: &str) {
    assert_eq!(actual.len(), expected.len());
    for (a, e) in actual.iter().zip(expected) {
        assert!((a - e).abs() <= tolerance * e.abs().max(1.0), "{what}: {actual:?} vs {expected:?}");
    }
}

/// θ_t = a + b·t, so every real update is Δ = b (per element, of different signs and sizes).
const SLOPE: [f32; 3] = [0.5, -0.25, 2.0e-3];

fn observe_linear(f: &mut Forecaster<B>, steps: usize) {
    for _ in 0..steps {
        f.observe(tensor(&SLOPE));
    }
}

#[test]
fn velocity_ema_holt_and_least_squares_forecast_a_linear_trajectory_exactly() {
    let configs = [
        PredictorConfig::Velocity { damping: 1.0 },
        PredictorConfig::Ema { alpha: 0.3 },
        PredictorConfig::default(),
        PredictorConfig::LeastSquares { window: 4 },
    ];
    for config in configs {
        let mut f = Forecaster::<B>::new(&config);
        observe_linear(&mut f, 6);
        for h in [1, 2, 7] {
            // The h-th predicted step's update is Δ = b: θ_{t+h} = θ_t + h·b exactly.
            let update = f.forecast(h).unwrap_or_else(|| panic!("{} forecasts nothing", config.name()));
            assert_close(&values(update), &SLOPE, 1e-6, config.name());
        }
    }
}

#[test]
fn least_squares_and_holt_follow_a_trend_in_the_updates() {
    // Δ_i = 1 + i (a quadratic trajectory): the fitted line extrapolates exactly.
    let mut ls = Forecaster::<B>::new(&PredictorConfig::LeastSquares { window: 5 });
    for i in 0..8 {
        ls.observe(tensor(&[1.0 + i as f32]));
    }
    assert_close(&values(ls.forecast(1).unwrap()), &[9.0], 1e-5, "least squares, 1 ahead");
    assert_close(&values(ls.forecast(3).unwrap()), &[11.0], 1e-5, "least squares, 3 ahead");
    // Undamped Holt learns the trend of the updates.
    let mut holt = Forecaster::<B>::new(&PredictorConfig::Holt { alpha: 0.8, beta: 0.5, phi: 1.0 });
    for i in 0..40 {
        holt.observe(tensor(&[1.0 + i as f32]));
    }
    assert_close(&values(holt.forecast(1).unwrap()), &[41.0], 1e-3, "holt");
}

#[test]
fn static_forecasts_no_change_and_nothing_forecasts_without_history() {
    let mut f = Forecaster::<B>::new(&PredictorConfig::Static);
    observe_linear(&mut f, 3);
    assert!(f.forecast(1).is_none(), "static leaves the parameters where the last real step put them");
    for config in
        [PredictorConfig::Velocity { damping: 1.0 }, PredictorConfig::Kalman { level_noise: 0.1, trend_noise: 0.01 }]
    {
        assert!(Forecaster::<B>::new(&config).forecast(1).is_none());
    }
}

#[test]
fn each_predictor_counts_the_parameter_sized_state_it_keeps() {
    // Values kept per parameter value after 6 real steps: the last update, the average, level
    // and trend, the window's updates.
    let kept = [
        (PredictorConfig::Static, 0),
        (PredictorConfig::Velocity { damping: 1.0 }, 1),
        (PredictorConfig::Ema { alpha: 0.3 }, 1),
        (PredictorConfig::default(), 2),
        (PredictorConfig::LeastSquares { window: 4 }, 4),
        (PredictorConfig::Kalman { level_noise: 0.1, trend_noise: 0.01 }, 2),
    ];
    for (config, per_value) in kept {
        let mut f = Forecaster::<B>::new(&config);
        assert_eq!(f.held_bytes(), 0, "{}: nothing before the first real step", config.name());
        observe_linear(&mut f, 6);
        assert_eq!(f.held_bytes(), per_value * SLOPE.len() * 4, "{}", config.name());
    }
}

#[test]
fn velocity_damps_its_forecast_with_the_horizon() {
    let mut f = Forecaster::<B>::new(&PredictorConfig::Velocity { damping: 0.5 });
    f.observe(tensor(&[4.0]));
    assert_close(&values(f.forecast(1).unwrap()), &[2.0], 1e-6, "h = 1");
    assert_close(&values(f.forecast(3).unwrap()), &[0.5], 1e-6, "h = 3");
}

#[test]
fn kalman_converges_on_a_linear_trajectory_and_grows_less_sure_with_the_horizon() {
    let mut f = Forecaster::<B>::new(&PredictorConfig::Kalman { level_noise: 0.1, trend_noise: 0.01 });
    // Starts from a wrong first update, then sees the true slope.
    f.observe(tensor(&[5.0, 5.0, 5.0]));
    let error = |f: &Forecaster<B>| {
        values(f.forecast(1).unwrap()).iter().zip(SLOPE).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max)
    };
    let start = error(&f);
    let mut errors = Vec::new();
    for _ in 0..60 {
        f.observe(tensor(&SLOPE));
        errors.push(error(&f));
    }
    assert!(start > 4.0 && errors[59] < 1e-3 * start, "error fell from {start} to {}", errors[59]);
    assert!(errors[40..].iter().all(|e| *e < 1e-2 * start), "the error stays down: {errors:?}");
    let (v1, v5) = (f.forecast_variance(1).unwrap(), f.forecast_variance(5).unwrap());
    assert!(v1 > 0.0 && v5 > v1, "variance 1 ahead {v1}, 5 ahead {v5}");
}

#[test]
fn predictor_configs_parse_with_defaults_and_refuse_bad_values() {
    let parse = |text: &str| toml::from_str::<PredictorConfig>(text);
    assert_eq!(parse("kind = \"velocity\"").unwrap(), PredictorConfig::Velocity { damping: 1.0 });
    assert_eq!(parse("kind = \"least-squares\"\nwindow = 4").unwrap(), PredictorConfig::LeastSquares { window: 4 });
    assert!(parse("kind = \"holt\"\ngamma = 1").unwrap_err().to_string().contains("gamma"));
    assert!(parse("kind = \"arima\"").is_err());
    let e = PredictorConfig::Ema { alpha: 0.0 }.validate().unwrap_err();
    assert!(e.to_string().contains("alpha") && e.field.as_deref() == Some("alpha"), "{e}");
    let e = PredictorConfig::LeastSquares { window: 1 }.validate().unwrap_err();
    assert!(e.to_string().contains("window") && e.field.as_deref() == Some("window"), "{e}");
}

/// The steps (0-based) a lone trigger makes sync steps over `steps` steps.
fn sync_steps(config: &TriggerConfig, steps: usize, evidence: impl Fn(usize) -> Evidence) -> Vec<usize> {
    let mut trigger = Trigger::new(config);
    (0..steps)
        .filter(|&t| {
            let sync = trigger.wants_sync(&evidence(t));
            if sync {
                trigger.synced(None, 1.0, 1.0);
            } else {
                trigger.predicted();
            }
            sync
        })
        .collect()
}

#[test]
fn periodic_and_budget_triggers_sync_on_schedule() {
    let calm = |_| Evidence::default();
    assert_eq!(
        sync_steps(&TriggerConfig::Periodic { every: 1 }, 5, calm),
        vec![0, 1, 2, 3, 4],
        "every step: vanilla model parallelism"
    );
    assert_eq!(sync_steps(&TriggerConfig::Periodic { every: 4 }, 10, calm), vec![0, 4, 8]);
    let budget = sync_steps(&TriggerConfig::Budget { fraction: 0.1 }, 100, calm);
    assert_eq!(budget.len(), 10);
    assert!(budget.windows(2).all(|w| w[1] - w[0] == 10), "{budget:?}");
}

#[test]
fn the_adaptive_horizon_grows_on_good_forecasts_and_shrinks_on_bad_ones_or_a_rising_loss() {
    let config = TriggerConfig::Adaptive { low: 0.5, high: 1.0, max_horizon: 8 };
    let mut trigger = Trigger::new(&config);
    let mut loss = 10.0;
    for _ in 0..5 {
        trigger.synced(Some(0.1), 1.0, loss);
        loss -= 1.0;
    }
    assert_eq!(trigger.horizon(), 8, "doubles per good forecast, up to the maximum");
    trigger.synced(Some(2.0), 1.0, loss);
    assert_eq!(trigger.horizon(), 4, "halves on a bad forecast");
    trigger.synced(Some(0.7), 1.0, loss + 1.0);
    assert_eq!(trigger.horizon(), 2, "halves when the loss rose");
    trigger.synced(Some(0.7), 1.0, loss);
    assert_eq!(trigger.horizon(), 2, "holds between the thresholds");
    // With horizon 2: two predicted steps, then a sync.
    let calm = Evidence::default();
    assert!(!trigger.wants_sync(&calm));
    trigger.predicted();
    assert!(!trigger.wants_sync(&calm));
    trigger.predicted();
    assert!(trigger.wants_sync(&calm));
}

#[test]
fn the_safe_zone_syncs_when_drift_or_uncertainty_leaves_it() {
    // Fixed threshold 1.0: drift grows by 0.3 per predicted step, so steps 1-3 stay inside
    // (0.3, 0.6, 0.9), step 4 (1.2) leaves the zone.
    let fixed = TriggerConfig::SafeZone { threshold: Some(1.0), auto_factor: 8.0, max_horizon: 100 };
    let drift = |t: usize| Evidence {
        drift: 0.3 * (t % 4) as f64 + if t.is_multiple_of(4) { 1.2 } else { 0.0 },
        uncertainty: None,
    };
    assert_eq!(sync_steps(&fixed, 9, drift), vec![0, 4, 8]);
    // Automatic threshold: auto_factor × the mean real update norm (1.0 in `sync_steps`).
    let auto = TriggerConfig::SafeZone { threshold: None, auto_factor: 2.5, max_horizon: 100 };
    let growing = |t: usize| Evidence { drift: t as f64, uncertainty: None };
    assert_eq!(sync_steps(&auto, 6, growing), vec![0, 3, 4, 5]);
    let unsure = |_| Evidence { drift: 0.0, uncertainty: Some(5.0) };
    assert_eq!(sync_steps(&fixed, 3, unsure), vec![0, 1, 2], "an unsure predictor is no better than drift");
    let capped = TriggerConfig::SafeZone { threshold: Some(1e9), auto_factor: 8.0, max_horizon: 2 };
    assert_eq!(sync_steps(&capped, 7, |_| Evidence::default()), vec![0, 3, 6]);
}

#[test]
fn trigger_configs_parse_and_refuse_bad_values() {
    let parse = |text: &str| toml::from_str::<TriggerConfig>(text);
    assert_eq!(parse("kind = \"periodic\"\nevery = 10").unwrap(), TriggerConfig::Periodic { every: 10 });
    assert!(parse("kind = \"periodic\"").unwrap_err().to_string().contains("every"));
    assert!(TriggerConfig::Periodic { every: 0 }.validate().unwrap_err().to_string().contains("every"));
    assert!(TriggerConfig::Budget { fraction: 1.5 }.validate().unwrap_err().to_string().contains("fraction"));
    assert!(TriggerConfig::Adaptive { low: 2.0, high: 1.0, max_horizon: 4 }
        .validate()
        .unwrap_err()
        .to_string()
        .contains("low"));
    assert!(TriggerConfig::SafeZone { threshold: Some(-1.0), auto_factor: 1.0, max_horizon: 4 }
        .validate()
        .unwrap_err()
        .to_string()
        .contains("threshold"));
}
