//! `summary.json`, written last in a run folder, and `rank-N.json`, what the other ranks of a
//! multi-process run record.

use serde::{Deserialize, Serialize};

use crate::figures::StrategyFigures;
use crate::metrics::ClassificationMetrics;
use crate::record::EpochRecord;

/// Whether a run finished.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    Finished,
    Failed,
    /// Stopped by a signal after writing a checkpoint: `tandem run` continues it.
    Interrupted,
}

/// `summary.json`: everything needed to read, compare and reproduce one run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RunSummary {
    /// The results format of the run folder ([`crate::FORMAT_VERSION`] when written by this
    /// build); absent in format 1, whose strategy figures are untyped maps.
    #[serde(default = "crate::legacy::format")]
    pub format_version: u32,
    pub status: RunStatus,
    /// Why the run failed (absent when it finished).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    pub experiment: String,
    pub run_id: String,
    pub model: String,
    pub architecture: String,
    pub strategy: String,
    /// The backend's name (see [`crate::BackendKind`]).
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
    /// Rows of the validation set (0: none; carved from the training rows).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub validation_samples: usize,
    pub holdout_samples: usize,
    pub vocab_size: usize,
    pub max_len: usize,
    pub parameters: usize,
    /// Epochs finished (stream mode: passes over the stream).
    pub epochs_completed: usize,
    /// Sum of the epochs' training time (evaluation excluded).
    pub train_seconds: f64,
    pub eval_seconds: f64,
    /// Wall clock over the records (training, evaluation, checkpoints and results writing; a
    /// resumed run's stretches added up): the end-to-end time; absent where a record lacks it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub wall_seconds: Option<f64>,
    pub train_samples_per_second: f64,
    /// Holdout metrics after the last completed epoch.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub final_metrics: Option<ClassificationMetrics>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub final_holdout_loss: Option<f64>,
    /// Validation metrics after the last completed epoch (absent without a validation set).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub final_validation: Option<ClassificationMetrics>,
    /// Epoch (1-based) with the best validation accuracy (holdout accuracy where there is no
    /// validation set), and that epoch's holdout accuracy.
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
    /// The strategy's figures of the last record.
    pub figures: StrategyFigures,
    /// Hash of the run's resolved `manifest.toml` (FNV-1a, hex): a rerun of the same run has
    /// the same one. Absent in folders written before it was recorded.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub manifest_hash: Option<String>,
    /// What the backend cannot promise about reproducing this run bit for bit (absent: the
    /// same manifest and seed give the same bytes).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reproducibility: Option<String>,
    /// The job's ranks, for a run spread over several processes (`mpirun`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cluster: Option<ClusterInfo>,
    /// GPU kernels launched per training step, evaluation left out (GPU backends): on a small
    /// model, what bounds a GPU step's time. All replicas or stages of the process together.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kernel_launches_per_step: Option<f64>,
    /// Rows a training step trains on, over every replica: `[train] batch_size`, or replicas ×
    /// it for data parallelism with a batch per replica. Absent in folders written before it was
    /// recorded.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub global_batch: Option<usize>,
    /// What this process wrote to its checkpoint since the run last started or resumed. Absent
    /// where it wrote none, and in folders written before it was recorded.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub checkpoints: Option<CheckpointWrites>,
}

/// What a run's summary says before it trains: which run, on what, with which data.
#[derive(Clone, Debug)]
pub struct RunStart {
    pub experiment: String,
    pub run_id: String,
    pub model: String,
    pub architecture: String,
    pub strategy: String,
    pub backend: String,
    pub machine: String,
    pub threads_per_device: usize,
    pub seed: u64,
    pub data: String,
    pub train_samples: usize,
    pub validation_samples: usize,
    pub holdout_samples: usize,
    pub vocab_size: usize,
    pub max_len: usize,
    pub tandem_version: String,
    pub started_at: String,
    pub manifest_hash: Option<String>,
    /// Rows a training step trains on, over every replica.
    pub global_batch: Option<usize>,
}

impl RunSummary {
    /// Whether the run trained sequentially (one model on one device, no figures of a parallel
    /// strategy): the baseline that speedups are measured against.
    pub fn is_sequential(&self) -> bool {
        matches!(self.figures, StrategyFigures::Sequential)
    }

    /// The summary of a run that has not trained yet: failed until it ends otherwise, with no
    /// epochs, devices or figures, in this build's format.
    pub fn begun(start: RunStart) -> Self {
        Self {
            format_version: crate::FORMAT_VERSION,
            status: RunStatus::Failed,
            error: None,
            experiment: start.experiment,
            run_id: start.run_id,
            model: start.model,
            architecture: start.architecture,
            strategy: start.strategy,
            backend: start.backend,
            devices: Vec::new(),
            shared_devices: false,
            machine: start.machine,
            threads_per_device: start.threads_per_device,
            seed: start.seed,
            data: start.data,
            train_samples: start.train_samples,
            validation_samples: start.validation_samples,
            holdout_samples: start.holdout_samples,
            vocab_size: start.vocab_size,
            max_len: start.max_len,
            parameters: 0,
            epochs_completed: 0,
            train_seconds: 0.0,
            eval_seconds: 0.0,
            wall_seconds: None,
            train_samples_per_second: 0.0,
            final_metrics: None,
            final_holdout_loss: None,
            final_validation: None,
            best_epoch: None,
            best_accuracy: None,
            prequential_accuracy: None,
            prequential_samples: 0,
            tandem_version: start.tandem_version,
            finished_at: start.started_at.clone(),
            started_at: start.started_at,
            figures: Default::default(),
            manifest_hash: start.manifest_hash,
            reproducibility: None,
            cluster: None,
            kernel_launches_per_step: None,
            global_batch: start.global_batch,
            checkpoints: None,
        }
    }

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
            self.final_validation = last.validation.as_ref().map(|v| v.metrics.clone());
            self.figures = last.figures.clone();
        }
        self.wall_seconds = records.iter().map(|r| r.wall_seconds).sum();
        if let Some(best) = records.iter().max_by(|a, b| a.judged_accuracy().total_cmp(&b.judged_accuracy())) {
            self.best_epoch = Some(best.epoch);
            self.best_accuracy = Some(best.holdout.accuracy);
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// `summary.json`'s `checkpoints` block: a checkpoint is written whole (a base) or as a patch
/// of what changed since the one before ([`crate::patched`]), so its cost follows what changed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct CheckpointWrites {
    /// Checkpoints written.
    pub written: usize,
    /// Of them, written whole.
    pub whole: usize,
    /// Bytes written to disk.
    pub bytes: u64,
    /// Bytes that writing every checkpoint whole would have taken.
    pub bytes_if_whole: u64,
}

impl CheckpointWrites {
    /// Counts one write of `contents` bytes that cost `cost`.
    pub fn add(&mut self, contents: usize, cost: crate::WriteCost) {
        self.written += 1;
        self.whole += usize::from(cost.whole);
        self.bytes += cost.bytes;
        self.bytes_if_whole += crate::sealed::sealed_len(contents) as u64;
    }
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
        let last = records.last().and_then(|r| r.figures.data_parallel());
        Self {
            replicas_per_rank: Some(replicas_per_rank),
            cross_rank_bytes_per_replica_per_step: Some(last.map_or(0.0, |f| f.cross_rank_bytes_per_replica_per_step)),
            ..Self::new(ranks, records)
        }
    }

    /// The block for `ranks` × `stages_per_rank` model-parallel stages.
    pub fn model_parallel(ranks: usize, stages_per_rank: usize, records: &[EpochRecord]) -> Self {
        let last = records.last().and_then(|r| r.figures.pipeline()?.across_ranks.as_ref());
        Self {
            stages_per_rank: Some(stages_per_rank),
            cross_rank_bytes_per_step: Some(last.map_or(0.0, |r| r.cross_rank_bytes_per_step)),
            ..Self::new(ranks, records)
        }
    }

    fn new(ranks: usize, records: &[EpochRecord]) -> Self {
        Self {
            ranks,
            replicas_per_rank: None,
            stages_per_rank: None,
            cross_rank_seconds: records.iter().map(|r| r.figures.cross_rank_seconds()).sum(),
            cross_rank_bytes_per_replica_per_step: None,
            cross_rank_bytes_per_step: None,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::{DataParallelFigures, PipelineFigures, PipelineRanks};
    use crate::metrics::ConfusionMatrix;

    fn record(figures: StrategyFigures) -> EpochRecord {
        EpochRecord {
            epoch: 1,
            stream: None,
            train_loss: 1.0,
            holdout_loss: 1.0,
            holdout: ClassificationMetrics::from_confusion(ConfusionMatrix::new(2)),
            validation: None,
            learning_rate: 1e-3,
            train_seconds: 1.0,
            eval_seconds: 0.1,
            wall_seconds: None,
            train_samples_per_second: 10.0,
            steps: 4,
            prequential_accuracy: None,
            prequential_samples: 0,
            figures,
        }
    }

    #[test]
    fn the_cluster_block_sums_cross_rank_time_and_keeps_the_last_bytes() {
        let pipeline = |seconds: f64, bytes: f64| {
            let ranks = PipelineRanks {
                ranks: 2,
                stages_per_rank: 2,
                cross_rank_bytes_per_step: bytes,
                cross_rank_seconds: seconds,
            };
            record(StrategyFigures::Pipeline(PipelineFigures { across_ranks: Some(ranks), ..Default::default() }))
        };
        let cluster = ClusterInfo::model_parallel(2, 2, &[pipeline(0.5, 100.0), pipeline(0.25, 300.0)]);
        assert_eq!((cluster.ranks, cluster.stages_per_rank, cluster.replicas_per_rank), (2, Some(2), None));
        assert_eq!((cluster.cross_rank_seconds, cluster.cross_rank_bytes_per_step), (0.75, Some(300.0)));

        let replicas = |seconds: f64, bytes: f64| {
            record(StrategyFigures::DataParallel(DataParallelFigures {
                ranks: 2,
                cross_rank_seconds: seconds,
                cross_rank_bytes_per_replica_per_step: bytes,
                ..Default::default()
            }))
        };
        let cluster = ClusterInfo::data_parallel(2, 3, &[replicas(1.0, 10.0), replicas(2.0, 20.0)]);
        assert_eq!((cluster.replicas_per_rank, cluster.cross_rank_seconds), (Some(3), 3.0));
        assert_eq!(cluster.cross_rank_bytes_per_replica_per_step, Some(20.0));
    }
}
