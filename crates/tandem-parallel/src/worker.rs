//! What the strategies' worker threads (replicas, stages) share.

/// The message of a caught panic.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// One rayon pool of `threads` compute threads per worker, named `tandem-<kind><n>-<i>`
/// (on a CPU backend, a worker's pool is its device).
pub fn thread_pools(workers: usize, threads: usize, kind: &'static str) -> Result<Vec<rayon::ThreadPool>, String> {
    (0..workers)
        .map(|n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(move |i| format!("tandem-{kind}{n}-{i}"))
                .build()
                .map_err(|e| format!("cannot start the threads of {kind} {n}: {e}"))
        })
        .collect()
}
