//! Elementary functions for host-memory loops, without libm's (which are scalar, one call per
//! value), so that loops over them vectorise; see [`tandem_simd`].

/// `e^x` without libm's `expf`, so that loops over it vectorise: Cephes' `expf` (range reduction
/// by ln 2, degree-5 polynomial, relative error about 1e-7), `x` clamped to [−87, 88] (the
/// result stays a normal, finite f32); NaN stays NaN, so a diverged run still shows.
///
/// The polynomial runs on fused multiply-adds (`mul_add`): one vector instruction each in
/// [`tandem_simd`]'s AVX2 + FMA copy. On an x86 CPU without FMA each is a scalar libm call
/// (`fmaf`, the same result), and these loops no longer vectorise there.
#[inline(always)]
#[allow(clippy::excessive_precision)] // the constants as published, rounded to f32 by the compiler
pub(crate) fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    // Round x / ln 2 to the integer n: adding 1.5 × 2^23 leaves no fraction bits, and leaves n
    // in the low bits of the sum (read as an integer, not converted: that vectorises).
    let shifted = x * std::f32::consts::LOG2_E + 12_582_912.0;
    let n = shifted - 12_582_912.0;
    let r = n.mul_add(2.121_944_4e-4, (-n).mul_add(0.693_359_4, x)); // x − n ln 2, ln 2 in two parts
    let mut p = 1.987_569_1e-4_f32;
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1] {
        p = p.mul_add(r, c);
    }
    let y = (p * r).mul_add(r, r) + 1.0;
    // 2^n: n + 127 in the exponent bits.
    y * f32::from_bits(shifted.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23)
}

#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    2.0 * sigmoid(2.0 * x) - 1.0
}

/// The standard normal distribution function Φ(x) = ½ (1 + erf(x / √2)), through `erfc`
/// (Numerical Recipes' Chebyshev fit, relative error below 1.2e-7 in exact arithmetic), so the
/// lower tail keeps its relative precision: in f32, rounding `x²` alone costs up to ~1.5e-5
/// relative at |x| = 8 (tested).
#[inline(always)]
#[allow(clippy::excessive_precision)] // the coefficients as published, rounded to f32 by the compiler
pub(crate) fn normal_cdf(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let mut p = 0.170_872_77_f32;
    for c in [
        -0.822_152_23,
        1.488_515_87,
        -1.135_203_98,
        0.278_868_07,
        -0.186_288_06,
        0.096_784_18,
        0.374_091_96,
        1.000_023_68,
        -1.265_512_23,
    ] {
        p = p * t + c;
    }
    let half_erfc = 0.5 * t * exp(p - z * z);
    if x < 0.0 {
        half_erfc
    } else {
        1.0 - half_erfc
    }
}

/// The standard normal density φ(x) = e^(−x²/2) / √(2π).
#[inline(always)]
pub(crate) fn normal_pdf(x: f32) -> f32 {
    0.398_942_3 * exp(-0.5 * x * x)
}

/// Lanes of the reductions below: a fixed grouping (the same sums on every CPU), wide enough
/// for 8-lane vectors. A plain `iter().sum()` adds one value at a time, in order, which the
/// compiler may not vectorise.
const LANES: usize = 8;

/// `Σ a ⊙ b`, summed in [`LANES`] interleaved partial sums.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut partial = [0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a_chunks.remainder().iter().zip(b_chunks.remainder()).map(|(a, b)| a * b).sum();
    for (a, b) in a_chunks.zip(b_chunks) {
        for k in 0..LANES {
            partial[k] += a[k] * b[k];
        }
    }
    partial.iter().sum::<f32>() + tail
}

/// `Σ x`, summed in [`LANES`] interleaved partial sums.
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    let mut partial = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for x in chunks {
        for k in 0..LANES {
            partial[k] += x[k];
        }
    }
    partial.iter().sum::<f32>() + tail
}

/// The largest value of `x` (−∞ if empty; NaNs are skipped).
#[inline(always)]
pub(crate) fn max(x: &[f32]) -> f32 {
    let mut partial = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    for x in chunks {
        for k in 0..LANES {
            partial[k] = if x[k] > partial[k] { x[k] } else { partial[k] };
        }
    }
    partial.iter().fold(tail, |m, &v| if v > m { v } else { m })
}

#[cfg(test)]
mod tests {
    use super::{dot, exp, max, normal_cdf, normal_pdf, sum};

    #[test]
    fn reductions_match_plain_loops() {
        for len in [0, 1, 7, 8, 9, 64, 67] {
            let a: Vec<f32> = (0..len).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.25).collect();
            let b: Vec<f32> = (0..len).map(|i| (i % 5) as f32 * 0.5).collect();
            assert_eq!(sum(&a), a.iter().sum::<f32>(), "len {len}: these values add exactly in any order");
            assert_eq!(dot(&a, &b), a.iter().zip(&b).map(|(a, b)| a * b).sum::<f32>(), "len {len}");
            assert_eq!(max(&a), a.iter().copied().fold(f32::NEG_INFINITY, f32::max), "len {len}");
        }
    }

    #[test]
    fn exp_is_within_2e7_of_libm_and_keeps_nan() {
        let mut worst = 0f64;
        for i in 0..175_000 {
            let x = -87.0 + i as f32 * 0.001; // up to 88, where the clamp starts
            let expected = f64::from(x).exp();
            worst = worst.max(((f64::from(exp(x)) - expected) / expected).abs());
        }
        assert!(worst < 2e-7, "largest relative error {worst:e}");
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-1e4) > 0.0 && exp(1e4).is_finite(), "clamped, not 0 or ∞");
    }

    #[test]
    fn normal_cdf_and_pdf_match_f64() {
        // Reference Φ: Simpson's rule over f64's density, from −12 (Φ(−12) ≈ 2e-33).
        let pdf = |x: f64| (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let (step, mut cdf) = (1.0 / 1024.0, 0.0f64); // steps exact in f32 too
        for k in 0..(20 * 1024) {
            let x = -12.0 + f64::from(k) * step;
            cdf += step / 6.0 * (pdf(x) + 4.0 * pdf(x + step / 2.0) + pdf(x + step));
            let (x, xf) = (x + step, (x + step) as f32);
            if x < -8.0 {
                continue;
            }
            // f32 rounding of x² alone costs up to ~1e-5 relative at |x| = 8.
            let cdf_error = (f64::from(normal_cdf(xf)) - cdf).abs();
            assert!(cdf_error < 1.5e-5 * cdf.min(1.0 - cdf) + 1e-7, "Φ({x}) = {} vs {cdf}", normal_cdf(xf));
            assert!(((f64::from(normal_pdf(xf)) - pdf(x)) / pdf(x)).abs() < 1.5e-5, "φ({x})");
        }
        assert!(normal_cdf(f32::NAN).is_nan() && normal_pdf(f32::NAN).is_nan());
        assert!(normal_cdf(-1e4) < 1e-30 && normal_cdf(1e4) == 1.0, "clamped tails");
    }
}
