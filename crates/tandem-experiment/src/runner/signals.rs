//! Ctrl-C and SIGTERM: the first one asks the run to stop after the step in progress (after
//! writing its checkpoint and an `interrupted` summary); a second one ends the process at once
//! (exit status 128 + the signal's number). The processes of a multi-process job stop where
//! rank 0 was asked to, at an epoch or evaluation point.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use signal_hook::consts::{SIGINT, SIGTERM};
use tandem_parallel::{RankError, Ranks};

/// Whether a stop was asked for, and by which signal.
pub(super) struct Interrupt {
    asked: Arc<AtomicBool>,
    signal: Arc<AtomicI32>,
}

impl Interrupt {
    /// The signal that asked to stop (`SIGINT` = 2, `SIGTERM` = 15), if one did.
    pub fn signal(&self) -> Option<i32> {
        self.asked.load(Ordering::SeqCst).then(|| self.signal.load(Ordering::SeqCst))
    }

    /// Takes on a stop another process of the job was asked for by `signal`.
    fn adopt(&self, signal: i32) {
        self.signal.store(signal, Ordering::SeqCst);
        self.asked.store(true, Ordering::SeqCst);
    }
}

/// The signal that stops the run at this point: this process's own; in a multi-process job,
/// rank 0's, which every rank adopts (every rank calls this at the same points, and waits for
/// rank 0's word as long as the strategy's `timeout` lets it wait for another rank).
pub(super) fn agreed_stop(ranks: Option<&dyn Ranks>, timeout: Duration) -> Result<Option<i32>, RankError> {
    let interrupt = interrupt();
    let Some(ranks) = ranks else { return Ok(interrupt.signal()) };
    let mine = interrupt.signal().map(|s| s.to_string()).unwrap_or_default();
    let told = ranks.broadcast_text_within(&mine, tandem_parallel::cross_rank_timeout(timeout))?;
    Ok(told.parse().ok().inspect(|&signal| interrupt.adopt(signal)))
}

/// The process's interrupt flag, listening from the first call on. Where the handlers cannot
/// be installed the signals keep their default action (the process ends; the last checkpoint
/// stays).
pub(super) fn interrupt() -> &'static Interrupt {
    static INTERRUPT: OnceLock<Interrupt> = OnceLock::new();
    INTERRUPT.get_or_init(|| {
        let interrupt = Interrupt { asked: Arc::new(AtomicBool::new(false)), signal: Arc::new(AtomicI32::new(0)) };
        for signal in [SIGINT, SIGTERM] {
            // Registered first, so it runs before `asked` is set: only a second signal exits.
            let installed =
                signal_hook::flag::register_conditional_shutdown(signal, 128 + signal, interrupt.asked.clone())
                    .and_then(|_| {
                        let which = interrupt.signal.clone();
                        let asked = interrupt.asked.clone();
                        // SAFETY: the handler only stores to atomics, which is async-signal-safe.
                        unsafe {
                            signal_hook::low_level::register(signal, move || {
                                which.store(signal, Ordering::SeqCst);
                                asked.store(true, Ordering::SeqCst);
                            })
                        }
                    });
            if let Err(e) = installed {
                eprintln!("note: cannot catch signal {signal} ({e}): it will end the run without a summary");
            }
        }
        interrupt
    })
}
