//! What a run writes and shows while it trains, as the epoch loop's observer: progress and
//! kernel launches after each batch, and at each epoch or evaluation point its line,
//! `epochs.jsonl` and the checkpoint; a signal agreed by every rank stops it there.

use std::path::PathBuf;

use burn::tensor::backend::AutodiffBackend;
use indicatif::ProgressBar;
use tandem_train::{EpochRecord, Halt, Observer, Point, Start, Strategy};

use super::checkpoints::Checkpoints;
use super::console::human_count;
use super::context::RunContext;
use super::signals::{agreed_stop, interrupt, Interrupt};
use crate::backend::launches::StepLaunches;
use crate::results;

/// Records a run's epochs or evaluation points as they finish.
pub(super) struct Recorder<'a> {
    ctx: &'a RunContext<'a>,
    /// Every record of the run so far, a resumed run's earlier ones first.
    pub written: Vec<EpochRecord>,
    /// Steps done of the point the run stopped in (`None`: it stopped between two, or not at all).
    pub stopped_within: Option<usize>,
    pub launches: StepLaunches,
    pub checkpoints: Checkpoints,
    epochs_path: PathBuf,
    interrupt: &'static Interrupt,
}

impl<'a> Recorder<'a> {
    /// The recorder of `ctx`'s run and where its epoch loop starts: after a resumed run's
    /// records, with its progress bar advanced past them.
    pub fn new(ctx: &'a RunContext<'a>) -> (Self, Start) {
        let (written, partial) = match ctx.resume {
            Some(checkpoint) => (checkpoint.records.clone(), checkpoint.partial.clone()),
            None => (Vec::new(), None),
        };
        let steps_done = written.iter().map(|r| r.steps).chain(partial.iter().map(|p| p.stats.steps)).sum::<usize>();
        ctx.progress.inc((steps_done * ctx.train.batch_size) as u64);
        // Same initial parameters on every rank (checked), but each rank its own dropout masks.
        let rng_seed = ctx.seed.wrapping_add(ctx.ranks.map_or(0, |r| r.rank() as u64));
        let start = Start { points_done: written.len(), partial, rng_seed };
        let recorder = Self {
            ctx,
            written,
            stopped_within: None,
            launches: StepLaunches::new(),
            checkpoints: Checkpoints::new(ctx),
            epochs_path: ctx.dir.join("epochs.jsonl"),
            interrupt: interrupt(),
        };
        (recorder, start)
    }

    /// The signal that stopped the run, if one did.
    pub fn signal(&self) -> Option<i32> {
        self.interrupt.signal()
    }
}

impl<B: AutodiffBackend> Observer<B> for Recorder<'_> {
    fn batch(&self, samples: usize) {
        self.ctx.progress.inc(samples as u64);
        self.launches.step();
    }

    fn interrupted(&self) -> bool {
        self.interrupt.signal().is_some()
    }

    fn point(&mut self, point: Point, strategy: &dyn Strategy<B>) -> Result<(), Halt> {
        let ctx = self.ctx;
        self.launches.point();
        let record = match point {
            Point::Recorded(record) => record,
            Point::Paused { points_done, partial } => {
                self.stopped_within = Some(partial.stats.steps);
                return self.checkpoints.write(strategy, points_done, Some(partial)).map_err(Halt::Failed);
            }
        };
        self.written.push(record.clone());
        let stop = agreed_stop(ctx.ranks, ctx.strategy.timeout()).map_err(|e| Halt::Failed(e.to_string()))?;
        if ctx.writes_results {
            print_record(&ctx.progress, &ctx.dir.file_name().unwrap_or_default().to_string_lossy(), record);
            results::write_epochs(&self.epochs_path, &self.written)
                .map_err(|e| Halt::Failed(format!("cannot write {}: {e}", self.epochs_path.display())))?;
        }
        self.checkpoints.write(strategy, self.written.len(), None).map_err(Halt::Failed)?;
        match stop {
            Some(signal) => Err(Halt::Signal(signal)),
            None => Ok(()),
        }
    }
}

/// One epoch line (or stream evaluation point), named after the run, above the progress bar
/// (or on stderr without one).
fn print_record(progress: &ProgressBar, run: &str, record: &EpochRecord) {
    let point = match &record.stream {
        Some(at) => format!("pass {:>2}, batch {:>5}", record.epoch, at.batches),
        None => format!("epoch {:>2}", record.epoch),
    };
    let line = format!(
        "  {run} {point}: train loss {:.4}, holdout loss {:.4}, accuracy {:.4}, macro F1 {:.4}, {} samples/s",
        record.train_loss,
        record.holdout_loss,
        record.holdout.accuracy,
        record.holdout.macro_f1,
        human_count(record.train_samples_per_second)
    );
    if progress.is_hidden() {
        eprintln!("{line}")
    } else {
        progress.println(line)
    }
}
