//! What the strategies' worker threads (replicas, stages) share: their compute pools, and the
//! supervisor that runs them for an epoch — one scoped thread each, panics caught, progress
//! forwarded, a watchdog for workers that stop making progress, and one stop flag that every
//! worker polls so that the first failure ends them all.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::thread::Scope;
use std::time::Duration;

use crate::kind::BuildError;

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
pub(crate) fn thread_pools(
    workers: usize,
    threads: usize,
    kind: &'static str,
) -> Result<Vec<rayon::ThreadPool>, BuildError> {
    (0..workers)
        .map(|n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(move |i| format!("tandem-{kind}{n}-{i}"))
                .build()
                .map_err(|e| BuildError::Threads(format!("cannot start the threads of {kind} {n}: {e}")))
        })
        .collect()
}

/// What becomes of a run when a worker never returns (see [`on_stuck_worker`]).
pub type StuckHandler = Box<dyn Fn(&str) + Send>;

static STUCK: Mutex<Option<StuckHandler>> = Mutex::new(None);

/// Sets what happens when a worker still does not return one watchdog period after its run
/// was stopped: `handler` gets the message naming the stuck workers, to record the run's
/// failure and, if its caller chose so, end the process (a thread cannot be killed, and the
/// epoch's scope waits for it: this crate never exits the process itself). When the handler
/// returns, or without one (`None`), the supervisor waits for the worker.
pub fn on_stuck_worker(handler: Option<StuckHandler>) {
    *STUCK.lock().unwrap_or_else(|e| e.into_inner()) = handler;
}

/// Hands `message` to the stuck-worker handler, if any.
fn abandon(message: &str) {
    let handler = STUCK.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(handler) = handler {
        handler(message);
    }
}

/// Why a worker stopped: its own fault, or a consequence of another worker stopping or stalling.
#[derive(Debug)]
pub(crate) struct Failure {
    pub message: String,
    pub caused_elsewhere: bool,
    /// The worker this one waited for in vain (a timeout).
    pub waited_for: Option<usize>,
}

impl Failure {
    pub fn own(message: impl Into<String>) -> Self {
        Self { message: message.into(), caused_elsewhere: false, waited_for: None }
    }

    pub fn elsewhere(message: impl Into<String>) -> Self {
        Self { message: message.into(), caused_elsewhere: true, waited_for: None }
    }
}

/// How a supervised epoch ended when it did not finish.
#[derive(Debug)]
pub(crate) enum Stopped {
    /// A worker failed by itself (the first to do so), at its step `step` (1-based).
    Failed { worker: usize, step: usize, message: String },
    /// No worker reported progress for `after`; `laggards` were furthest behind, at `step`, and
    /// not waiting for another worker (unless all of them were).
    Stalled { laggards: Vec<usize>, step: usize, after: Duration },
    /// `waiter` gave up waiting for `peer`; steps done by each (0-based counts).
    WaitedInVain { waiter: usize, peer: usize, waiter_steps: usize, peer_steps: usize },
    /// A worker ended without a result.
    Unreported { worker: usize },
}

/// What a worker tells its supervisor.
enum Report<T> {
    Step {
        worker: usize,
        samples: usize,
    },
    /// The worker waits for a message from worker `on` (`None`: no longer).
    Waiting {
        worker: usize,
        on: Option<usize>,
    },
    Done {
        worker: usize,
        result: Result<T, Failure>,
    },
}

/// A worker's line to its supervisor.
pub(crate) struct Reporter<T> {
    worker: usize,
    reports: Sender<Report<T>>,
}

impl<T> Reporter<T> {
    /// One global batch of `samples` samples is done.
    pub fn step(&self, samples: usize) {
        let _ = self.reports.send(Report::Step { worker: self.worker, samples });
    }

    /// The worker starts (`Some(peer)`) or stops (`None`) waiting for a message from `peer`: a
    /// worker that waits is not the one a stall is blamed on.
    pub fn waiting_for(&self, peer: Option<usize>) {
        let _ = self.reports.send(Report::Waiting { worker: self.worker, on: peer });
    }
}

/// Where the workers of a call end when the caller asks them to stop: at the first step that
/// none of them had begun when one of them saw the ask. Every step before it runs on every
/// worker, so each message of those steps finds its receiver.
pub(crate) struct Gate<'a> {
    interrupt: &'a (dyn Fn() -> bool + Sync),
    /// Steps begun by each worker; the step the call ends at, once decided.
    state: Mutex<(Vec<usize>, Option<usize>)>,
}

impl<'a> Gate<'a> {
    /// A gate for `workers` workers, closed by `interrupt`; with `can_close` false (the workers
    /// of a multi-process job, whose processes would choose different steps) it never closes.
    pub fn new(workers: usize, interrupt: &'a (dyn Fn() -> bool + Sync), can_close: bool) -> Self {
        let interrupt = if can_close { interrupt } else { &|| false };
        Self { interrupt, state: Mutex::new((vec![0; workers], None)) }
    }

    /// Whether worker `slot` may begin its step `step` (0-based, in this call).
    pub fn may_begin(&self, slot: usize, step: usize) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (begun, end) = &mut *state;
        if end.is_none() && (self.interrupt)() {
            *end = Some(begun.iter().copied().max().unwrap_or(0));
        }
        match *end {
            Some(end) if step >= end => false,
            _ => {
                begun[slot] = step + 1;
                true
            }
        }
    }

    /// The steps the call ran: all `planned`, or fewer when it ended early.
    pub fn steps(&self, planned: usize) -> usize {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.1.map_or(planned, |end| end.min(planned))
    }
}

/// Runs workers for one epoch and watches them.
pub(crate) struct Supervisor<'a> {
    /// What a worker is, in messages (`replica`, `stage`).
    pub kind: &'static str,
    /// A run where no worker reports progress for this long stops.
    pub watchdog: Duration,
    /// Raised on the first failure or stall; every worker polls it.
    pub stop: &'a AtomicBool,
    /// The worker whose steps are forwarded as progress, and where to.
    pub progress_from: usize,
    pub on_batch: &'a (dyn Fn(usize) + Sync),
    /// Called once when the run stops (e.g. to release workers blocked in a collective).
    pub on_stop: &'a dyn Fn(),
}

impl Supervisor<'_> {
    /// Spawns one thread per `(index, worker)` in `scope`, each running `work` inside a caught
    /// panic, and waits for them all, forwarding progress. Returns the workers' results in the
    /// order given, or why the epoch stopped: the first failure of a worker's own is the cause;
    /// else a stall; else the first worker that waited in vain; else the first failure.
    pub fn run<'scope, 'env, W, T, F>(
        &self,
        scope: &'scope Scope<'scope, 'env>,
        workers: Vec<(usize, W)>,
        work: &'scope F,
    ) -> Result<Vec<T>, Stopped>
    where
        W: Send + 'scope,
        T: Send + 'scope,
        F: Fn(W, &Reporter<T>) -> Result<T, Failure> + Sync,
    {
        let (tx, rx) = mpsc::channel();
        let indices: Vec<usize> = workers.iter().map(|(index, _)| *index).collect();
        for (worker, state) in workers {
            let reporter = Reporter { worker, reports: tx.clone() };
            scope.spawn(move || {
                let result = catch_unwind(AssertUnwindSafe(|| work(state, &reporter)))
                    .unwrap_or_else(|panic| Err(Failure::own(format!("panicked: {}", panic_message(&panic)))));
                let _ = reporter.reports.send(Report::Done { worker, result });
            });
        }
        drop(tx);
        self.watch(&indices, rx)
    }

    fn watch<T>(&self, indices: &[usize], reports: mpsc::Receiver<Report<T>>) -> Result<Vec<T>, Stopped> {
        let slot = |worker: usize| indices.iter().position(|&i| i == worker).expect("a supervised worker");
        let mut done: Vec<Option<T>> = indices.iter().map(|_| None).collect();
        let mut steps = vec![0usize; indices.len()];
        let mut waiting: Vec<Option<usize>> = vec![None; indices.len()];
        let mut failures: Vec<(usize, Failure)> = Vec::new();
        let mut stalled: Option<Stopped> = None;
        let mut finished = 0;
        let stop = || {
            if !self.stop.swap(true, Ordering::SeqCst) {
                (self.on_stop)();
            }
        };
        while finished < indices.len() {
            match reports.recv_timeout(self.watchdog) {
                Ok(Report::Step { worker, samples }) => {
                    steps[slot(worker)] += 1;
                    if worker == self.progress_from {
                        (self.on_batch)(samples);
                    }
                }
                Ok(Report::Waiting { worker, on }) => waiting[slot(worker)] = on,
                Ok(Report::Done { worker, result }) => {
                    finished += 1;
                    match result {
                        Ok(value) => done[slot(worker)] = Some(value),
                        Err(failure) => {
                            stop();
                            failures.push((worker, failure));
                        }
                    }
                }
                // Workers blocked in a wait return once stopped; if they are still silent one
                // watchdog period after that, report rather than wait forever.
                Err(RecvTimeoutError::Timeout) if self.stop.load(Ordering::SeqCst) => {
                    let failed: Vec<usize> = failures.iter().map(|(w, _)| *w).collect();
                    let stuck: Vec<usize> =
                        (0..indices.len()).filter(|&s| done[s].is_none()).map(|s| indices[s]).collect();
                    let stuck: Vec<usize> = stuck.into_iter().filter(|w| !failed.contains(w)).collect();
                    let cause = failures
                        .iter()
                        .find(|(_, f)| !f.caused_elsewhere)
                        .map(|(w, f)| format!(" (after {} {w} failed: {})", self.kind, f.message));
                    abandon(&format!(
                        "{} {stuck:?} stopped making progress and did not stop within {} s{}",
                        self.kind,
                        self.watchdog.as_secs_f64() * 2.0,
                        cause.unwrap_or_default()
                    ));
                    break;
                }
                Err(RecvTimeoutError::Timeout) => {
                    let behind = steps.iter().copied().min().unwrap_or(0);
                    let behind: Vec<usize> =
                        (0..indices.len()).filter(|&s| done[s].is_none() && steps[s] == behind).collect();
                    // Those waiting for another worker are held up, not stuck (unless all wait).
                    let working: Vec<usize> = behind.iter().copied().filter(|&s| waiting[s].is_none()).collect();
                    let laggards = if working.is_empty() { behind } else { working };
                    let step = laggards.first().map_or(0, |&s| steps[s]) + 1;
                    stalled = Some(Stopped::Stalled {
                        laggards: laggards.into_iter().map(|s| indices[s]).collect(),
                        step,
                        after: self.watchdog,
                    });
                    stop();
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let steps_of = |worker: usize| steps[slot(worker)];
        let failed = |(worker, failure): (usize, Failure)| Stopped::Failed {
            worker,
            step: steps_of(worker) + 1,
            message: failure.message,
        };
        if let Some(own) = failures.iter().position(|(_, f)| !f.caused_elsewhere) {
            return Err(failed(failures.swap_remove(own)));
        }
        if let Some(stalled) = stalled {
            return Err(stalled);
        }
        let in_vain = failures.iter().find_map(|(waiter, f)| f.waited_for.map(|peer| (*waiter, peer)));
        if let Some((waiter, peer)) = in_vain {
            let peer_steps = indices.iter().position(|&i| i == peer).map_or(0, |s| steps[s]);
            return Err(Stopped::WaitedInVain { waiter, peer, waiter_steps: steps_of(waiter), peer_steps });
        }
        if let Some(first) = failures.into_iter().next() {
            return Err(failed(first));
        }
        done.into_iter().zip(indices).map(|(value, &worker)| value.ok_or(Stopped::Unreported { worker })).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_that_never_returns_is_named_alone_and_handed_to_the_stuck_handler() {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        on_stuck_worker(Some(Box::new(move |message: &str| {
            tx.lock().unwrap().send(message.to_string()).unwrap();
            // Stands in for the binary's process exit: this thread never comes back.
            loop {
                std::thread::park();
            }
        })));
        std::thread::spawn(|| {
            let stop = AtomicBool::new(false);
            let supervisor = Supervisor {
                kind: "replica",
                watchdog: Duration::from_millis(100),
                stop: &stop,
                progress_from: 0,
                on_batch: &|_| {},
                on_stop: &|| {},
            };
            let work = |worker: usize, _: &Reporter<()>| -> Result<(), Failure> {
                loop {
                    if worker == 0 && stop.load(Ordering::SeqCst) {
                        return Err(Failure::elsewhere("stopped"));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            };
            let _ = std::thread::scope(|scope| supervisor.run(scope, vec![(0, 0), (1, 1)], &work));
        });
        let message = rx.recv_timeout(Duration::from_secs(10)).expect("the stuck worker is reported in bounded time");
        assert!(message.starts_with("replica [1] stopped making progress"), "{message}");
    }
}
