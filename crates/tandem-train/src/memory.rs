//! The process's memory allocator, tuned for training on a CPU.

/// Keeps freed memory in the process for reuse instead of handing it back to the system (glibc's
/// `malloc` on 64-bit Linux; a no-op elsewhere).
///
/// A training step on a CPU backend allocates and frees hundreds of tensors of 0.1–10 MB. glibc
/// maps a block above its mmap threshold fresh from the kernel and unmaps it when freed, and trims
/// the top of its heap once twice that threshold is free; both thresholds adapt to the largest
/// block freed so far, so a training step keeps crossing them and pays page faults on fresh memory
/// (about 20 % of Tandem's LSTM step on Flex, measured with `perf`). This fixes the mmap
/// threshold at 32 MiB (glibc's largest on 64-bit) and trims only past 2 GiB of free heap: the
/// process keeps close to its peak memory.
///
/// It also puts every thread on the main heap (one arena). A thread other than `main` (a training
/// step in a rayon pool, a replica, a stage) otherwise gets an arena of its own, made of 64 MiB
/// heaps that glibc unmaps whenever one empties, whatever the trim threshold: depending on where
/// the step's blocks land, that cost 0 or up to 400,000 page faults in 5 s of LSTM steps (10–15 %
/// of the step in `perf`). Allocations are few per tensor operation: sharing one arena's lock
/// cost nothing measurable in the throughput benchmark's one- and two-thread runs. Meant for a program's `main`, before training starts;
/// later calls do nothing.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: `mallopt` only sets three of glibc's allocation parameters; it is thread-safe.
            // It returns 0 when it rejects a value, which leaves that threshold as it was: the
            // program is then only slower, so there is nothing to report.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
                libc::mallopt(libc::M_ARENA_MAX, 1);
            }
        });
    }
}
