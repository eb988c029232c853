//! Dropout whose masks come from a random stream of the calling thread, set from (seed, worker,
//! step) at every training step: a replica's or stage's masks are the same whichever thread
//! runs first, so runs with several workers and dropout repeat bit for bit, and a resumed run
//! draws what an uninterrupted one drew. On the CPU backends the masks are made on the host from
//! a counter-based generator (SplitMix64 of the stream's key and the element's index: cheap, and
//! far faster than drawing Bernoulli samples one by one); on GPU backends the backend draws them.

use std::cell::Cell;

use burn::nn::Dropout;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData};

use crate::kernels::dispatch::Known;

thread_local! {
    /// The thread's stream: its key, and the elements drawn from it so far.
    static STREAM: Cell<(u64, u64)> = const { Cell::new((0x853c_49e6_748f_ea9b, 0)) };
}

/// Starts the calling thread's stream for training step `step` of `worker` (a replica or a
/// device; 0 for sequential training) in a run seeded with `seed`.
pub fn begin_step(seed: u64, worker: usize, step: usize) {
    let key = splitmix(splitmix(splitmix(seed) ^ worker as u64) ^ step as u64);
    STREAM.set((key, 0));
}

/// `layer`'s dropout of `x` in training (with autodiff); `x` itself otherwise.
pub fn dropout<B: Backend, const D: usize>(layer: &Dropout, x: Tensor<B, D>) -> Tensor<B, D> {
    let device = x.device();
    if !B::ad_enabled(&device) || layer.prob == 0.0 {
        return x;
    }
    let keep = 1.0 - layer.prob;
    if Known::of::<B>() == Known::Other {
        return x.clone() * x.random_like(Distribution::Bernoulli(keep)) * (1.0 / keep);
    }
    let shape = x.shape();
    let n = shape.num_elements() as u64;
    let (key, start) = STREAM.get();
    STREAM.set((key, start + n));
    // Kept where the element's uniform draw (24 bits) falls below `keep`.
    let threshold = (keep * (1u64 << 24) as f64) as u64;
    let scale = (1.0 / keep) as f32;
    let mask: Vec<f32> =
        (start..start + n).map(|i| if splitmix(key ^ i) >> 40 < threshold { scale } else { 0.0 }).collect();
    x * Tensor::from_data(TensorData::new(mask, shape), &device)
}

/// SplitMix64's output function: a bijective 64-bit mix.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};

    use super::*;

    type B = Autodiff<NdArray>;

    fn mask(seed: u64, worker: usize, step: usize) -> Vec<f32> {
        begin_step(seed, worker, step);
        let x = Tensor::<B, 2>::ones([64, 64], &Default::default());
        dropout(&burn::nn::DropoutConfig::new(0.25).init(), x).into_data().to_vec().unwrap()
    }

    #[test]
    fn a_step_of_a_worker_draws_the_same_mask_on_any_thread() {
        let here = mask(7, 1, 3);
        let there = std::thread::spawn(|| mask(7, 1, 3)).join().unwrap();
        assert_eq!(here, there);
        assert_ne!(here, mask(7, 0, 3));
        assert_ne!(here, mask(7, 1, 4));
        let kept = here.iter().filter(|&&v| v > 0.0).count() as f64 / here.len() as f64;
        assert!((kept - 0.75).abs() < 0.03, "{kept}");
        assert!(here.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    }
}
