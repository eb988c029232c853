//! One record's figures from two parts of its batches (a run interrupted part-way through a
//! record and resumed): counts and seconds add up, per-step figures are weighted by steps,
//! shares by time, and what describes the setup is the later part's.

use super::{DataParallelFigures, LinkFigures, PipelineFigures, PipelineRanks, StrategyFigures, SyncFigures};

/// Step counts of the two parts, to weight per-step figures by.
#[derive(Clone, Copy)]
struct Steps {
    before: f64,
    after: f64,
}

impl Steps {
    /// The per-step mean over both parts.
    fn per_step(self, before: f64, after: f64) -> f64 {
        weighted(before, after, (self.before, self.after))
    }
}

/// The mean of `before` and `after` weighted by `weights`.
fn weighted(before: f64, after: f64, weights: (f64, f64)) -> f64 {
    match weights.0 + weights.1 {
        total if total > 0.0 => (before * weights.0 + after * weights.1) / total,
        _ => after,
    }
}

fn add(before: &[f64], after: &[f64]) -> Vec<f64> {
    after.iter().enumerate().map(|(i, a)| a + before.get(i).copied().unwrap_or(0.0)).collect()
}

impl StrategyFigures {
    /// The figures of `steps` steps followed by `later`'s `later_steps`, as one record.
    pub fn then(self, steps: usize, later: Self, later_steps: usize) -> Self {
        let steps = Steps { before: steps as f64, after: later_steps as f64 };
        match (self, later) {
            (Self::DataParallel(before), Self::DataParallel(after)) => Self::DataParallel(before.then(after, steps)),
            (Self::Pipeline(before), Self::Pipeline(after)) => Self::Pipeline(before.then(after, steps)),
            (_, later) => later,
        }
    }
}

impl DataParallelFigures {
    fn then(self, after: Self, steps: Steps) -> Self {
        let all_reduce_seconds = self.all_reduce_seconds + after.all_reduce_seconds;
        let step_seconds = self.step_seconds + after.step_seconds;
        let share = all_reduce_seconds / step_seconds.max(1e-12);
        Self {
            all_reduce_calls_per_step: steps.per_step(self.all_reduce_calls_per_step, after.all_reduce_calls_per_step),
            bytes_sent_per_replica_per_step: steps
                .per_step(self.bytes_sent_per_replica_per_step, after.bytes_sent_per_replica_per_step),
            bytes_received_per_replica_per_step: steps
                .per_step(self.bytes_received_per_replica_per_step, after.bytes_received_per_replica_per_step),
            dense_bytes_per_replica_per_step: steps
                .per_step(self.dense_bytes_per_replica_per_step, after.dense_bytes_per_replica_per_step),
            all_reduce_seconds,
            step_seconds,
            all_reduce_share: share,
            bytes_per_step: steps.per_step(self.bytes_per_step, after.bytes_per_step),
            communication_share: share,
            cross_rank_seconds: self.cross_rank_seconds + after.cross_rank_seconds,
            cross_rank_bytes_per_replica_per_step: steps
                .per_step(self.cross_rank_bytes_per_replica_per_step, after.cross_rank_bytes_per_replica_per_step),
            ..after
        }
    }
}

impl PipelineFigures {
    fn then(self, after: Self, steps: Steps) -> Self {
        // Each device's wall time, to weight its shares by.
        let walls = |f: &Self| f.stage_seconds().iter().map(|s| s.iter().sum::<f64>()).collect::<Vec<f64>>();
        let (wall_before, wall_after) = (walls(&self), walls(&after));
        let wall = |i: usize| (wall_before.get(i).copied().unwrap_or(0.0), wall_after.get(i).copied().unwrap_or(0.0));
        let bubble_fraction: Vec<f64> = after
            .bubble_fraction
            .iter()
            .enumerate()
            .map(|(i, b)| weighted(self.bubble_fraction.get(i).copied().unwrap_or(0.0), *b, wall(i)))
            .collect();
        let total = |w: &[f64]| w.iter().sum::<f64>();
        let links_per_step = after
            .links_per_step
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let b = self.links_per_step.get(i).cloned().unwrap_or_default();
                let mut link = LinkFigures::default();
                for (merged, (x, y)) in
                    [(&mut link.forward, (b.forward, a.forward)), (&mut link.backward, (b.backward, a.backward))]
                {
                    merged.messages = steps.per_step(x.messages, y.messages);
                    merged.bytes = steps.per_step(x.bytes, y.bytes);
                }
                link
            })
            .collect();
        let sync = match (self.sync, after.sync) {
            (Some(before), Some(after)) => Some(before.then(after, steps)),
            (_, after) => after,
        };
        let across_ranks = match (self.across_ranks, after.across_ranks) {
            (Some(before), Some(after)) => Some(PipelineRanks {
                cross_rank_bytes_per_step: steps
                    .per_step(before.cross_rank_bytes_per_step, after.cross_rank_bytes_per_step),
                cross_rank_seconds: before.cross_rank_seconds + after.cross_rank_seconds,
                ..after
            }),
            (_, after) => after,
        };
        Self {
            compute_seconds: add(&self.compute_seconds, &after.compute_seconds),
            transfer_seconds: add(&self.transfer_seconds, &after.transfer_seconds),
            idle_seconds: add(&self.idle_seconds, &after.idle_seconds),
            bubble_fraction_mean: bubble_fraction.iter().sum::<f64>() / bubble_fraction.len().max(1) as f64,
            bubble_fraction,
            peak_live_activations: after
                .peak_live_activations
                .iter()
                .enumerate()
                .map(|(i, a)| (*a).max(self.peak_live_activations.get(i).copied().unwrap_or(0)))
                .collect(),
            links_per_step,
            bytes_per_step: steps.per_step(self.bytes_per_step, after.bytes_per_step),
            communication_share: weighted(
                self.communication_share,
                after.communication_share,
                (total(&wall_before), total(&wall_after)),
            ),
            sync,
            across_ranks,
            ..after
        }
    }
}

impl SyncFigures {
    fn then(self, after: Self, steps: Steps) -> Self {
        let mut horizons = self.horizons;
        for (horizon, count) in after.horizons {
            *horizons.entry(horizon).or_default() += count;
        }
        // The forecast error is a mean over syncs with a forecast: weighted by predicted steps.
        let relative_error_mean = match (self.relative_error_mean, after.relative_error_mean) {
            (Some(x), Some(y)) => Some(weighted(x, y, (self.predicted_steps as f64, after.predicted_steps as f64))),
            (x, y) => y.or(x),
        };
        Self {
            sync_steps: self.sync_steps + after.sync_steps,
            predicted_steps: self.predicted_steps + after.predicted_steps,
            horizons,
            relative_error_mean,
            control_bytes_per_step: steps.per_step(self.control_bytes_per_step, after.control_bytes_per_step),
            label_bytes_per_step: steps.per_step(self.label_bytes_per_step, after.label_bytes_per_step),
            local_steps: self.local_steps + after.local_steps,
            transfer_steps: self.transfer_steps + after.transfer_steps,
            predict_seconds: add(&self.predict_seconds, &after.predict_seconds),
            replayed_samples: self.replayed_samples + after.replayed_samples,
            ..after
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_parts_add_up_to_the_whole() {
        let part = |steps: f64, bytes: u64| PipelineFigures {
            compute_seconds: vec![steps, 2.0 * steps],
            transfer_seconds: vec![0.0, 0.0],
            idle_seconds: vec![steps, 0.0],
            bubble_fraction: vec![0.5, 0.0],
            bytes_per_step: bytes as f64 / steps,
            links_per_step: vec![LinkFigures::default()],
            peak_live_activations: vec![3, 1],
            sync: Some(SyncFigures {
                sync_steps: 1,
                predicted_steps: steps as u64 - 1,
                horizons: [(steps as usize - 1, 1)].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let merged = StrategyFigures::Pipeline(part(3.0, 300)).then(3, StrategyFigures::Pipeline(part(5.0, 700)), 5);
        let merged = merged.pipeline().unwrap();
        assert_eq!(merged.bytes_per_step, 1000.0 / 8.0);
        assert_eq!(merged.compute_seconds, [8.0, 16.0]);
        assert_eq!(merged.bubble_fraction, [0.5, 0.0]);
        let sync = merged.sync.as_ref().unwrap();
        assert_eq!((sync.sync_steps, sync.predicted_steps), (2, 6));
        assert_eq!(sync.horizons, [(2, 1), (4, 1)].into());
    }
}
