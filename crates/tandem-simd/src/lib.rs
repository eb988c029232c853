//! Host-memory loops compiled, where the CPU has them, for wider vector instructions than the
//! build targets.
//!
//! A default build targets baseline x86-64: SSE2, 4 f32 lanes. Loops over host memory (Tandem's
//! CPU kernels, its optimizer step) are written so the compiler vectorises them, and [`run`]
//! picks at run time a copy compiled for AVX2 + FMA (8 lanes). Rust never fuses a multiply and an
//! add on its own, so both copies compute the same bits.

/// A computation with loops over host memory, compiled twice by [`run`]. Its `run` must be
/// `#[inline(always)]`, so that each copy holds its own compilation of the loops.
pub trait Kernel {
    /// What the computation returns.
    type Output;
    /// Runs the computation.
    fn run(self) -> Self::Output;
}

/// Runs `kernel` compiled for AVX2 + FMA when the CPU has them, as built otherwise.
pub fn run<K: Kernel>(kernel: K) -> K::Output {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features `run_avx2` is compiled for (checked just above).
        return unsafe { run_avx2(kernel) };
    }
    kernel.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_avx2<K: Kernel>(kernel: K) -> K::Output {
    kernel.run()
}
