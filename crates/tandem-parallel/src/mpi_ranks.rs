//! [`Ranks`] over MPI (rsmpi): one process per rank, launched by `mpirun` or a batch scheduler.
//!
//! The waits of set-up and training are bounded: collectives are started non-blocking and
//! polled against a deadline. MPI cannot cancel a collective, so past the deadline the request
//! and its buffers are abandoned (leaked), the error goes back to the caller, which records what
//! it has and ends the whole job (`MPI_Abort`). A rank that dies is reported by the launcher,
//! which ends the others. (`MPI_Comm_dup` at start and `MPI_Finalize` at the end still block.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::request::{Request, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;

use crate::ranks::{launched_by_mpi, RankError, RankLink, Ranks};

/// How long the job's set-up collectives (checks, run names) wait for every rank.
const SETUP_TIMEOUT: Duration = Duration::from_secs(600);

/// A communicator that may move to another thread (`Send`) or be shared (`Sync`). Sound
/// because `join` insists on `MPI_THREAD_MULTIPLE` (any thread may call MPI), and Tandem calls
/// each communicator's collectives from one thread at a time: a link belongs to one replica
/// (`&mut self`), the world's collectives run on the thread that drives the run, and `abort`
/// may come from any thread (MPI allows that).
struct Comm(SimpleCommunicator);
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

/// This process's rank in an MPI job. Dropping it finalizes MPI.
pub struct MpiRanks {
    world: Comm,
    rank: usize,
    size: usize,
    host: String,
    _universe: Universe,
}

impl MpiRanks {
    /// Joins the MPI job this process was launched in; `None` when no MPI launcher started it.
    pub fn join() -> Result<Option<Self>, RankError> {
        if !launched_by_mpi() {
            return Ok(None);
        }
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| RankError::Mpi("MPI was already initialized in this process".into()))?;
        if threading != Threading::Multiple {
            return Err(RankError::Mpi(format!(
                "the MPI library offers thread level {threading:?}; Tandem's replicas call MPI from several threads and need MPI_THREAD_MULTIPLE"
            )));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "?".into());
        Ok(Some(Self { world: Comm(world), rank, size, host, _universe: universe }))
    }
}

impl MpiRanks {
    /// Rank 0's `text` on every rank, waiting at most `timeout` (`what`: what the wait is for,
    /// in the error of a wait in vain).
    fn broadcast(&self, text: &str, timeout: Duration, what: &str) -> Result<Vec<u8>, RankError> {
        let root = self.world.0.process_at_rank(0);
        let len = RequestBuffer::new(vec![text.len() as u64]);
        // SAFETY (both): each buffer is read only after its request completed.
        wait_within(root.immediate_broadcast_into(StaticScope, unsafe { len.lend() }), timeout, what, &NEVER)?;
        let len = unsafe { len.into_vec() }[0] as usize;
        if len == 0 {
            // Every rank knows there is nothing more (MPI refuses an empty buffer).
            return Ok(Vec::new());
        }
        let bytes = RequestBuffer::new(if self.rank == 0 { text.as_bytes().to_vec() } else { vec![0u8; len] });
        wait_within(root.immediate_broadcast_into(StaticScope, unsafe { bytes.lend() }), timeout, what, &NEVER)?;
        Ok(unsafe { bytes.into_vec() })
    }

    /// A set-up wait that failed means a rank is gone before anything was computed: end the job
    /// (returning would lead into `MPI_Finalize`, which waits for every rank).
    fn set_up(&self, waited: Result<(), RankError>) {
        if let Err(e) = waited {
            self.abort(&e.to_string())
        }
    }
}

impl Ranks for MpiRanks {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn host(&self) -> String {
        self.host.clone()
    }

    fn check_same(&self, what: &str, value: u64) -> Result<(), RankError> {
        let (send, all) = (RequestBuffer::new(vec![value]), RequestBuffer::new(vec![0u64; self.size]));
        // SAFETY: the buffers are read only after the request completed.
        let request = unsafe { self.world.0.immediate_all_gather_into(StaticScope, send.lend(), all.lend()) };
        self.set_up(wait_within(request, SETUP_TIMEOUT, &format!("comparing every rank's {what}"), &NEVER));
        let all = unsafe { all.into_vec() };
        let differing: Vec<usize> = (1..self.size).filter(|&r| all[r] != all[0]).collect();
        match differing.is_empty() {
            true => Ok(()),
            false => Err(RankError::Differ { what: what.to_string(), ranks: differing }),
        }
    }

    fn broadcast_text(&self, text: &str) -> Result<String, RankError> {
        let what = "receiving a setting from rank 0 (a run name, cut points)";
        let sent = self.broadcast(text, SETUP_TIMEOUT, what).unwrap_or_else(|e| self.abort(&e.to_string()));
        utf8(sent)
    }

    fn broadcast_text_within(&self, text: &str, timeout: Duration) -> Result<String, RankError> {
        utf8(self.broadcast(text, timeout, "receiving rank 0's word at the end of an epoch or evaluation point")?)
    }

    fn links(&self, count: usize) -> Result<Vec<Box<dyn RankLink>>, RankError> {
        // MPI_Comm_dup is collective: every rank duplicates in the same order.
        Ok((0..count).map(|_| Box::new(MpiLink(Comm(self.world.0.duplicate()))) as Box<dyn RankLink>).collect())
    }

    fn abort(&self, message: &str) -> ! {
        eprintln!("error: rank {} of {}: {message}; ending the MPI job", self.rank, self.size);
        SimpleCommunicator::world().abort(3)
    }
}

/// Text rank 0 sent.
fn utf8(bytes: Vec<u8>) -> Result<String, RankError> {
    String::from_utf8(bytes).map_err(|e| RankError::Mpi(format!("rank 0 sent text that is not UTF-8: {e}")))
}

/// A communicator of its own joining one thread of every rank: the same local replica of
/// each (gradient all-reduce), or the two ends of a stage boundary (point-to-point).
struct MpiLink(Comm);

impl MpiLink {
    fn all_reduce<T: Equivalence + Copy + Default + 'static>(
        &mut self,
        values: &mut [T],
        timeout: Duration,
        what: &str,
        stop: &AtomicBool,
    ) -> Result<(), RankError> {
        let (send, sum) = (RequestBuffer::new(values.to_vec()), RequestBuffer::new(vec![T::default(); values.len()]));
        // SAFETY: the buffers are read only after the request completed.
        let request = unsafe {
            self.0 .0.immediate_all_reduce_into(StaticScope, &*send.lend(), sum.lend(), SystemOperation::sum())
        };
        wait_within(request, timeout, what, stop)?;
        values.copy_from_slice(&unsafe { sum.into_vec() });
        drop(unsafe { send.into_vec() });
        Ok(())
    }
}

impl RankLink for MpiLink {
    fn all_reduce_sum(&mut self, values: &mut [f32], timeout: Duration) -> Result<(), RankError> {
        self.all_reduce(values, timeout, "in a gradient all-reduce across ranks", &NEVER)
    }

    fn all_reduce_sum_f64(
        &mut self,
        values: &mut [f64],
        timeout: Duration,
        stop: &AtomicBool,
    ) -> Result<(), RankError> {
        self.all_reduce(values, timeout, "in a sum across ranks", stop)
    }

    fn send(&mut self, to: usize, bytes: Vec<u8>, timeout: Duration, stop: &AtomicBool) -> Result<(), RankError> {
        let buffer = RequestBuffer::new(bytes);
        // SAFETY: the buffer is given back only after the request completed.
        let request = self.0 .0.process_at_rank(to as i32).immediate_send(StaticScope, unsafe { &*buffer.lend() });
        wait_within(request, timeout, &format!("sending to rank {to}"), stop)?;
        drop(unsafe { buffer.into_vec() });
        Ok(())
    }

    fn try_receive(&mut self, from: usize, timeout: Duration, stop: &AtomicBool) -> Result<Option<Vec<u8>>, RankError> {
        // A matched probe takes the message off the queue for this receive alone. Its contents
        // may still be on their way (a large message moves only while the sender takes part),
        // so the receive is non-blocking and bounded like every other wait.
        let Some((message, status)) = self.0 .0.process_at_rank(from as i32).immediate_matched_probe() else {
            return Ok(None);
        };
        let buffer = RequestBuffer::new(vec![0u8; status.count(u8::equivalent_datatype()).max(0) as usize]);
        // SAFETY: the buffer is read only after the request completed.
        let request = message.immediate_matched_receive_into(StaticScope, unsafe { buffer.lend() });
        wait_within(request, timeout, &format!("receiving from rank {from}"), stop)?;
        Ok(Some(unsafe { buffer.into_vec() }))
    }
}

/// A stop flag that is never raised, for waits that only a deadline ends.
static NEVER: AtomicBool = AtomicBool::new(false);

/// A heap buffer lent to a non-blocking MPI request for as long as MPI may use it. Its memory
/// is given back only through [`into_vec`](Self::into_vec), after the request completed; the
/// buffer of a request abandoned at its deadline is leaked, so MPI never writes to freed memory.
struct RequestBuffer<T>(*mut [T]);

impl<T> RequestBuffer<T> {
    fn new(values: Vec<T>) -> Self {
        Self(Box::into_raw(values.into_boxed_slice()))
    }

    /// The buffer, for the request.
    /// SAFETY: nothing else may touch it until the request completed.
    unsafe fn lend(&self) -> &'static mut [T] {
        unsafe { &mut *self.0 }
    }

    /// The contents, and the memory back.
    /// SAFETY: only once the request that borrowed it completed.
    unsafe fn into_vec(self) -> Vec<T> {
        unsafe { Box::from_raw(self.0) }.into_vec()
    }
}

/// Polls `request` until it completes. Past `timeout`, or once `stop` is raised, it abandons
/// the request (forgets it: MPI cannot cancel a collective, and dropping it unfinished would
/// abort the process) and fails.
fn wait_within<D: ?Sized>(
    mut request: Request<'static, D, StaticScope>,
    timeout: Duration,
    what: &str,
    stop: &AtomicBool,
) -> Result<(), RankError> {
    let started = Instant::now();
    loop {
        match request.test() {
            Ok(_) => return Ok(()),
            Err(pending) => request = pending,
        }
        let waited = started.elapsed();
        if waited > timeout || stop.load(Ordering::SeqCst) {
            std::mem::forget(request);
            return match waited > timeout {
                true => Err(RankError::Timeout { what: what.to_string(), seconds: timeout.as_secs_f64() }),
                false => Err(RankError::Stopped(what.to_string())),
            };
        }
        // Spin briefly (all-reduces are usually quick), then let the other threads compute.
        if waited > Duration::from_millis(1) {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}
