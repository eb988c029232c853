//! A model-parallel epoch's figures: what each device measured, summed across ranks in a
//! multi-process job, and turned into the strategy's figures for the results.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;
use tandem_results::{LinkFigures, PipelineFigures, PipelineRanks, StrategyFigures, SyncFigures, TrafficPerStep};
use tandem_train::TrainStats;

use super::payload::StageCodecs;
use super::relay::Relayed;
use super::stage::Stage;
use super::wiring::Placement;
use super::ModelParallel;
use crate::link::Traffic;
use crate::ranks::RankLink;
use crate::schedule::theoretical_bubble;

/// One device's epoch figures.
#[derive(Default)]
pub(super) struct DeviceEpoch {
    pub loss_sum: f64,
    /// Samples trained on (last stage), samples of skipped steps, and samples of skipped steps
    /// trained on later (replay).
    pub samples: usize,
    pub skipped_samples: usize,
    pub replayed_samples: usize,
    /// Samples trained on that the last stage's forward pass classified correctly.
    pub correct: usize,
    /// Time in the step policy's own work (waits for other devices count as idle).
    pub predict: Duration,
    pub compute: Duration,
    pub transfer: Duration,
    pub idle: Duration,
    pub wall: Duration,
    pub peak_live: usize,
    /// Bytes of the step policy's control messages.
    pub control_bytes: u64,
    /// Bytes of labels sent to stages before the last (local learning).
    pub label_bytes: u64,
    /// Samples the last stage trained on again from its replay buffer, outside real steps.
    pub own_replayed: usize,
    /// Across ranks: what the relays of this device's links to other ranks moved (the bytes it
    /// sent, the time spent in sends and receives).
    pub relayed: Relayed,
    /// Per stage boundary, what this device sent on it forward and backward.
    pub forward: Vec<Traffic>,
    pub backward: Vec<Traffic>,
}

/// Figures of [`DeviceEpoch`] besides the per-boundary traffic.
const SCALARS: usize = 16;

impl DeviceEpoch {
    /// An empty epoch of a pipeline with `boundaries` stage boundaries.
    pub fn new(boundaries: usize) -> Self {
        Self {
            forward: vec![Traffic::default(); boundaries],
            backward: vec![Traffic::default(); boundaries],
            ..Default::default()
        }
    }

    /// Adds `elapsed` spent in a policy call, of which `waited` waiting for other devices.
    pub fn add_policy_time(&mut self, elapsed: Duration, waited: Duration) {
        self.idle += waited;
        self.predict += elapsed.saturating_sub(waited);
    }

    /// The figures as numbers, to sum across ranks (counts stay exact in `f64`).
    fn to_figures(&self) -> Vec<f64> {
        let s = |d: Duration| d.as_secs_f64();
        let mut figures = vec![
            self.loss_sum,
            self.samples as f64,
            self.skipped_samples as f64,
            s(self.predict),
            s(self.compute),
            s(self.transfer),
            s(self.idle),
            s(self.wall),
            self.peak_live as f64,
            self.control_bytes as f64,
            self.relayed.bytes as f64,
            s(self.relayed.busy),
            self.replayed_samples as f64,
            self.correct as f64,
            self.label_bytes as f64,
            self.own_replayed as f64,
        ];
        for t in self.forward.iter().chain(&self.backward) {
            figures.extend([t.messages as f64, t.bytes as f64]);
        }
        figures
    }

    fn from_figures(v: &[f64], boundaries: usize) -> Self {
        let d = |x: f64| Duration::from_secs_f64(x.max(0.0));
        let traffic = |i: usize| Traffic { messages: v[SCALARS + 2 * i] as u64, bytes: v[SCALARS + 2 * i + 1] as u64 };
        Self {
            loss_sum: v[0],
            samples: v[1] as usize,
            skipped_samples: v[2] as usize,
            predict: d(v[3]),
            compute: d(v[4]),
            transfer: d(v[5]),
            idle: d(v[6]),
            wall: d(v[7]),
            peak_live: v[8] as usize,
            control_bytes: v[9] as u64,
            relayed: Relayed { bytes: v[10] as u64, busy: d(v[11]) },
            replayed_samples: v[12] as usize,
            correct: v[13] as usize,
            label_bytes: v[14] as u64,
            own_replayed: v[15] as usize,
            forward: (0..boundaries).map(traffic).collect(),
            backward: (boundaries..2 * boundaries).map(traffic).collect(),
        }
    }
}

/// Across ranks, at the end of an epoch: every device's figures and every stage's parameters on
/// every rank (the figures for the results, the parameters for evaluating and saving the whole
/// model).
pub(super) fn gather_epoch<B: AutodiffBackend>(
    stages: &mut [Stage<B>],
    placement: &Placement,
    link: &mut dyn RankLink,
    timeout: Duration,
    local: Vec<DeviceEpoch>,
) -> Result<Vec<DeviceEpoch>, String> {
    let boundaries = stages.len().saturating_sub(1);
    let per_device = SCALARS + 4 * boundaries;
    let mut figures = vec![0.0; placement.devices * per_device];
    for (d, epoch) in placement.local.clone().zip(&local) {
        figures[d * per_device..(d + 1) * per_device].copy_from_slice(&epoch.to_figures());
    }
    link.all_reduce_sum_f64(&mut figures, timeout, &AtomicBool::new(false))
        .map_err(|e| format!("gathering the epoch's figures: {e}"))?;
    // Each rank fills its own stages' values; the sum puts every stage's everywhere.
    let mut offsets = vec![0];
    for stage in stages.iter() {
        offsets.push(offsets.last().copied().unwrap_or(0) + stage.module().parameter_count());
    }
    let mut values = vec![0f32; offsets[stages.len()]];
    for s in (0..stages.len()).filter(|&s| placement.runs_stage(s)) {
        values[offsets[s]..offsets[s + 1]].copy_from_slice(&stages[s].module().parameter_values());
    }
    link.all_reduce_sum(&mut values, timeout).map_err(|e| format!("gathering the stages' parameters: {e}"))?;
    for (s, stage) in stages.iter_mut().enumerate().filter(|(s, _)| !placement.runs_stage(*s)) {
        stage.set_parameter_values(&values[offsets[s]..offsets[s + 1]]);
    }
    Ok(figures.chunks(per_device).map(|f| DeviceEpoch::from_figures(f, boundaries)).collect())
}

impl<B: AutodiffBackend> ModelParallel<B> {
    /// The devices' epochs as the strategy's figures: per device time split and activations
    /// kept, per boundary traffic per step, and the bubble against the ideal pipeline's.
    pub(super) fn epoch_stats(&mut self, epochs: &[DeviceEpoch], steps: usize) -> TrainStats {
        // The device with the model's last stage: it has the loss.
        let last = epochs.last().expect("at least one device");
        let per_step = |x: f64| x / steps.max(1) as f64;
        let seconds = |f: fn(&DeviceEpoch) -> Duration| epochs.iter().map(|e| f(e).as_secs_f64()).collect::<Vec<f64>>();
        let bubble: Vec<f64> = epochs.iter().map(|e| e.idle.as_secs_f64() / e.wall.as_secs_f64().max(1e-12)).collect();
        let traffic = |of: fn(&DeviceEpoch) -> &[Traffic], boundary: usize| {
            epochs.iter().map(|e| of(e)[boundary]).fold(Traffic::default(), |sum, t| Traffic {
                messages: sum.messages + t.messages,
                bytes: sum.bytes + t.bytes,
            })
        };
        let boundaries: Vec<(Traffic, Traffic)> = (0..self.stages.len().saturating_sub(1))
            .map(|b| (traffic(|e| &e.forward, b), traffic(|e| &e.backward, b)))
            .collect();
        let on_link =
            |t: Traffic| TrafficPerStep { messages: per_step(t.messages as f64), bytes: per_step(t.bytes as f64) };
        let links =
            boundaries.iter().map(|&(f, b)| LinkFigures { forward: on_link(f), backward: on_link(b) }).collect();
        let control: u64 = epochs.iter().map(|e| e.control_bytes).sum();
        let labels: u64 = epochs.iter().map(|e| e.label_bytes).sum();
        let bytes: u64 = boundaries.iter().map(|(f, b)| f.bytes + b.bytes).sum::<u64>() + control + labels;
        let transfer_share =
            epochs.iter().map(|e| e.transfer.as_secs_f64() / e.wall.as_secs_f64().max(1e-12)).sum::<f64>()
                / epochs.len() as f64;
        // As run: a batch smaller than `micro_batches` runs one micro-batch per sample.
        let micro = self.config.micro_batches_for(self.train.batch_size);
        // This process's first device's policy speaks for the protocol (sync counts are the same
        // on every device); control bytes and prediction time are summed or listed per device.
        let protocols: Vec<SyncFigures> = self.policies.iter_mut().map(|p| p.take_epoch_figures()).collect();
        let sync = protocols.into_iter().nth(self.placement.local.start).map(|protocol| SyncFigures {
            control_bytes_per_step: per_step(control as f64),
            label_bytes_per_step: per_step(labels as f64),
            aux_parameters: self.stages.iter().map(|s| s.add_on_parameters()).collect(),
            predict_seconds: seconds(|e| e.predict),
            replayed_samples: last.replayed_samples + last.own_replayed,
            ..protocol
        });
        let across_ranks = self.across.as_ref().map(|_| PipelineRanks {
            ranks: self.placement.ranks,
            stages_per_rank: self.placement.per_rank,
            cross_rank_bytes_per_step: per_step(epochs.iter().map(|e| e.relayed.bytes).sum::<u64>() as f64),
            cross_rank_seconds: epochs.iter().map(|e| e.relayed.busy.as_secs_f64()).sum::<f64>(),
        });
        let figures = PipelineFigures {
            stages: epochs.len(),
            virtual_stages: self.config.virtual_stages,
            cuts: self.cuts.clone(),
            schedule: self.config.schedule.name().into(),
            micro_batches: micro,
            interconnect: self.config.interconnect.name().into(),
            compression: (!self.config.compression.is_lossless())
                .then(|| self.config.compression.label().trim_start_matches('-').to_string()),
            stage_parameters: self.stages.iter().map(|s| s.module().parameter_count()).collect(),
            compute_seconds: seconds(|e| e.compute),
            transfer_seconds: seconds(|e| e.transfer),
            idle_seconds: seconds(|e| e.idle),
            bubble_fraction_mean: bubble.iter().sum::<f64>() / bubble.len() as f64,
            bubble_fraction: bubble,
            bubble_fraction_theory: theoretical_bubble(epochs.len(), micro * self.config.virtual_stages),
            peak_live_activations: epochs.iter().map(|e| e.peak_live).collect(),
            links_per_step: links,
            bytes_per_step: per_step(bytes as f64),
            communication_share: transfer_share,
            state_bytes: Some(
                (self.codecs.iter().map(StageCodecs::held_bytes).sum::<usize>()
                    + self.stages.iter().map(|s| s.held_bytes()).sum::<usize>()
                    + self.policies.iter().map(|p| p.held_bytes()).sum::<usize>()) as f64,
            ),
            sync,
            across_ranks,
        };
        // Loss over the samples trained on; samples over all the epoch consumed.
        TrainStats {
            loss_sum: last.loss_sum,
            samples: last.samples + last.skipped_samples - last.replayed_samples,
            steps,
            tested: last.samples,
            correct: last.correct,
            figures: StrategyFigures::Pipeline(figures),
        }
    }
}
