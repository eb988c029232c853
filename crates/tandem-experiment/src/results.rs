//! Results folders: `<out>/<experiment>/<run-id>/` with the resolved manifest, the vocabulary,
//! per-epoch metrics (`epochs.jsonl`) and `summary.json`. Every file is written atomically
//! (temporary file in the same folder, then rename), so a reader never sees half a file.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tandem_train::{ClassificationMetrics, EpochRecord};

/// Writes `contents` to `path` atomically.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes `value` as pretty JSON, atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    write_atomic(path, format!("{text}\n").as_bytes())
}

/// Writes the epoch records as JSON lines, atomically (the whole file is replaced each epoch).
pub fn write_epochs(path: &Path, records: &[EpochRecord]) -> std::io::Result<()> {
    let mut text = String::new();
    for r in records {
        text.push_str(&serde_json::to_string(r).map_err(std::io::Error::other)?);
        text.push('\n');
    }
    write_atomic(path, text.as_bytes())
}

/// Whether a run finished.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    Finished,
    Failed,
}

/// `summary.json`: everything needed to read, compare and reproduce one run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RunSummary {
    pub status: RunStatus,
    /// Why the run failed (absent when it finished).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    pub experiment: String,
    pub run_id: String,
    pub model: String,
    pub architecture: String,
    pub strategy: String,
    pub backend: String,
    pub devices: Vec<String>,
    /// Several replicas or stages ran on one GPU (a correctness check: its speed says nothing
    /// about scaling). Always false on CPU backends, where each replica or stage has its own cores.
    #[serde(default)]
    pub shared_devices: bool,
    /// The machine that ran it (see [`machine_description`]); empty in results older than the field.
    #[serde(default)]
    pub machine: String,
    /// Compute threads per device.
    pub threads_per_device: usize,
    pub seed: u64,
    /// E.g. "AG News test split, 80/20 re-split (seed 42)".
    pub data: String,
    pub train_samples: usize,
    pub holdout_samples: usize,
    pub vocab_size: usize,
    pub max_len: usize,
    pub parameters: usize,
    /// Epochs finished (stream mode: passes over the stream).
    pub epochs_completed: usize,
    /// Sum of the epochs' training time (evaluation excluded).
    pub train_seconds: f64,
    pub eval_seconds: f64,
    pub train_samples_per_second: f64,
    /// Holdout metrics after the last completed epoch.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub final_metrics: Option<ClassificationMetrics>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub final_holdout_loss: Option<f64>,
    /// Epoch (1-based) with the best holdout accuracy, and that accuracy.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub best_epoch: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub best_accuracy: Option<f64>,
    /// Test-then-train accuracy over the whole run: each training sample classified by the
    /// forward pass before the update that trains on it (in stream mode, the prequential
    /// accuracy); over `prequential_samples` samples (predicted steps run no forward pass).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub prequential_accuracy: Option<f64>,
    #[serde(default)]
    pub prequential_samples: usize,
    pub tandem_version: String,
    pub started_at: String,
    pub finished_at: String,
    /// Strategy-specific totals (communication, …) of the last epoch.
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The job's ranks, for a run spread over several processes (`mpirun`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cluster: Option<ClusterInfo>,
}

/// `summary.json`'s `cluster` block: how a multi-process run was spread, and what crossing
/// between ranks cost. The other ranks' own records are `rank-N.json` beside it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ClusterInfo {
    /// Processes in the job.
    pub ranks: usize,
    /// Data-parallel replicas each rank ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas_per_rank: Option<usize>,
    /// Model-parallel stages each rank ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages_per_rank: Option<usize>,
    /// Seconds spent moving data between ranks, summed over the epochs: by a replica in
    /// all-reduces (data parallel), or by all stages' relays in MPI sends and receives (model
    /// parallel).
    pub cross_rank_seconds: f64,
    /// Bytes a replica sent to other ranks per step, as a ring all-reduce moves them (data
    /// parallel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_rank_bytes_per_replica_per_step: Option<f64>,
    /// Bytes sent between ranks per step over all stage boundaries (model parallel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_rank_bytes_per_step: Option<f64>,
}

impl ClusterInfo {
    /// The block for `ranks` × `replicas_per_rank` data-parallel replicas.
    pub fn data_parallel(ranks: usize, replicas_per_rank: usize, records: &[EpochRecord]) -> Self {
        Self {
            replicas_per_rank: Some(replicas_per_rank),
            cross_rank_bytes_per_replica_per_step: Some(last_figure(records, "cross_rank_bytes_per_replica_per_step")),
            ..Self::new(ranks, records)
        }
    }

    /// The block for `ranks` × `stages_per_rank` model-parallel stages.
    pub fn model_parallel(ranks: usize, stages_per_rank: usize, records: &[EpochRecord]) -> Self {
        Self {
            stages_per_rank: Some(stages_per_rank),
            cross_rank_bytes_per_step: Some(last_figure(records, "cross_rank_bytes_per_step")),
            ..Self::new(ranks, records)
        }
    }

    fn new(ranks: usize, records: &[EpochRecord]) -> Self {
        Self {
            ranks,
            replicas_per_rank: None,
            stages_per_rank: None,
            cross_rank_seconds: records.iter().map(|r| figure(r, "cross_rank_seconds")).sum(),
            cross_rank_bytes_per_replica_per_step: None,
            cross_rank_bytes_per_step: None,
        }
    }
}

fn figure(record: &EpochRecord, key: &str) -> f64 {
    record.extra.get(key).and_then(serde_json::Value::as_f64).unwrap_or(0.0)
}

fn last_figure(records: &[EpochRecord], key: &str) -> f64 {
    records.last().map_or(0.0, |r| figure(r, key))
}

/// `rank-N.json`: what a rank other than 0 records of a multi-process run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RankLog {
    pub rank: usize,
    /// The machine it ran on, as MPI names it.
    pub host: String,
    pub status: RunStatus,
    /// Why this rank's part failed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// This rank's devices, as the backend names them.
    pub devices: Vec<String>,
    pub epochs_completed: usize,
    /// Training time on this rank (evaluation excluded).
    pub train_seconds: f64,
    pub started_at: String,
    pub finished_at: String,
}

impl RankLog {
    /// This rank's view of the run `summary` describes.
    pub fn new(rank: usize, host: String, summary: &RunSummary) -> Self {
        Self {
            rank,
            host,
            status: summary.status,
            error: summary.error.clone(),
            devices: summary.devices.clone(),
            epochs_completed: summary.epochs_completed,
            train_seconds: summary.train_seconds,
            started_at: summary.started_at.clone(),
            finished_at: summary.finished_at.clone(),
        }
    }
}

impl RunSummary {
    /// Fills the figures that derive from the epoch records.
    pub fn set_epochs(&mut self, records: &[EpochRecord]) {
        self.epochs_completed = records.iter().filter(|r| r.stream.as_ref().is_none_or(|s| s.pass_complete)).count();
        self.prequential_samples = records.iter().map(|r| r.prequential_samples).sum();
        let correct: f64 =
            records.iter().map(|r| r.prequential_accuracy.unwrap_or(0.0) * r.prequential_samples as f64).sum();
        self.prequential_accuracy = (self.prequential_samples > 0).then(|| correct / self.prequential_samples as f64);
        self.train_seconds = records.iter().map(|r| r.train_seconds).sum();
        self.eval_seconds = records.iter().map(|r| r.eval_seconds).sum();
        let samples: f64 = records.iter().map(|r| r.train_samples_per_second * r.train_seconds).sum();
        self.train_samples_per_second = samples / self.train_seconds.max(1e-9);
        if let Some(last) = records.last() {
            self.final_metrics = Some(last.holdout.clone());
            self.final_holdout_loss = Some(last.holdout_loss);
            self.extra = last.extra.clone();
        }
        if let Some(best) = records.iter().max_by(|a, b| a.holdout.accuracy.total_cmp(&b.holdout.accuracy)) {
            self.best_epoch = Some(best.epoch);
            self.best_accuracy = Some(best.holdout.accuracy);
        }
    }
}

/// This machine in one line: CPU model, logical cores, OS and architecture,
/// e.g. "Intel(R) Xeon(R) Platinum 8480C, 2 logical cores, linux x86_64".
pub fn machine_description() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpu}, {cores} logical cores, {} {}", std::env::consts::OS, std::env::consts::ARCH)
}

/// A UTC timestamp for folder names and records: `2026-11-30T15:04:05Z`.
pub fn now_utc() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// Creates a fresh run folder `<out>/<experiment>/<run-id>` (suffixing `-2`, `-3`… if taken).
pub fn create_run_dir(out: &Path, experiment: &str, run_id: &str) -> std::io::Result<(PathBuf, String)> {
    let parent = out.join(experiment);
    std::fs::create_dir_all(&parent)?;
    for attempt in 1.. {
        let id = if attempt == 1 { run_id.to_string() } else { format!("{run_id}-{attempt}") };
        match std::fs::create_dir(parent.join(&id)) {
            Ok(()) => return Ok((parent.join(&id), id)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("the attempt counter is unbounded")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn run_dirs_never_overwrite_an_earlier_run() {
        let dir = tempfile::tempdir().unwrap();
        let (a, id_a) = create_run_dir(dir.path(), "exp", "cnn-sequential-seed1").unwrap();
        let (b, id_b) = create_run_dir(dir.path(), "exp", "cnn-sequential-seed1").unwrap();
        assert_ne!(a, b);
        assert_eq!(id_a, "cnn-sequential-seed1");
        assert_eq!(id_b, "cnn-sequential-seed1-2");
    }
}
