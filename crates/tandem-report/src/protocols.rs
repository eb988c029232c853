//! The report's protocols section: each protocol that cuts model-parallel communication against
//! its matched baselines ([`crate::sync`]), with intervals, and the verdict against the
//! experiment's `[report]` target.

use tandem_results::Protocol;

use crate::aggregate::SettingTable;
use crate::document::{Block, Document};
use crate::interval::Interval;
use crate::stat;
use crate::sync::{self, Cut, SyncComparison};

/// Adds the section for `table` (nothing where it has no protocol runs).
pub fn section(doc: &mut Document, table: &SettingTable) {
    let comparisons = sync::compare(table);
    if comparisons.is_empty() {
        return;
    }
    doc.push(Block::Heading(2, "Protocols against their matched baselines".into()));
    doc.push(Block::Paragraph(
        "Each protocol (predictive sync, local learning, compressed boundaries) against vanilla model parallelism of the same pipeline, paired by seed: figures are means over the seeds both ran (n in the second table) with their 95 % intervals in brackets (Student's t; ratios on a log scale), none for one seed. Less communication is vanilla's bytes ÷ the protocol's, split into what compressing vanilla's boundaries to the same bits per value gives (vanilla ÷ compression-matched vanilla) and what the protocol adds (compression-matched ÷ protocol). Speedups are training time (evaluation excluded, simulated link waits included) of vanilla, and of sequential training on one device, ÷ the protocol's; end to end, the wall clock summed over the run's records (evaluation, checkpoints with the protocol's state, and results writing counted). State held is what the stages keep between steps at the end (compression memories such as AQ-SGD's per-sample copies, local learning's replay buffers, predictors' state and the parameters kept at the last sync; in a multi-process run, the stages of the process that wrote the results), mean over seeds. A checkpoint (the model, its optimizer and that state, at every evaluation point) is written whole once, then as what changed since the one before, whole again when the changes would outgrow it: the checkpoint column gives the bytes written per point and their share of writing each whole, means over seeds. The predictor column names what the stages after the first do between real steps (a predictor, or `replay`).".into(),
    ));
    let shown = |i: Option<Interval>, f: &dyn Fn(&Interval) -> String| i.as_ref().map_or("—".to_string(), f);
    // A row per comparison: model, strategy, then `cells`.
    let rows = |header: &[&str], cells: &dyn Fn(&SyncComparison) -> Vec<String>| Block::Table {
        header: ["model", "strategy"].iter().chain(header).map(|h| h.to_string()).collect(),
        rows: comparisons.iter().map(|c| [vec![c.model.clone(), c.strategy.clone()], cells(c)].concat()).collect(),
    };
    doc.push(rows(
        &[
            "protocol",
            "predictor",
            "trigger",
            "vanilla",
            "compression-matched",
            "sync steps",
            "less communication",
            "from compression",
            "from the protocol",
            "speedup vs vanilla",
            "speedup vs sequential",
            "end-to-end speedup vs vanilla",
            "state held (MB)",
            "checkpoint per point (MB, share of whole)",
        ],
        &|c| {
            let i = &c.intervals;
            vec![
                c.protocol.name().to_string(),
                c.predictor.clone(),
                c.trigger.clone(),
                match c.same_shape {
                    true => c.reference.clone(),
                    false => format!("{} (another pipeline: not judged)", c.reference),
                },
                c.compression_matched.clone().unwrap_or_else(|| "—".into()),
                stat(c.sync_steps, 1.0, 0),
                shown(i.reduction, &|i| i.times(1)),
                shown(i.from_compression, &|i| i.times(1)),
                shown(i.from_protocol, &|i| i.times(1)),
                shown(i.speedup, &|i| i.times(2)),
                shown(i.speedup_vs_sequential, &|i| i.times(2)),
                shown(i.end_to_end_speedup, &|i| i.times(2)),
                i.state_bytes.map_or("—".into(), |s| format!("{:.1}", s.mean / 1e6)),
                match (i.checkpoint_bytes, i.checkpoint_share) {
                    (Some(b), Some(s)) => format!("{:.1} ({:.0} %)", b.mean / 1e6, s.mean * 100.0),
                    _ => "—".into(),
                },
            ]
        },
    ));
    doc.push(Block::Paragraph(
        "Accuracy changes in points, paired by seed: against vanilla on the validation set (what choices read) and on the holdout set; against the compression-matched vanilla and, for local learning, against the objective-matched baseline (the same auxiliary heads with a real step every step, no compression) on the holdout set. The predictive-sync column compares each predictor with the static predictor (no prediction: the skipped batches are simply not learned from) at the same number of sync steps: a predictor is useful only where it is positive. Time to vanilla's accuracy is the training time until the protocol's accuracy (validation where there is a split) first reached the final accuracy of vanilla's run of the same seed, mean over the seeds where it did. Prequential accuracy is test-then-train over the batches that had a forward pass before their update.".into(),
    ));
    doc.push(rows(
        &[
            "n",
            "vs vanilla, validation",
            "vs vanilla, holdout",
            "vs compression-matched, holdout",
            "objective-matched",
            "vs objective-matched, holdout",
            "vs static at equal syncs",
            "time to vanilla's accuracy (s)",
            "prequential accuracy (%)",
        ],
        &|c| {
            let i = &c.intervals;
            vec![
                i.speedup.map_or("—".into(), |s| s.n.to_string()),
                shown(i.validation_change, &|i| i.signed(100.0, 1)),
                shown(i.holdout_change, &|i| i.signed(100.0, 1)),
                shown(i.versus_compression, &|i| i.signed(100.0, 1)),
                c.objective_matched.clone().unwrap_or_else(|| "—".into()),
                shown(i.versus_objective, &|i| i.signed(100.0, 1)),
                match &c.versus_static {
                    Some((_, d)) => format!("{d:+.1}"),
                    None if c.control => "(the control)".into(),
                    None if c.protocol == Cut::Between(Protocol::Predictive) => {
                        "no static run at this sync count".into()
                    }
                    None => "—".into(),
                },
                match (i.time_to_vanilla, i.reached_vanilla) {
                    (_, (0, 0)) => "—".into(),
                    (None, _) => "never".into(),
                    (Some(t), (k, n)) if k == n => format!("{:.1}", t.mean),
                    (Some(t), (k, n)) => format!("{:.1} ({k} of {n} seeds; the others never)", t.mean),
                },
                c.prequential.map_or("—".into(), |p| format!("{:.1}", p * 100.0)),
            ]
        },
    ));
    let Some(target) = table.report.target else {
        doc.push(Block::Paragraph(
            "No target set: a manifest's `[report] target = { communication_reduction, speedup, points_lost }` gives each model a verdict.".into(),
        ));
        return;
    };
    let verdicts: Vec<String> = table
        .models()
        .into_iter()
        .filter(|model| comparisons.iter().any(|c| c.model == *model))
        .map(|model| sync::verdict(model, &comparisons, &target))
        .collect();
    doc.push(Block::Paragraph(format!(
        "Target, from the experiment's `[report]`: at least {}× less communication, at least {}× faster, at most {} points lost against vanilla, each counted as met only where its 95 % interval clears the bound (one seed never does), the accuracy judged on the validation set where the runs have one. Among the protocols that meet it, the one with the best accuracy change is chosen; where none does, the closest (least summed relative shortfall of the means); the chosen protocol's holdout figures are given once. {}.",
        target.communication_reduction,
        target.speedup,
        target.points_lost,
        verdicts.join("; ")
    )));
}
