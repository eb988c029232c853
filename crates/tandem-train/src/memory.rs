//! The process's memory allocator, tuned for training on a CPU.

/// Keeps freed memory in the process for reuse instead of handing it back to the system (glibc's
/// `malloc` on Linux; a no-op elsewhere).
///
/// A training step on a CPU backend allocates and frees hundreds of tensors of 0.1–10 MB. By
/// default glibc maps the large ones fresh from the kernel and trims its heap after large frees,
/// so every step pays page faults on new memory: about 20 % of an LSTM step's time on Flex. With
/// this, allocations up to 32 MiB (glibc's largest threshold) come from the heap, which is never
/// trimmed: the process keeps its peak memory. `benches/throughput.rs` measures the gain. Meant for
/// a program's `main`, before training starts; later calls do nothing.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: `mallopt` only sets two of glibc's allocation thresholds; it is thread-safe.
        ONCE.call_once(|| unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        });
    }
}
