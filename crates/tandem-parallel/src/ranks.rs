//! The processes ("ranks") of a multi-process job, as the strategies see them.
//!
//! A job runs one Tandem process per rank (launched by `mpirun` or a batch scheduler). Each rank
//! runs its own local replicas; [`Ranks`] tells a process its place in the job and gives each
//! local replica a [`RankLink`]: replica `j` of every rank reduces its gradients over link `j`.
//! The MPI implementation is `MpiRanks` (feature `mpi`).

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Why a job-wide operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RankError {
    /// `ranks` hold another `what` than rank 0, where every rank must hold the same.
    #[error("rank(s) {ranks:?} have a different {what} from rank 0's (every rank must have the same)")]
    Differ { what: String, ranks: Vec<usize> },
    /// No rank answered within `seconds` while doing `what`.
    #[error("no answer from the other ranks for {seconds} s while {what}; a rank is stuck or gone")]
    Timeout { what: String, seconds: f64 },
    /// The run stopped (a worker failed) while this wait for `what` was on.
    #[error("stopped while {0}")]
    Stopped(String),
    /// The MPI library cannot serve the job, or a rank sent what cannot be read.
    #[error("{0}")]
    Mpi(String),
}

/// This process's place in a multi-process job, and the job-wide operations Tandem needs.
pub trait Ranks: Send + Sync {
    /// This process's rank, `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the job.
    fn size(&self) -> usize;
    /// This rank's host name.
    fn host(&self) -> String;
    /// Collective (call from one thread): fails on every rank when ranks disagree on `value`,
    /// naming the ranks whose `what` differs from rank 0's. A rank that does not take part in
    /// time ends the job (nothing has been computed yet).
    fn check_same(&self, what: &str, value: u64) -> Result<(), RankError>;
    /// Collective (call from one thread): rank 0's `text`, on every rank. A rank that does not
    /// take part in time ends the job (a set-up step: nothing has been computed yet).
    fn broadcast_text(&self, text: &str) -> Result<String, RankError>;
    /// Collective (call from one thread) during a run: rank 0's `text`, on every rank, or an
    /// error after waiting `timeout` for a rank (so that the run can record what it has).
    fn broadcast_text_within(&self, text: &str, timeout: Duration) -> Result<String, RankError>;
    /// Collective (call from one thread): `count` links, each joining the same link of every
    /// rank (every rank asks for the same number, e.g. one per local replica).
    fn links(&self, count: usize) -> Result<Vec<Box<dyn RankLink>>, RankError>;
    /// Ends every rank of the job, after printing `message`: for failures that would leave the
    /// other ranks waiting in a collective.
    fn abort(&self, message: &str) -> !;
}

impl fmt::Debug for dyn Ranks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} of {}", self.rank(), self.size())
    }
}

/// A channel joining one thread of every rank (e.g. the same local replica, or the two ends of
/// a stage boundary); used by one thread at a time.
///
/// Every wait is bounded. A wait that fails leaves the job unable to go on (MPI cannot cancel
/// what it started), so the caller records what it has and then ends the job ([`Ranks::abort`]).
pub trait RankLink: Send {
    /// Sums `values` element-wise over all ranks, in place. Fails when a rank has not joined
    /// within `timeout`.
    fn all_reduce_sum(&mut self, values: &mut [f32], timeout: Duration) -> Result<(), RankError>;
    /// [`all_reduce_sum`](Self::all_reduce_sum) in `f64`, for figures that must stay exact
    /// (byte counts, loss sums, squared gradient norms); fails early when `stop` is raised.
    fn all_reduce_sum_f64(&mut self, values: &mut [f64], timeout: Duration, stop: &AtomicBool)
        -> Result<(), RankError>;
    /// Sends `bytes` to rank `to` and waits until the link has taken them (messages to one rank
    /// arrive in the order sent). Fails past `timeout`, or early when `stop` is raised.
    fn send(&mut self, to: usize, bytes: Vec<u8>, timeout: Duration, stop: &AtomicBool) -> Result<(), RankError>;
    /// The next message from rank `from`, if one has begun to arrive (it does not wait for one
    /// to come); receiving it fails past `timeout`, or early when `stop` is raised.
    fn try_receive(&mut self, from: usize, timeout: Duration, stop: &AtomicBool) -> Result<Option<Vec<u8>>, RankError>;
}

/// How long a wait on another rank lasts: a little less than `timeout`, the strategy's
/// watchdog's, so that the wait fails first and names the rank rather than the watchdog naming
/// a replica or stage that was waiting for it.
pub fn cross_rank_timeout(timeout: Duration) -> Duration {
    timeout.mul_f64(0.9)
}

/// Collective: fails on every rank unless all ranks start from the same parameters.
pub(crate) fn check_same_parameters<B: burn::tensor::backend::Backend>(
    ranks: &dyn Ranks,
    model: &tandem_models::Classifier<B>,
) -> Result<(), RankError> {
    let bits: Vec<u8> = model.parameter_values().iter().flat_map(|v| v.to_le_bytes()).collect();
    ranks.check_same("initial parameters", fingerprint(&bits))
}

/// A replica's link to the other ranks, with the figures its all-reduce accounting needs.
pub(crate) struct CrossRank {
    pub link: Box<dyn RankLink>,
    pub ranks: usize,
    pub timeout: Duration,
}

impl fmt::Debug for CrossRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CrossRank {{ ranks: {} }}", self.ranks)
    }
}

/// Environment variables that MPI launchers set in each process they start (OpenMPI, MPICH /
/// Intel MPI's Hydra, PMIx launchers such as Slurm's `srun --mpi=pmix`).
const LAUNCHER_VARIABLES: [&str; 4] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"];

/// Whether an MPI launcher (`mpirun`, `srun`…) started this process.
pub fn launched_by_mpi() -> bool {
    LAUNCHER_VARIABLES.iter().any(|v| std::env::var_os(v).is_some())
}

/// The launcher and its options when `$TANDEM_MPIRUN` does not name one: OpenMPI's or MPICH's
/// `mpirun`, cores unbound (each rank's compute threads are its own).
const DEFAULT_LAUNCHER: &str = "mpirun --bind-to none";

/// The command that runs `program` with `args` as `ranks` processes of an MPI job on this
/// machine: `$TANDEM_MPIRUN` (split at spaces) or `mpirun --bind-to none`, allowed to start as
/// root (containers) and more ranks than cores. Also returns the launcher's name, for errors.
pub fn local_ranks_command(
    ranks: usize,
    program: &std::path::Path,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<(std::process::Command, String), String> {
    let launcher = std::env::var("TANDEM_MPIRUN").unwrap_or_else(|_| DEFAULT_LAUNCHER.to_string());
    let mut words = launcher.split_whitespace();
    let name = words.next().ok_or("TANDEM_MPIRUN is set but empty: name an MPI launcher, e.g. `mpirun`")?;
    let mut job = std::process::Command::new(name);
    job.args(words)
        .args(["-np", &ranks.to_string()])
        .arg(program)
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1");
    Ok((job, name.to_string()))
}

/// The job size an MPI launcher announced, where it says (OpenMPI, Hydra, Slurm).
pub fn launched_job_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"].iter().find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// FNV-1a: a stable 64-bit hash of `bytes`, the same on every machine and build (for comparing
/// manifests and data across ranks).
pub fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
