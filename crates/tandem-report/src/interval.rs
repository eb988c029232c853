//! 95 % intervals over seeds: Student's t on per-seed differences, and on the logarithms of
//! per-seed ratios (a ratio's interval is then geometric, and never crosses zero).

/// A mean over seeds and its 95 % interval. One seed has no interval: its bounds are infinite,
/// so no bound is ever counted as cleared by it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    pub mean: f64,
    pub low: f64,
    pub high: f64,
    pub n: usize,
}

impl Interval {
    /// The mean of `values` ± t(0.975, n − 1) · s / √n; `None` for no values.
    pub fn of_differences(values: &[f64]) -> Option<Interval> {
        let n = values.len();
        if n == 0 || values.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        if n == 1 {
            return Some(Interval { mean, low: f64::NEG_INFINITY, high: f64::INFINITY, n });
        }
        let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let half = t_975(n - 1) * (variance / n as f64).sqrt();
        Some(Interval { mean, low: mean - half, high: mean + half, n })
    }

    /// The geometric mean of positive `ratios` and the interval of their logarithms' mean,
    /// mapped back; `None` for no values or a ratio that is not positive.
    pub fn of_ratios(ratios: &[f64]) -> Option<Interval> {
        if ratios.iter().any(|r| r.is_nan() || *r <= 0.0) {
            return None;
        }
        let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
        Interval::of_differences(&logs).map(|i| Interval {
            mean: i.mean.exp(),
            low: i.low.exp(),
            high: i.high.exp(),
            ..i
        })
    }

    /// Whether there is an interval (two seeds or more).
    pub fn is_bounded(&self) -> bool {
        self.n > 1
    }

    /// `12.3× [10.1, 15.0]`: a ratio with its interval (no interval for one seed).
    pub fn times(&self, decimals: usize) -> String {
        match self.is_bounded() {
            true => format!("{:.*}× [{:.*}, {:.*}]", decimals, self.mean, decimals, self.low, decimals, self.high),
            false => format!("{:.*}×", decimals, self.mean),
        }
    }

    /// `+1.2 [−0.3, +2.7]`: a signed difference with its interval, `scale` applied.
    pub fn signed(&self, scale: f64, decimals: usize) -> String {
        let s = |v: f64| format!("{:+.*}", decimals, v * scale);
        match self.is_bounded() {
            true => format!("{} [{}, {}]", s(self.mean), s(self.low), s(self.high)),
            false => s(self.mean),
        }
    }
}

/// The 0.975 quantile of Student's t with `df` degrees of freedom: tabulated to 30, then
/// Cornish-Fisher's expansion in 1/df (within 0.001 of the exact value there).
fn t_975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => TABLE[df - 1],
        _ => {
            let (z, n) = (1.959_964_f64, df as f64);
            z + (z.powi(3) + z) / (4.0 * n) + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * n * n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_difference_interval_is_students_t() {
        // Five values with mean 2 and sample standard deviation √2.5: half-width 2.776 · √(2.5/5).
        let i = Interval::of_differences(&[0.0, 1.0, 2.0, 3.0, 4.0]).unwrap();
        assert!((i.mean - 2.0).abs() < 1e-12);
        assert!((i.high - i.mean - 2.776 * 0.5f64.sqrt()).abs() < 1e-9);
        assert!((i.mean - i.low - (i.high - i.mean)).abs() < 1e-12);
        assert_eq!(i.signed(1.0, 1), "+2.0 [+0.0, +4.0]");
    }

    #[test]
    fn the_t_quantile_past_the_table_follows_the_exact_values() {
        // t(0.975) at 31, 40, 60 and 120 degrees of freedom, and its limit.
        for (df, exact) in [(31, 2.040), (40, 2.021), (60, 2.000), (120, 1.980), (100_000, 1.960)] {
            assert!((t_975(df) - exact).abs() < 1e-3, "{df}: {}", t_975(df));
        }
    }

    #[test]
    fn a_ratio_interval_is_geometric_and_one_seed_has_none() {
        let i = Interval::of_ratios(&[2.0, 8.0]).unwrap();
        assert!((i.mean - 4.0).abs() < 1e-12, "geometric mean");
        assert!((i.low * i.high - 16.0).abs() < 1e-9, "symmetric on the log scale");
        assert!(i.low > 0.0);
        let one = Interval::of_ratios(&[3.0]).unwrap();
        assert!(!one.is_bounded() && one.low == 0.0 && one.high == f64::INFINITY);
        assert_eq!(one.times(1), "3.0×");
        assert!(Interval::of_ratios(&[1.0, 0.0]).is_none());
        assert!(Interval::of_differences(&[]).is_none());
    }
}
