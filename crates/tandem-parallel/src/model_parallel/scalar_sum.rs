//! A scalar all-reduce between the devices of a model-parallel run: the squared gradient norms
//! for clipping by the global norm, and whatever a step policy agrees on (sync votes, a loss).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::ranks::{cross_rank_timeout, RankLink};
use crate::supervisor::Failure;

/// Values are summed in device order, so every run sums them identically, across ranks too:
/// there each rank fills its own devices' slots of a vector that an all-reduce sums (one non-zero
/// value per slot, so exactly), and then sums it in order.
pub(super) struct ScalarSum<'l> {
    /// Round number, this round's values from the local devices, and the last round's sum.
    state: Mutex<(u64, Vec<Option<f64>>, f64)>,
    changed: Condvar,
    /// The devices this process runs, and the link summing in the other ranks' devices.
    local: Range<usize>,
    across: Option<(usize, Mutex<&'l mut dyn RankLink>)>,
    /// What is summed, for error messages.
    what: &'static str,
}

impl<'l> ScalarSum<'l> {
    /// A sum of `what` over `devices` devices, of which this process runs `local`; `across`
    /// links the other ranks when they run the rest.
    pub fn new(what: &'static str, local: Range<usize>, devices: usize, across: Option<&'l mut dyn RankLink>) -> Self {
        Self {
            state: Mutex::new((0, vec![None; local.len()], 0.0)),
            changed: Condvar::new(),
            local,
            across: across.map(|link| (devices, Mutex::new(link))),
            what,
        }
    }

    /// Adds `device`'s `value` to this round and waits for the round's sum, at most `timeout`.
    pub fn sum(&self, device: usize, value: f64, timeout: Duration, stop: &AtomicBool) -> Result<f64, Failure> {
        let started = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let round = state.0;
        state.1[device - self.local.start] = Some(value);
        if state.1.iter().all(Option::is_some) {
            let mut values: Vec<f64> = state.1.iter_mut().map(|v| v.take().unwrap_or(0.0)).collect();
            if let Some((devices, link)) = &self.across {
                // The other local devices wait for this round's result meanwhile.
                drop(state);
                let mut slots = vec![0.0; *devices];
                slots[self.local.clone()].copy_from_slice(&values);
                link.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .all_reduce_sum_f64(&mut slots, cross_rank_timeout(timeout), stop)
                    .map_err(|e| Failure::own(format!("summing {}: {e}", self.what)))?;
                values = slots;
                state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            }
            state.2 = values.iter().sum();
            state.0 += 1;
            self.changed.notify_all();
            return Ok(state.2);
        }
        loop {
            state = self.changed.wait_timeout(state, Duration::from_millis(20)).unwrap_or_else(|e| e.into_inner()).0;
            if state.0 != round {
                return Ok(state.2);
            }
            if stop.load(Ordering::SeqCst) {
                return Err(Failure::elsewhere("stopped"));
            }
            if started.elapsed() >= timeout {
                return Err(Failure::elsewhere(format!(
                    "waited {} s for the other stages' {}",
                    timeout.as_secs_f64(),
                    self.what
                )));
            }
        }
    }
}
