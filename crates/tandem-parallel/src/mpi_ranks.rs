//! [`Ranks`] over MPI (rsmpi): one process per rank, launched by `mpirun` or a batch scheduler.
//!
//! Every wait is bounded: collectives are started non-blocking and polled against a deadline.
//! MPI cannot cancel a collective, so a deadline that passes ends the whole job (`MPI_Abort`)
//! with a message naming the wait; a rank that dies is reported by the launcher, which ends the
//! others.

use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;

use crate::ranks::{launched_by_mpi, RankLink, Ranks};

/// How long the job's set-up collectives (checks, run names) wait for every rank.
const SETUP_TIMEOUT: Duration = Duration::from_secs(600);

/// A communicator handed to another thread. Sound because MPI runs with
/// `MPI_THREAD_MULTIPLE` (any thread may call it) and each communicator is used by one thread
/// at a time.
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
    pub fn join() -> Result<Option<Self>, String> {
        if !launched_by_mpi() {
            return Ok(None);
        }
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or("MPI was already initialized in this process")?;
        if threading != Threading::Multiple {
            return Err(format!(
                "the MPI library offers thread level {threading:?}; Tandem's replicas call MPI from several threads and need MPI_THREAD_MULTIPLE"
            ));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "?".into());
        Ok(Some(Self { world: Comm(world), rank, size, host, _universe: universe }))
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

    fn check_same(&self, what: &str, value: u64) -> Result<(), String> {
        let mut all = vec![0u64; self.size];
        mpi::request::scope(|scope| {
            let request = self.world.0.immediate_all_gather_into(scope, &value, &mut all[..]);
            wait_within(request, SETUP_TIMEOUT, &format!("comparing every rank's {what}"))
        })?;
        let differing: Vec<usize> = (1..self.size).filter(|&r| all[r] != all[0]).collect();
        match differing.is_empty() {
            true => Ok(()),
            false => Err(format!("rank(s) {differing:?} run a different {what} than rank 0 (every rank must run the same one)")),
        }
    }

    fn broadcast_text(&self, text: &str) -> Result<String, String> {
        let root = self.world.0.process_at_rank(0);
        let mut len = text.len() as u64;
        mpi::request::scope(|scope| wait_within(root.immediate_broadcast_into(scope, &mut len), SETUP_TIMEOUT, "receiving rank 0's run name"))?;
        let mut bytes = if self.rank == 0 { text.as_bytes().to_vec() } else { vec![0u8; len as usize] };
        mpi::request::scope(|scope| wait_within(root.immediate_broadcast_into(scope, &mut bytes[..]), SETUP_TIMEOUT, "receiving rank 0's run name"))?;
        String::from_utf8(bytes).map_err(|e| format!("rank 0 sent a run name that is not UTF-8: {e}"))
    }

    fn replica_links(&self, replicas: usize) -> Result<Vec<Box<dyn RankLink>>, String> {
        // MPI_Comm_dup is collective: every rank duplicates in the same order.
        Ok((0..replicas).map(|_| Box::new(MpiLink(Comm(self.world.0.duplicate()))) as Box<dyn RankLink>).collect())
    }

    fn abort(&self, message: &str) -> ! {
        abort_job(message)
    }
}

/// One replica's communicator with the same replica of every other rank.
struct MpiLink(Comm);

impl RankLink for MpiLink {
    fn all_reduce_sum(&self, values: &mut [f32], timeout: Duration) -> Result<(), String> {
        let send = values.to_vec();
        mpi::request::scope(|scope| {
            let request = self.0 .0.immediate_all_reduce_into(scope, &send[..], values, SystemOperation::sum());
            wait_within(request, timeout, "in a gradient all-reduce across ranks")
        })
    }
}

/// Polls `request` until it completes; past `timeout` ends the job (the request cannot be
/// cancelled, and dropping it unfinished would abort anyway).
fn wait_within<'a, D: ?Sized, S: Scope<'a>>(mut request: Request<'a, D, S>, timeout: Duration, what: &str) -> Result<(), String> {
    let started = Instant::now();
    loop {
        match request.test() {
            Ok(_) => return Ok(()),
            Err(pending) => request = pending,
        }
        let waited = started.elapsed();
        if waited > timeout {
            abort_job(&format!("no answer from the other ranks for {} s while {what}; a rank is stuck or gone", timeout.as_secs_f64()));
        }
        // Spin briefly (all-reduces are usually quick), then let the other threads compute.
        if waited > Duration::from_millis(1) {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn abort_job(message: &str) -> ! {
    let world = SimpleCommunicator::world();
    eprintln!("error: rank {} of {}: {message}; ending the MPI job", world.rank(), world.size());
    world.abort(3)
}
