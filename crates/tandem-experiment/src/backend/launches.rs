//! Counts the GPU kernels this process launches.
//!
//! A small model's GPU training step is bound by how many kernels it launches, each costing
//! microseconds of launch and framework overhead, not by its arithmetic; the count is the figure
//! to watch. CubeCL (built with its `tracing` feature) opens a trace-level span for every kernel
//! it launches, on every backend and device; [`install`] makes a process-wide tracing subscriber
//! that counts those spans and ignores everything else, so that [`count`] can be read before and
//! after any piece of work, and [`name_launches`] makes it write down each kernel's name too, for
//! the kernel table. Without [`install`], or in a build without GPU backends, nothing is counted
//! and nothing costs anything.

use std::sync::atomic::{AtomicU64, Ordering};

use tandem_ops::ledger::Recorder;

/// Kernels launched since [`install`].
static LAUNCHES: AtomicU64 = AtomicU64::new(0);
/// Their names since [`name_launches`].
static NAMES: Recorder<String> = Recorder::new();

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use tracing::{
    span::{Attributes, Id, Record},
    subscriber::Interest,
    Event, Metadata, Subscriber,
};

/// The span CubeCL's compute client opens around each kernel launch.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn is_launch(metadata: &Metadata<'_>) -> bool {
    metadata.name() == "launch_inner" && metadata.target().starts_with("cubecl_runtime")
}

/// Counts launch spans; every other span and event is disabled at its call site.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
struct LaunchCounter;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl Subscriber for LaunchCounter {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if is_launch(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        is_launch(metadata)
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        LAUNCHES.fetch_add(1, Ordering::Relaxed);
        NAMES.push(|| {
            let mut name = KernelName(String::new());
            span.record(&mut name);
            name.0
        });
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, _event: &Event<'_>) {}

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

/// The `kernel.name` field of a launch span.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
struct KernelName(String);

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl tracing::field::Visit for KernelName {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "kernel.name" {
            self.0 = format!("{value:?}");
        }
    }
}

/// Starts writing down the name of every kernel launched from now on (with [`install`]), in
/// launch order; the names before are forgotten.
pub fn name_launches() {
    NAMES.open();
}

/// Stops writing down names and returns those since [`name_launches`].
pub fn named_launches() -> Vec<String> {
    NAMES.close()
}

/// Starts counting kernel launches in this process. Returns `false` (and counts nothing) if
/// another global tracing subscriber was installed first, or the build has no GPU backend.
pub fn install() -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        static INSTALLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *INSTALLED.get_or_init(|| tracing::subscriber::set_global_default(LaunchCounter).is_ok())
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    false
}

/// Kernels launched in this process since [`install`] (queued for the device: with Burn's fusion
/// a kernel is launched when its stream of operations is flushed).
pub fn count() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// Whether [`install`] is counting launches in this process.
pub fn counting() -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        tracing::dispatcher::get_default(|dispatch| dispatch.is::<LaunchCounter>())
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    false
}

/// The launches of a run's training steps alone: from the start of each epoch (or evaluation
/// point) to its last step, leaving out evaluation and checkpoints. With Burn's fusion a step's
/// last kernels may be launched only when the next work flushes them, so a few of each epoch's
/// last step count as evaluation: the figure is exact to within a step per epoch.
#[derive(Debug, Default)]
pub struct StepLaunches {
    /// The count when the current epoch began, and after its last step so far; its steps so far.
    started: AtomicU64,
    last_step: AtomicU64,
    window_steps: AtomicU64,
    /// Launches of the finished epochs' steps, and their steps.
    launched: AtomicU64,
    steps: AtomicU64,
}

impl StepLaunches {
    /// Starts the first epoch's window now.
    pub fn new() -> Self {
        let now = count();
        Self { started: AtomicU64::new(now), last_step: AtomicU64::new(now), ..Default::default() }
    }

    /// A training step has finished (called once per step, by one worker).
    pub fn step(&self) {
        self.last_step.store(count(), Ordering::Relaxed);
        self.window_steps.fetch_add(1, Ordering::Relaxed);
    }

    /// An epoch or evaluation point is over (its evaluation done): closes its window.
    pub fn point(&self) {
        let (started, last) = (self.started.load(Ordering::Relaxed), self.last_step.load(Ordering::Relaxed));
        self.launched.fetch_add(last.saturating_sub(started), Ordering::Relaxed);
        self.steps.fetch_add(self.window_steps.swap(0, Ordering::Relaxed), Ordering::Relaxed);
        let now = count();
        self.started.store(now, Ordering::Relaxed);
        self.last_step.store(now, Ordering::Relaxed);
    }

    /// Launches per training step over the closed windows; `None` where nothing is counted.
    pub fn per_step(&self) -> Option<f64> {
        let steps = self.steps.load(Ordering::Relaxed);
        (counting() && steps > 0).then(|| self.launched.load(Ordering::Relaxed) as f64 / steps as f64)
    }
}
