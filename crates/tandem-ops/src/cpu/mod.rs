//! The CPU kernels behind [`crate::ops`]: loops over host memory (matrix products, the recurrent
//! time loop, row and element operations, vectorisable elementary functions) and the plumbing that
//! runs them behind a generic `B: Backend` on Flex and ndarray, as one autodiff node where there
//! is autodiff.

pub(crate) mod dispatch;
pub(crate) mod gelu;
pub(crate) mod host_gemm;
pub(crate) mod host_math;
pub(crate) mod host_op;
pub(crate) mod layer_norm;
pub(crate) mod permute;
pub(crate) mod recurrence;
pub(crate) mod softmax;
#[cfg(feature = "flex")]
pub(crate) mod squared_sum;
