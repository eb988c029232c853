//! Which CPU fast paths run on a backend: for tests and benchmarks that check a path is taken,
//! and for other crates' own host-memory paths ([`on_cpu`]).

use burn::tensor::backend::Backend;

use crate::cpu::gelu::Gelu;
use crate::cpu::host_op::one_node;
use crate::cpu::softmax::Softmax;
use crate::ops::{conv_max, recurrence};

/// An operation of the fused forward passes that runs, on some backends, as one autodiff node
/// with its own backward pass instead of Burn's tensor operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FastPath {
    /// The time loop of an LSTM or GRU layer: on `Autodiff<I>` for Flex, ndarray (f32), and wgpu /
    /// CUDA with this crate's features of those names.
    Recurrence,
    /// The CNN's convolutions of every width and their max pooling: on `Autodiff<Flex>` and
    /// `Autodiff<NdArray>`.
    ConvMax,
    /// The attention scores' softmax: on `Autodiff<Flex>` and `Autodiff<NdArray>`.
    Softmax,
    /// GELU: on `Autodiff<Flex>` only (ndarray's own backward is that of GELU's tanh
    /// approximation, so its stock model computes something else).
    Gelu,
}

impl FastPath {
    /// Whether this operation runs as one autodiff node with its own backward pass on `B`.
    pub fn active_on<B: Backend>(self) -> bool {
        match self {
            Self::Recurrence => recurrence::runs_as_one_node::<B>(),
            Self::ConvMax => conv_max::has_own_backward::<B>(),
            Self::Softmax => one_node::<B, Softmax>(),
            Self::Gelu => one_node::<B, Gelu>(),
        }
    }
}

/// Whether `B` is a CPU backend compiled into this crate (Flex, ndarray) without autodiff: where
/// the fast paths run their forward passes in host memory.
pub fn on_cpu<B: Backend>() -> bool {
    crate::backend::Which::of::<B>().on_cpu()
}
