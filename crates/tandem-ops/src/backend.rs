//! Which backend a generic `B: Backend` is: the one place in Tandem that compares types to choose
//! a backend's own path.
//!
//! Burn 0.21 gives a generic `B: Backend` no custom autodiff operation without an extra trait
//! bound on every model, so an operation with its own kernels asks [`Which::of`] and, on a backend
//! it knows, moves its tensors to that backend's concrete type
//! ([`crate::cpu::dispatch::same_type`]). A backend whose feature is off is never named here: it is
//! [`Which::Other`] and runs Burn's operations.

use std::any::TypeId;

#[cfg(any(feature = "flex", feature = "ndarray", feature = "wgpu", feature = "cuda"))]
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;

/// The backends with paths of their own, with and without autodiff, as this build compiles them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Flex,
    AutodiffFlex,
    NdArray,
    AutodiffNdArray,
    Wgpu,
    AutodiffWgpu,
    Cuda,
    AutodiffCuda,
    /// Any other backend, or one whose feature is off (f64 ndarray, a backend of the user's…).
    Other,
}

impl Which {
    /// Which of them `B` is.
    pub fn of<B: Backend>() -> Self {
        let known: &[(TypeId, Which)] = &[
            #[cfg(feature = "flex")]
            (TypeId::of::<burn::backend::Flex>(), Self::Flex),
            #[cfg(feature = "flex")]
            (TypeId::of::<Autodiff<burn::backend::Flex>>(), Self::AutodiffFlex),
            #[cfg(feature = "ndarray")]
            (TypeId::of::<burn::backend::NdArray>(), Self::NdArray),
            #[cfg(feature = "ndarray")]
            (TypeId::of::<Autodiff<burn::backend::NdArray>>(), Self::AutodiffNdArray),
            #[cfg(feature = "wgpu")]
            (TypeId::of::<burn::backend::Wgpu>(), Self::Wgpu),
            #[cfg(feature = "wgpu")]
            (TypeId::of::<Autodiff<burn::backend::Wgpu>>(), Self::AutodiffWgpu),
            #[cfg(feature = "cuda")]
            (TypeId::of::<burn::backend::Cuda>(), Self::Cuda),
            #[cfg(feature = "cuda")]
            (TypeId::of::<Autodiff<burn::backend::Cuda>>(), Self::AutodiffCuda),
        ];
        let id = TypeId::of::<B>();
        known.iter().find(|(known, _)| *known == id).map_or(Self::Other, |&(_, which)| which)
    }

    /// A CPU backend (Flex, ndarray), with or without autodiff: values in host memory.
    pub fn on_host(self) -> bool {
        matches!(self, Self::Flex | Self::AutodiffFlex | Self::NdArray | Self::AutodiffNdArray)
    }

    /// A CPU backend without autodiff.
    pub fn on_cpu(self) -> bool {
        matches!(self, Self::Flex | Self::NdArray)
    }
}

#[cfg(test)]
mod tests {
    use super::Which;

    #[test]
    fn each_compiled_backend_is_told_apart() {
        #[cfg(feature = "flex")]
        {
            assert_eq!(Which::of::<burn::backend::Flex>(), Which::Flex);
            assert_eq!(Which::of::<burn::backend::Autodiff<burn::backend::Flex>>(), Which::AutodiffFlex);
        }
        #[cfg(feature = "ndarray")]
        {
            assert_eq!(Which::of::<burn::backend::NdArray>(), Which::NdArray);
            assert_eq!(Which::of::<burn::backend::Autodiff<burn::backend::NdArray>>(), Which::AutodiffNdArray);
            // f64 ndarray has no paths of its own.
            assert_eq!(Which::of::<burn::backend::NdArray<f64>>(), Which::Other);
        }
    }
}
