//! What each launch of a Tandem GPU kernel asks of the device, written down by its launcher from
//! the shapes it launches at, while a ledger is open: the launch geometry, the bytes it moves, its
//! arithmetic and the longest chain of dependent reads one unit makes. The kernel table
//! (`benches/kernel_table.rs`) turns these into estimated times on a GPU; nothing else reads them,
//! and with no ledger open a launch writes nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use cubecl::{prelude::CubeCount, CubeDim};

/// One launch's work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Work {
    /// The kernel, as CubeCL names it after `tandem_ops::gpu::` (`recurrence::forward_kernel`).
    pub kernel: &'static str,
    /// Cubes (thread blocks) launched.
    pub cubes: u64,
    /// Units (threads) per cube.
    pub units: u64,
    /// Bytes read from and written to global memory, each value counted once.
    pub bytes: u64,
    /// Floating-point operations (a multiply-add is two).
    pub flops: u64,
    /// The longest chain of global-memory reads one unit makes where each waits for the one
    /// before (a loop's iterations, a barrier between steps): the latency a kernel cannot hide by
    /// running more units.
    pub dependent_reads: u64,
    /// The longest chain of dependent shared-memory reads (a tree's levels, a serial sum) one unit
    /// makes besides.
    pub shared_reads: u64,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl Work {
    /// A launch of `kernel` over `count` cubes of `dim` units, its work still to be filled in.
    pub(crate) fn of(kernel: &'static str, count: &CubeCount, dim: CubeDim) -> Self {
        let cubes = match count {
            CubeCount::Static(x, y, z) => u64::from(*x) * u64::from(*y) * u64::from(*z),
            CubeCount::Dynamic(_) => 0,
        };
        Work {
            kernel,
            cubes,
            units: u64::from(dim.x * dim.y * dim.z),
            bytes: 0,
            flops: 0,
            dependent_reads: 0,
            shared_reads: 0,
        }
    }
}

/// A process-wide list that keeps what is pushed while it is open, and nothing otherwise.
pub struct Recorder<T> {
    open: AtomicBool,
    items: Mutex<Vec<T>>,
}

impl<T> Recorder<T> {
    pub const fn new() -> Self {
        Self { open: AtomicBool::new(false), items: Mutex::new(Vec::new()) }
    }

    /// Starts keeping what is pushed (what was kept before is forgotten).
    pub fn open(&self) {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.open.store(true, Ordering::SeqCst);
    }

    /// Stops keeping and returns what was pushed since [`Recorder::open`], in order.
    pub fn close(&self) -> Vec<T> {
        self.open.store(false, Ordering::SeqCst);
        std::mem::take(&mut *self.items.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Keeps `item()` while open.
    pub fn push(&self, item: impl FnOnce() -> T) {
        if self.open.load(Ordering::Relaxed) {
            let item = item();
            self.items.lock().unwrap_or_else(|e| e.into_inner()).push(item);
        }
    }
}

impl<T> Default for Recorder<T> {
    fn default() -> Self {
        Self::new()
    }
}

static LAUNCHES: Recorder<Work> = Recorder::new();

/// Starts writing down every launch of a Tandem kernel in the process (the ones before are
/// forgotten).
pub fn open() {
    LAUNCHES.open();
}

/// Stops writing down and returns the launches since [`open`], in launch order.
pub fn close() -> Vec<Work> {
    LAUNCHES.close()
}

/// The ledger's name for a kernel CubeCL names `launched` (its module and function after
/// `tandem_ops::gpu::`), or `None` for a kernel that is not Tandem's.
pub fn kernel_of(launched: &str) -> Option<String> {
    let rest = launched.strip_prefix("tandem_ops::gpu::")?;
    Some(rest.split("::").take(2).collect::<Vec<_>>().join("::"))
}

/// Each launch of `launched` (CubeCL's kernel names, in launch order) with the work its launcher
/// wrote down in `works`, `None` for kernels that are not Tandem's; an error names the first
/// launch of a Tandem kernel without its entry, or the first entry without its launch.
pub fn pair(launched: Vec<String>, works: Vec<Work>) -> Result<Vec<(String, Option<Work>)>, String> {
    let mut works = works.into_iter().peekable();
    let mut paired = Vec::with_capacity(launched.len());
    for name in launched {
        match kernel_of(&name) {
            Some(kernel) => {
                let work = works.next_if(|w| w.kernel == kernel).ok_or_else(|| match works.peek() {
                    Some(next) => format!("{kernel} was launched where the ledger has {} next", next.kernel),
                    None => format!("{kernel} was launched without a ledger entry"),
                })?;
                paired.push((kernel, Some(work)));
            }
            None => paired.push((name, None)),
        }
    }
    match works.next() {
        Some(left) => Err(format!("the ledger has {} without its launch", left.kernel)),
        None => Ok(paired),
    }
}

/// Writes down `work()` for a launch while a ledger is open.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) fn note(work: impl FnOnce() -> Work) {
    LAUNCHES.push(work);
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl Work {
    /// With `values` f32 values read or written in all, each counted once.
    pub(crate) fn moves(self, values: usize) -> Self {
        Work { bytes: 4 * values as u64, ..self }
    }

    /// With `flops` floating-point operations in all.
    pub(crate) fn computes(self, flops: usize) -> Self {
        Work { flops: flops as u64, ..self }
    }

    /// With chains of `reads` dependent global-memory reads and `shared` dependent shared-memory
    /// reads, the longest one unit makes.
    pub(crate) fn waits(self, reads: usize, shared: usize) -> Self {
        Work { dependent_reads: reads as u64, shared_reads: shared as u64, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(kernel: &'static str) -> Work {
        Work { kernel, cubes: 1, units: 32, bytes: 8, flops: 2, dependent_reads: 1, shared_reads: 0 }
    }

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_tandem_kernel_is_named_by_its_module_and_function() {
        let launched = "tandem_ops::gpu::loss::forward_kernel::ForwardKernel<cubecl_wgpu::runtime::WgpuRuntime>";
        assert_eq!(kernel_of(launched).as_deref(), Some("loss::forward_kernel"));
        assert_eq!(kernel_of("cubek_matmul::launch::MatmulEntry<...>"), None);
    }

    #[test]
    fn launches_pair_with_the_entries_in_order_and_burns_with_none() {
        let launched = names(&[
            "tandem_ops::gpu::rows::gelu_kernel::GeluKernel<R>",
            "burn_cubecl::kernel::Add<R>",
            "tandem_ops::gpu::loss::forward_kernel::ForwardKernel<R>",
        ]);
        let paired = pair(launched, vec![work("rows::gelu_kernel"), work("loss::forward_kernel")]).unwrap();
        let kernels: Vec<_> = paired.iter().map(|(name, w)| (name.as_str(), w.as_ref().map(|w| w.kernel))).collect();
        assert_eq!(
            kernels,
            [
                ("rows::gelu_kernel", Some("rows::gelu_kernel")),
                ("burn_cubecl::kernel::Add<R>", None),
                ("loss::forward_kernel", Some("loss::forward_kernel"))
            ]
        );
    }

    #[test]
    fn a_launch_without_its_entry_or_an_entry_without_its_launch_is_named() {
        let gelu = || names(&["tandem_ops::gpu::rows::gelu_kernel::GeluKernel<R>"]);
        let err = pair(gelu(), vec![]).unwrap_err();
        assert_eq!(err, "rows::gelu_kernel was launched without a ledger entry");
        let err = pair(gelu(), vec![work("loss::forward_kernel")]).unwrap_err();
        assert_eq!(err, "rows::gelu_kernel was launched where the ledger has loss::forward_kernel next");
        let err = pair(gelu(), vec![work("rows::gelu_kernel"), work("loss::backward_kernel")]).unwrap_err();
        assert_eq!(err, "the ledger has loss::backward_kernel without its launch");
    }
}
