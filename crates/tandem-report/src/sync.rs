//! Protocols that cut model-parallel communication — predictive synchronisation, local
//! learning, compressed boundaries — against their matched baselines: vanilla model parallelism
//! of the same pipeline; vanilla with the same boundary compression (equal bits per value), which
//! splits the communication factor into what compression gives and what the protocol adds;
//! for local learning, the same auxiliary objective with a real step every step; and sequential
//! training on one device. Every figure is paired by seed and given with its 95 % interval. The
//! honest control for predictors (a predictor is only useful where it beats `static`, skipping
//! the same batches without predicting, at the same number of sync steps) is kept.
//!
//! Choices — which protocols meet the manifest's target, which one is best per model — read
//! validation figures where the runs have a validation split; the chosen protocol's holdout
//! figures are then reported once.
//!
//! Read from the runs' last records: a pipeline's sync figures (protocol, predictor, trigger,
//! sync steps) and its compression. A vanilla run is a pipeline with neither.

use tandem_results::{CheckpointWrites, PipelineFigures, Protocol, Run, StrategyFigures, SyncFigures, Target};

use crate::aggregate::{Group, SettingTable, Stat};
use crate::interval::Interval;

/// How a group cuts communication: a protocol between real steps, or real steps every time over
/// compressed boundaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    Between(Protocol),
    Compressed,
}

impl Cut {
    /// As the report's tables name it: `predictive`, `local` or `compressed`.
    pub fn name(self) -> &'static str {
        match self {
            Cut::Between(protocol) => protocol.name(),
            Cut::Compressed => "compressed",
        }
    }
}

/// One protocol group against its matched baselines.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncComparison {
    pub model: String,
    pub strategy: String,
    pub protocol: Cut,
    pub predictor: String,
    /// Predictive synchronisation's control: the static predictor.
    pub control: bool,
    pub trigger: String,
    /// The vanilla model-parallel strategy compared with.
    pub reference: String,
    /// Whether that vanilla run has the protocol's pipeline shape (else it is the model's
    /// fastest, shown but left out of the verdict).
    pub same_shape: bool,
    /// Vanilla of the same pipeline with the same boundary compression; `None` where the
    /// protocol compresses nothing (the reference is then matched), where it is itself such a
    /// vanilla run, or where no such run exists.
    pub compression_matched: Option<String>,
    /// Local learning: the same pipeline, auxiliary heads and objective with a real step every
    /// step and no compression.
    pub objective_matched: Option<String>,
    pub sync_steps: Option<Stat>,
    /// Vanilla bytes / these bytes (means over seeds).
    pub communication_reduction: Option<f64>,
    /// Vanilla training time / this training time.
    pub speedup: f64,
    /// Holdout accuracy points gained (negative: lost) against vanilla.
    pub accuracy_change: f64,
    /// Test-then-train accuracy of the batches with a forward pass before their update.
    pub prequential: Option<f64>,
    /// The `static` group with the same mean number of sync steps, and the accuracy points this
    /// predictor gains over it.
    pub versus_static: Option<(String, f64)>,
    /// The same figures paired by seed, with their intervals.
    pub intervals: Intervals,
}

/// A comparison's figures paired by seed, each a mean with its 95 % interval; `None` where a
/// baseline or a figure is missing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Intervals {
    /// Vanilla bytes / protocol bytes.
    pub reduction: Option<Interval>,
    /// Vanilla bytes / compression-matched bytes: what compression alone gives.
    pub from_compression: Option<Interval>,
    /// Compression-matched bytes / protocol bytes: what the protocol adds (the whole reduction
    /// where it compresses nothing).
    pub from_protocol: Option<Interval>,
    /// Vanilla training time / protocol training time.
    pub speedup: Option<Interval>,
    /// Sequential training time on one device / protocol training time.
    pub speedup_vs_sequential: Option<Interval>,
    /// Vanilla's wall clock over its records / the protocol's: evaluation, checkpoints (the
    /// protocol's state included) and waits counted.
    pub end_to_end_speedup: Option<Interval>,
    /// Bytes of protocol state held at the end by the stages of the process that wrote the
    /// results (every stage, in a run of one process).
    pub state_bytes: Option<Stat>,
    /// Bytes written per checkpoint by the process that wrote the results, and their share of
    /// what writing each whole would take (absent in runs that did not record them).
    pub checkpoint_bytes: Option<Stat>,
    pub checkpoint_share: Option<Stat>,
    /// Training seconds until the protocol's accuracy (validation where there is a split) first
    /// reached vanilla's final accuracy of the same seed, over the seeds where it did; and how
    /// many seeds did, of those paired.
    pub time_to_vanilla: Option<Stat>,
    pub reached_vanilla: (usize, usize),
    /// Accuracy change against vanilla (fractions), on the holdout and the validation set.
    pub holdout_change: Option<Interval>,
    pub validation_change: Option<Interval>,
    /// Holdout accuracy change against the compression-matched vanilla.
    pub versus_compression: Option<Interval>,
    /// Holdout accuracy change against the objective-matched baseline.
    pub versus_objective: Option<Interval>,
}

fn pipeline<'a>(g: &'a Group) -> Option<&'a PipelineFigures> {
    g.runs.first().and_then(|r| r.last_figures()).and_then(StrategyFigures::pipeline)
}

fn sync<'a>(g: &'a Group) -> Option<&'a SyncFigures> {
    pipeline(g).and_then(|p| p.sync.as_ref())
}

/// Vanilla model parallelism: a pipeline that syncs every step and compresses nothing.
fn is_vanilla(g: &Group) -> bool {
    pipeline(g).is_some_and(|p| p.sync.is_none() && p.compression.is_none())
}

/// Local learning with a real step at every step of every record of every run: the protocol's
/// objective without its savings.
fn is_objective_baseline(g: &Group) -> bool {
    let every_step_real =
        |s: &SyncFigures| s.protocol == Protocol::Local && s.predicted_steps == 0 && s.local_steps == 0;
    g.runs
        .iter()
        .all(|r| !r.epochs.is_empty() && r.epochs.iter().all(|e| e.figures.sync().is_some_and(every_step_real)))
}

/// The pipeline's shape, which a protocol and its baselines share.
fn shape(p: &PipelineFigures) -> (usize, &[usize], &str, usize, &str) {
    (p.stages, &p.cuts, &p.schedule, p.micro_batches, &p.interconnect)
}

/// The group's protocol, or compression for a vanilla pipeline whose boundaries compress.
fn protocol_of(g: &Group) -> Cut {
    sync(g).map_or(Cut::Compressed, |s| Cut::Between(s.protocol))
}

fn is_control(g: &Group) -> bool {
    sync(g).is_some_and(SyncFigures::is_control)
}

fn mean_sync_steps(g: &Group) -> Option<Stat> {
    Stat::of(&g.runs.iter().filter_map(|r| r.sync_steps()).collect::<Vec<_>>())
}

/// `f(mine, theirs)` for each seed both groups ran, once per seed (a group holding two runs of
/// one seed, from manifests that differ elsewhere, counts the first).
fn paired<T>(mine: &Group, theirs: &Group, f: impl Fn(&Run, &Run) -> Option<T>) -> Vec<T> {
    let seed = |r: &Run| r.summary.as_ref().map(|s| s.seed);
    let mut seen = Vec::new();
    mine.runs
        .iter()
        .filter(|a| {
            let first = !seen.contains(&seed(a));
            seen.push(seed(a));
            first
        })
        .filter_map(|a| theirs.runs.iter().find(|b| seed(a) == seed(b)).and_then(|b| f(a, b)))
        .collect()
}

fn bytes(r: &Run) -> Option<f64> {
    r.bytes_total()
}

fn seconds(r: &Run) -> Option<f64> {
    r.finished().map(|s| s.train_seconds)
}

fn holdout_accuracy(r: &Run) -> Option<f64> {
    r.finished().and_then(|s| s.final_metrics.as_ref()).map(|m| m.accuracy)
}

fn validation_accuracy(r: &Run) -> Option<f64> {
    r.finished().and_then(|s| s.final_validation.as_ref()).map(|m| m.accuracy)
}

/// Training seconds until `mine` first reached `theirs`'s final accuracy (`Some(None)`: never).
fn time_to_reach(mine: &Run, theirs: &Run) -> Option<Option<f64>> {
    let goal = theirs.epochs.last()?.judged_accuracy();
    let mut seconds = 0.0;
    for record in &mine.epochs {
        seconds += record.train_seconds;
        if record.judged_accuracy() >= goal {
            return Some(Some(seconds));
        }
    }
    Some(None)
}

/// Bytes of protocol state at the run's end.
fn state_bytes(r: &Run) -> Option<f64> {
    r.last_figures().and_then(StrategyFigures::pipeline).and_then(|p| p.state_bytes)
}

/// What a finished run wrote to its checkpoints, where it recorded it.
fn checkpoints(r: &Run) -> Option<&CheckpointWrites> {
    r.finished()?.checkpoints.as_ref().filter(|c| c.written > 0)
}

/// `f` over the runs of `g` that have it.
fn over_runs(g: &Group, f: impl Fn(&Run) -> Option<f64>) -> Option<Stat> {
    Stat::of(&g.runs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
}

/// Theirs ÷ mine of `f`, paired by seed.
fn ratio(mine: &Group, theirs: &Group, f: fn(&Run) -> Option<f64>) -> Option<Interval> {
    Interval::of_ratios(&paired(mine, theirs, |a, b| Some(f(b)? / f(a)?.max(1e-12))))
}

/// Mine − theirs of `f`, paired by seed.
fn difference(mine: &Group, theirs: &Group, f: fn(&Run) -> Option<f64>) -> Option<Interval> {
    Interval::of_differences(&paired(mine, theirs, |a, b| Some(f(a)? - f(b)?)))
}

/// The comparisons for every protocol group of `table` that has a vanilla reference: of the
/// same pipeline shape where there is one, else the model's fastest vanilla group.
pub fn compare(table: &SettingTable) -> Vec<SyncComparison> {
    let protocols: Vec<&Group> =
        table.groups.iter().filter(|g| pipeline(g).is_some() && !is_vanilla(g) && !is_objective_baseline(g)).collect();
    let name = |g: &Group, of: fn(&SyncFigures) -> &str, none: &str| sync(g).map_or(none.to_string(), |s| of(s).into());
    let predictor_of = |g: &Group| name(g, |s| &s.predictor, "—");
    protocols
        .iter()
        .filter_map(|g| {
            let same_model: Vec<&Group> = table.groups.iter().filter(|v| v.model == g.model).collect();
            let vanillas: Vec<&&Group> = same_model.iter().filter(|v| is_vanilla(v)).collect();
            let mine = pipeline(g)?;
            let fastest = vanillas.iter().min_by(|a, b| a.train_seconds.mean.total_cmp(&b.train_seconds.mean));
            let matched = vanillas.iter().find(|v| pipeline(v).map(shape) == Some(shape(mine)));
            let vanilla = matched.or(fastest)?;
            let compressed = mine.compression.as_ref().and_then(|bits| {
                same_model.iter().find(|c| {
                    !std::ptr::eq(**c, *g)
                        && pipeline(c).is_some_and(|p| {
                            p.sync.is_none() && p.compression.as_ref() == Some(bits) && shape(p) == shape(mine)
                        })
                })
            });
            let objective = sync(g).filter(|s| s.protocol == Protocol::Local).and_then(|s| {
                same_model.iter().find(|o| {
                    is_objective_baseline(o)
                        && pipeline(o).is_some_and(|p| p.compression.is_none() && shape(p) == shape(mine))
                        && sync(o).is_some_and(|os| os.aux_parameters == s.aux_parameters)
                })
            });
            let sequential = same_model.iter().find(|s| s.baseline);
            let sync_steps = mean_sync_steps(g);
            let protocol = protocol_of(g);
            let predictor = predictor_of(g);
            let predicts = protocol == Cut::Between(Protocol::Predictive) && !is_control(g);
            let versus_static = predicts
                .then(|| {
                    protocols.iter().find(|s| {
                        s.model == g.model
                            && is_control(s)
                            && matches!((mean_sync_steps(s), sync_steps), (Some(a), Some(b)) if (a.mean - b.mean).abs() < 0.5)
                    })
                })
                .flatten()
                .map(|s| (s.strategy.clone(), (g.accuracy.mean - s.accuracy.mean) * 100.0));
            let reached = paired(g, vanilla, time_to_reach);
            let intervals = Intervals {
                reduction: ratio(g, vanilla, bytes),
                from_compression: compressed.and_then(|c| ratio(c, vanilla, bytes)),
                from_protocol: match compressed {
                    Some(c) => ratio(g, c, bytes),
                    None if mine.compression.is_none() => ratio(g, vanilla, bytes),
                    None => None,
                },
                speedup: ratio(g, vanilla, seconds),
                speedup_vs_sequential: sequential.and_then(|s| ratio(g, s, seconds)),
                end_to_end_speedup: ratio(g, vanilla, |r| r.finished()?.wall_seconds),
                state_bytes: over_runs(g, state_bytes),
                checkpoint_bytes: over_runs(g, |r| checkpoints(r).map(|c| c.bytes as f64 / c.written as f64)),
                checkpoint_share: over_runs(g, |r| {
                    checkpoints(r).map(|c| c.bytes as f64 / c.bytes_if_whole.max(1) as f64)
                }),
                time_to_vanilla: Stat::of(&reached.iter().flatten().copied().collect::<Vec<_>>()),
                reached_vanilla: (reached.iter().filter(|t| t.is_some()).count(), reached.len()),
                holdout_change: difference(g, vanilla, holdout_accuracy),
                validation_change: difference(g, vanilla, validation_accuracy),
                versus_compression: compressed.and_then(|c| difference(g, c, holdout_accuracy)),
                versus_objective: objective.and_then(|o| difference(g, o, holdout_accuracy)),
            };
            Some(SyncComparison {
                model: g.model.clone(),
                strategy: g.strategy.clone(),
                protocol,
                predictor,
                control: is_control(g),
                trigger: name(g, |s| &s.trigger, "every step"),
                reference: vanilla.strategy.clone(),
                same_shape: matched.is_some(),
                compression_matched: compressed.map(|c| c.strategy.clone()),
                objective_matched: objective.map(|o| o.strategy.clone()),
                sync_steps,
                communication_reduction: match (vanilla.bytes, g.bytes) {
                    (Some(v), Some(p)) => Some(v.mean / p.mean.max(1.0)),
                    _ => None,
                },
                speedup: vanilla.train_seconds.mean / g.train_seconds.mean.max(1e-12),
                accuracy_change: (g.accuracy.mean - vanilla.accuracy.mean) * 100.0,
                prequential: g.prequential.map(|p| p.mean),
                versus_static,
                intervals,
            })
        })
        .collect()
}

impl SyncComparison {
    /// The accuracy change choices read: validation where the runs have a validation split.
    pub fn judged_change(&self) -> Option<Interval> {
        self.intervals.validation_change.or(self.intervals.holdout_change)
    }

    /// Whether the 95 % interval of every figure clears `target` (one seed never does): less
    /// communication and speedup at least the target's, at most its points lost (on validation).
    pub fn meets(&self, target: &Target) -> bool {
        let (Some(reduction), Some(speedup), Some(change)) =
            (self.intervals.reduction, self.intervals.speedup, self.judged_change())
        else {
            return false;
        };
        reduction.low >= target.communication_reduction
            && speedup.low >= target.speedup
            && change.low * 100.0 >= -target.points_lost
    }

    /// How far the means are from `target`: the relative shortfall on each criterion, summed
    /// (0 inside it). Less communication and speed count as ratios (target / figure − 1), accuracy
    /// (validation where there is one) as points beyond those allowed, over those allowed.
    pub fn shortfall(&self, target: &Target) -> f64 {
        let mean = |i: Option<Interval>| i.map_or(0.0, |i| i.mean);
        let reduction = mean(self.intervals.reduction).max(1e-9);
        let speedup = mean(self.intervals.speedup).max(1e-9);
        let points = mean(self.judged_change()) * 100.0;
        (target.communication_reduction / reduction - 1.0).max(0.0)
            + (target.speedup / speedup - 1.0).max(0.0)
            + ((-target.points_lost - points) / target.points_lost.max(1e-9)).max(0.0)
    }
}

/// One model's protocols judged against a target, on validation figures where there are any.
pub struct Choice<'a> {
    pub model: String,
    /// The protocols whose intervals clear the target.
    pub met: Vec<&'a SyncComparison>,
    /// Of those, the one with the best judged accuracy change; else the closest to the target.
    pub chosen: Option<&'a SyncComparison>,
    /// Whether the choice read validation figures (else holdout: the runs have no validation split).
    pub on_validation: bool,
}

/// Judges `model`'s protocols against `target` (those compared with a vanilla run of another
/// pipeline shape left out). Several protocols are tested at once, each at 95 %: no
/// multiple-comparison correction is applied.
pub fn choose<'a>(model: &str, comparisons: &'a [SyncComparison], target: &Target) -> Choice<'a> {
    let mine: Vec<&SyncComparison> = comparisons.iter().filter(|c| c.model == model && c.same_shape).collect();
    let on_validation = !mine.is_empty() && mine.iter().all(|c| c.intervals.validation_change.is_some());
    let met: Vec<&SyncComparison> = mine.iter().copied().filter(|c| c.meets(target)).collect();
    let change = |c: &&SyncComparison| c.judged_change().map_or(f64::NEG_INFINITY, |i| i.mean);
    let chosen = match met.is_empty() {
        false => met.iter().copied().max_by(|a, b| change(a).total_cmp(&change(b))),
        true => mine.iter().copied().min_by(|a, b| a.shortfall(target).total_cmp(&b.shortfall(target))),
    };
    Choice { model: model.to_string(), met, chosen, on_validation }
}

/// The verdict for one model: the protocols that meet the target and the one chosen among
/// them, or the closest; the chosen protocol's holdout figures reported once.
pub fn verdict(model: &str, comparisons: &[SyncComparison], target: &Target) -> String {
    let choice = choose(model, comparisons, target);
    let split = if choice.on_validation { "validation" } else { "holdout (no validation split)" };
    let Some(c) = choice.chosen else { return format!("{model}: not met") };
    let shown = |i: Option<Interval>, f: &dyn Fn(&Interval) -> String| i.as_ref().map_or("—".to_string(), f);
    let figures = format!(
        "{} less communication, {} faster, {} holdout points",
        shown(c.intervals.reduction, &|i| i.times(1)),
        shown(c.intervals.speedup, &|i| i.times(2)),
        shown(c.intervals.holdout_change, &|i| i.signed(100.0, 1)),
    );
    match choice.met.is_empty() {
        false => format!(
            "{model}: met by {}; chosen on {split}: {} ({figures})",
            choice.met.iter().map(|c| c.strategy.as_str()).collect::<Vec<_>>().join(", "),
            c.strategy
        ),
        true => format!("{model}: not met; closest on {split}: {} ({figures})", c.strategy),
    }
}
