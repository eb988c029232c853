//! AdamW's scalars for one step, shared by the optimizer's kernels on every backend.

/// AdamW's scalars for one step, as Burn computes them, and the clipping bound.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWScalars {
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    /// `1 − lr · weight decay` (1 without decay).
    pub keep: f32,
    pub lr: f32,
    /// The step's number, from 1 (the bias corrections' exponent).
    pub time: usize,
    /// Global-norm clipping's bound: where the norm of all gradients `‖g‖` exceeds it, each
    /// gradient is multiplied by `clip_norm / (‖g‖ + 1e-6)` first. `f32::INFINITY`: no clipping.
    pub clip_norm: f32,
}

impl AdamWScalars {
    /// The bias corrections `1 − β₁ᵗ` and `1 − β₂ᵗ`, as Burn computes them (in f32).
    pub fn corrections(&self) -> (f32, f32) {
        (1f32 - self.beta_1.powi(self.time as i32), 1f32 - self.beta_2.powi(self.time as i32))
    }
}
