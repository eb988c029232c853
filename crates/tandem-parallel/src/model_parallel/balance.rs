//! Where to cut the model: explicit cut points, or cuts that balance the pieces' parameter
//! counts or their measured training-step times.

use std::time::{Duration, Instant};

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use tandem_data::Encoded;
use tandem_models::{Activation, Classifier};
use tandem_train::TrainConfig;

use super::config::{Balance, ModelParallelConfig};
use super::stage::{MicroBatch, Stage};
use crate::kind::BuildError;

/// Cut points that split blocks of the given costs into `stages` contiguous stages whose
/// largest total cost is as small as possible (the pipeline runs at the pace of its slowest stage).
pub fn balanced_cuts(costs: &[f64], stages: usize) -> Vec<usize> {
    fn search(
        costs: &[f64],
        start: usize,
        stages: usize,
        cuts: &mut Vec<usize>,
        best: &mut (f64, Vec<usize>),
        worst: f64,
    ) {
        if stages == 1 {
            let worst = worst.max(costs[start..].iter().sum());
            if worst < best.0 {
                *best = (worst, cuts.clone());
            }
            return;
        }
        for cut in start + 1..=costs.len() - (stages - 1) {
            cuts.push(cut);
            search(costs, cut, stages - 1, cuts, best, worst.max(costs[start..cut].iter().sum()));
            cuts.pop();
        }
    }
    let mut best = (f64::INFINITY, Vec::new());
    if (1..=costs.len()).contains(&stages) {
        search(costs, 0, stages, &mut Vec::new(), &mut best, 0.0);
    }
    best.1
}

/// Seconds each block of `model` takes for a training step (forward, backward and optimizer
/// update) on `micro_size` samples of `data`: the mean of 3 steps after a warm-up, each block
/// run as its own stage on `device`.
pub fn profile_blocks<B: AutodiffBackend>(
    model: &Classifier<B>,
    train: &TrainConfig,
    data: &Encoded,
    micro_size: usize,
    device: &B::Device,
) -> Result<Vec<f64>, String> {
    let n = model.num_blocks();
    let blocks = model.clone().split(&(1..n).collect::<Vec<_>>()).map_err(|e| e.to_string())?;
    let mut stages: Vec<Stage<B>> = blocks.into_iter().map(|b| Stage::new(b, train, device.clone())).collect();
    let indices: Vec<usize> = (0..micro_size.min(data.len())).collect();
    if indices.is_empty() {
        return Err("cannot balance stages by time without training data".into());
    }
    let mut seconds = vec![0.0; n];
    for rep in 0..4 {
        let batch = data.batch::<B>(&indices, device);
        let mut elapsed = vec![Duration::ZERO; n];
        let mut x = Activation::Tokens(batch.tokens.inner());
        let micro = MicroBatch { mask_pad: &batch.mask_pad, labels: batch.labels.clone(), weight: 1.0 };
        // On a GPU, work is queued: wait for it before every clock reading.
        let sync = || B::sync(device).map_err(|e| format!("profiling the blocks: {e:?}"));
        for (i, stage) in stages.iter_mut().enumerate() {
            sync()?;
            let started = Instant::now();
            if i + 1 == n {
                stage.forward_loss(0, x.clone(), &micro);
            } else {
                x = stage.forward(0, x, &micro);
            }
            sync()?;
            elapsed[i] += started.elapsed();
        }
        let mut grad = None;
        for (i, stage) in stages.iter_mut().enumerate().rev() {
            sync()?;
            let started = Instant::now();
            grad = stage.backward(0, grad)?;
            stage.step(train, 1.0, 0, 1);
            sync()?;
            elapsed[i] += started.elapsed();
        }
        // The first repetition warms up (allocations, caches) and is not counted.
        if rep > 0 {
            seconds.iter_mut().zip(elapsed).for_each(|(s, e)| *s += e.as_secs_f64() / 3.0);
        }
    }
    Ok(seconds)
}

/// The manifest's cut points, or balanced ones (`balance`; a time balance profiles the blocks
/// on `device` in `pool`).
pub(super) fn choose_cuts<B: AutodiffBackend>(
    model: &Classifier<B>,
    train: &TrainConfig,
    config: &ModelParallelConfig,
    pool: &rayon::ThreadPool,
    device: &B::Device,
    profile_data: &Encoded,
) -> Result<Vec<usize>, BuildError> {
    let pieces = config.pieces();
    if pieces > model.num_blocks() {
        let message = format!("cannot cut a model of {} blocks into {pieces} stages", model.num_blocks());
        return Err(BuildError::Mismatch(message));
    }
    Ok(match (&config.cuts, config.balance) {
        (Some(cuts), _) => cuts.clone(),
        _ if pieces == 1 => Vec::new(),
        (None, Balance::Params) => {
            let costs: Vec<f64> = model.blocks().iter().map(|b| b.num_params() as f64).collect();
            balanced_cuts(&costs, pieces)
        }
        (None, Balance::Time) => {
            let micro_size = train.batch_size.div_ceil(config.schedule.micro_batches(config.micro_batches));
            let costs = pool
                .install(|| profile_blocks(model, train, profile_data, micro_size, device))
                .map_err(BuildError::Profile)?;
            balanced_cuts(&costs, pieces)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_cuts_minimise_the_slowest_stage() {
        assert_eq!(balanced_cuts(&[1.0, 1.0, 1.0, 1.0], 2), vec![2]);
        assert_eq!(balanced_cuts(&[10.0, 1.0, 1.0, 1.0], 2), vec![1]);
        assert_eq!(balanced_cuts(&[1.0, 1.0, 1.0, 9.0], 2), vec![3]);
        assert_eq!(balanced_cuts(&[3.0, 1.0, 1.0, 1.0, 3.0], 3), vec![1, 4]);
        assert_eq!(balanced_cuts(&[1.0, 2.0], 2), vec![1]);
        assert_eq!(balanced_cuts(&[5.0], 1), Vec::<usize>::new());
        assert!(balanced_cuts(&[1.0, 2.0], 3).is_empty(), "more stages than blocks");
    }
}
