//! Dropout whose masks come from a random stream of the calling thread, set from (seed, worker,
//! step) at every training step: a replica's or stage's masks are the same whichever thread
//! runs first, so runs with several workers and dropout repeat bit for bit, and a resumed run
//! draws what an uninterrupted one drew. Each mask is a [`Draw`]: a counter-based hash of the
//! element's index, computed the same way on the host (the CPU backends) and in the GPU kernels,
//! so every backend drops the same elements of the same step. The operation that applies a mask
//! is [`crate::ops::rows`]'s.

use std::cell::Cell;

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

/// One dropout mask: element `i` (row-major) is kept, and scaled by `scale`, where the top 24 bits
/// of [`mix`]`(mix(i ^ key[0]) ^ key[1])` fall below `threshold`. Indices are 32-bit, as on the GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Draw {
    pub key: [u32; 2],
    pub threshold: u32,
    pub scale: f32,
}

impl Draw {
    /// The next mask of `elements` values from the calling thread's stream, dropping each with
    /// probability `prob`; `None` (and the stream left as it is) where `prob` is 0.
    pub(crate) fn next(prob: f64, elements: usize) -> Option<Self> {
        if prob == 0.0 {
            return None;
        }
        let (key, start) = STREAM.get();
        STREAM.set((key, start + elements as u64));
        let keep = 1.0 - prob;
        let mask_key = splitmix(key ^ start);
        Some(Self {
            key: [mask_key as u32, (mask_key >> 32) as u32],
            threshold: (keep * (1u64 << 24) as f64) as u32,
            scale: (1.0 / keep) as f32,
        })
    }

    /// The mask that keeps every element as it is.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    pub(crate) fn none() -> Self {
        Self { key: [0, 0], threshold: 1 << 24, scale: 1.0 }
    }

    /// The factor of element `i`: `scale` where it is kept, 0 where it is dropped.
    pub(crate) fn factor(&self, i: u32) -> f32 {
        if mix(mix(i ^ self.key[0]) ^ self.key[1]) >> 8 < self.threshold {
            self.scale
        } else {
            0.0
        }
    }
}

/// A bijective 32-bit mix (Chris Wellons' `lowbias32`); the GPU kernels compute the same.
pub(crate) fn mix(x: u32) -> u32 {
    let x = (x ^ (x >> 16)).wrapping_mul(0x7feb_352d);
    let x = (x ^ (x >> 15)).wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// SplitMix64's output function: a bijective 64-bit mix.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
