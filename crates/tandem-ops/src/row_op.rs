//! The operations over the last dimension of a tensor that one GPU kernel runs
//! (`gpu/rows.rs`), or on the CPU backends one autodiff node each (`ops/host_ops.rs`).

use crate::dropout::Draw;

/// An operation over the last dimension of a tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum RowOp {
    /// `x · Φ(x)`, element by element (Burn's `gelu`).
    Gelu,
    /// `exp(x − max) / Σ exp(x − max)` (Burn's `softmax` over the last dimension).
    Softmax,
    /// `x` times its factor in the mask `draw` (0 or `1 / keep`), element by element.
    Dropout(Draw),
}
