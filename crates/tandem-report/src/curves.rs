//! Line plots over a run: holdout and validation accuracy against training time, accuracy
//! against the bytes moved, and the train and holdout loss at each evaluation point; one panel
//! per model, one line per strategy (mean over seeds), one legend below the panels. A time or
//! bytes axis spanning more than ten times is drawn on a log scale. A line that coincides with
//! lines drawn before it (sequential, data-parallel and pipelined runs of the same maths) is
//! drawn with rings around their markers, one ring wider per line under it, so none is hidden.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::aggregate::{accuracy_curve, SettingTable};
use crate::plots::{log_ticks, significant, svg, PlotResult};
use crate::style::{err, FONT};
use crate::style::{legend_below, legend_size, Sample, SeriesStyle};
use tandem_results::{EpochRecord, Run};

/// The x axis of a line plot.
#[derive(Clone, Copy, PartialEq)]
enum Axis {
    /// Cumulative training seconds (log scale past a 10× range).
    Time,
    /// Evaluation points: the epoch, or in stream mode the batches consumed.
    Points,
    /// Cumulative megabytes moved between devices (log scale past a 10× range).
    Megabytes,
}

/// A strategy's curve: its index in the table's strategy order and its points.
type Curve = (usize, Vec<(f64, f64)>);

/// A curve's points from a group's runs.
type CurveOf = fn(&[&Run]) -> Vec<(f64, f64)>;

/// Holdout accuracy (%) after each evaluation against cumulative training time.
pub fn accuracy_over_time(table: &SettingTable) -> PlotResult<Option<String>> {
    let curve: CurveOf = |runs| accuracy_curve(runs).into_iter().map(|(t, a)| (t, a * 100.0)).collect();
    figure(table, "Holdout accuracy against training time (mean over seeds)", Axis::Time, "holdout accuracy (%)", curve)
}

/// Validation accuracy (%) after each evaluation against cumulative training time: the anytime
/// accuracy choices read (no plot without a validation split).
pub fn validation_over_time(table: &SettingTable) -> PlotResult<Option<String>> {
    let curve: CurveOf = |runs| {
        mean_curve(
            runs,
            |r, e| Some(seconds_until(r, e)),
            |r| r.validation.as_ref().map(|v| v.metrics.accuracy * 100.0),
        )
    };
    figure(
        table,
        "Validation accuracy against training time (mean over seeds)",
        Axis::Time,
        "validation accuracy (%)",
        curve,
    )
}

/// Accuracy (%) after each evaluation — validation where the runs have a split, else holdout —
/// against the megabytes moved so far, for the strategies that communicate.
pub fn accuracy_over_bytes(table: &SettingTable) -> PlotResult<Option<String>> {
    let curve: CurveOf = |runs| mean_curve(runs, megabytes_until, |r| Some(r.judged_accuracy() * 100.0));
    let title = "Accuracy (validation where there is a split, else holdout) against bytes moved (mean over seeds)";
    figure(table, title, Axis::Megabytes, "accuracy (%)", curve)
}

/// Cumulative training seconds of `run` up to record `e`.
fn seconds_until(run: &Run, e: usize) -> f64 {
    run.epochs[..=e].iter().map(|r| r.train_seconds).sum()
}

/// Cumulative megabytes `run` moved up to record `e` (`None`: it does not communicate).
fn megabytes_until(run: &Run, e: usize) -> Option<f64> {
    let bytes =
        run.epochs[..=e].iter().map(|r| Some(r.figures.bytes_per_step()? * r.steps as f64)).sum::<Option<f64>>()?;
    (bytes > 0.0).then_some(bytes / 1e6)
}

/// Mean over `runs` of (`x`, `y`) at each evaluation point every run reached and has both at.
fn mean_curve(runs: &[&Run], x: fn(&Run, usize) -> Option<f64>, y: fn(&EpochRecord) -> Option<f64>) -> Vec<(f64, f64)> {
    let points = runs.iter().map(|r| r.epochs.len()).min().unwrap_or(0);
    let n = runs.len() as f64;
    (0..points)
        .filter_map(|e| {
            let xs: Option<Vec<f64>> = runs.iter().map(|r| x(r, e)).collect();
            let ys: Option<Vec<f64>> = runs.iter().map(|r| y(&r.epochs[e])).collect();
            Some((xs?.iter().sum::<f64>() / n, ys?.iter().sum::<f64>() / n))
        })
        .collect()
}

/// For each curve, how many curves before it have the same points (to a millionth): 0 for a
/// line drawn over no other.
fn coinciding(curves: &[Curve]) -> Vec<usize> {
    let same = |a: &[(f64, f64)], b: &[(f64, f64)]| {
        let close = |u: f64, v: f64| (u - v).abs() <= 1e-6 * (1.0 + u.abs().max(v.abs()));
        a.len() == b.len() && a.iter().zip(b).all(|(p, q)| close(p.0, q.0) && close(p.1, q.1))
    };
    curves.iter().enumerate().map(|(k, (_, c))| curves[..k].iter().filter(|(_, e)| same(c, e)).count()).collect()
}

/// Training loss at each evaluation point (records whose loss is 0 ran no forward pass: predicted steps).
pub fn train_loss(table: &SettingTable) -> PlotResult<Option<String>> {
    let curve: CurveOf = |runs| loss_curve(runs, |r| r.train_loss);
    figure(table, "Training loss (mean over seeds)", Axis::Points, "training loss", curve)
}

/// Holdout loss at each evaluation point.
pub fn holdout_loss(table: &SettingTable) -> PlotResult<Option<String>> {
    let curve: CurveOf = |runs| loss_curve(runs, |r| r.holdout_loss);
    figure(table, "Holdout loss (mean over seeds)", Axis::Points, "holdout loss", curve)
}

/// Mean over `runs` of `loss` at each evaluation point every run reached, against the point
/// (stream batches, or the epoch); points where a run's loss is not positive are left out.
fn loss_curve(runs: &[&Run], loss: fn(&EpochRecord) -> f64) -> Vec<(f64, f64)> {
    let points = runs.iter().map(|r| r.epochs.len()).min().unwrap_or(0);
    (0..points)
        .filter(|&e| runs.iter().all(|r| loss(&r.epochs[e]) > 0.0 && loss(&r.epochs[e]).is_finite()))
        .map(|e| {
            let record = &runs[0].epochs[e];
            let x = record.stream.as_ref().map_or(record.epoch as f64, |s| s.batches as f64);
            (x, runs.iter().map(|r| loss(&r.epochs[e])).sum::<f64>() / runs.len() as f64)
        })
        .collect()
}

fn figure(table: &SettingTable, title: &str, axis: Axis, y_desc: &str, curve: CurveOf) -> PlotResult<Option<String>> {
    let models = table.models();
    let strategies = table.strategies();
    let curves: Vec<Vec<Curve>> = models
        .iter()
        .map(|model| {
            strategies
                .iter()
                .enumerate()
                .filter_map(|(s, strategy)| Some((s, curve(&table.group(model, strategy)?.runs))))
                .filter(|c| !c.1.is_empty())
                .collect()
        })
        .collect();
    if curves.iter().all(Vec::is_empty) {
        return Ok(None);
    }
    let x_desc = match axis {
        Axis::Time => "training time (s)",
        Axis::Megabytes => "bytes moved (MB)",
        Axis::Points if table.groups.iter().any(|g| g.runs[0].epochs.iter().any(|e| e.stream.is_some())) => {
            "batches of the stream"
        }
        Axis::Points => "epoch",
    };
    let width = 960;
    let entries: Vec<(SeriesStyle, &str)> =
        strategies.iter().enumerate().map(|(s, name)| (SeriesStyle::of(s), *name)).collect();
    let labels: Vec<&str> = strategies.clone();
    let (_, legend_height) = legend_size(&labels, width);
    let rows = models.len().div_ceil(2) as u32;
    let plots_height = 340 * rows + 40;
    svg((width, plots_height + legend_height), |root| {
        let (top, bottom) = root.split_vertically(plots_height);
        legend_below(&bottom, &entries, Sample::Line)?;
        for ((panel, model), curves) in
            crate::plots::panels(&top, title, models.len())?.iter().zip(&models).zip(&curves)
        {
            let points = curves.iter().flat_map(|c| c.1.iter());
            let (x_lo, x_hi, y_lo, y_hi) = points.fold((f64::MAX, 1e-12f64, f64::MAX, f64::MIN), |(a, b, c, d), p| {
                (a.min(p.0), b.max(p.0), c.min(p.1), d.max(p.1))
            });
            let log = axis != Axis::Points && x_lo > 0.0 && x_hi / x_lo > 10.0;
            let to_x = |x: f64| if log { x.log10() } else { x };
            let (x0, x1) = if log { (to_x(x_lo) - 0.05, to_x(x_hi) + 0.05) } else { (0.0, x_hi * 1.05) };
            let pad = ((y_hi - y_lo) * 0.08).max(0.01);
            let under = coinciding(curves);
            let caption = match under.iter().filter(|&&u| u > 0).count() {
                0 => model.to_string(),
                n => format!("{model} ({n} line{} on another: ringed)", if n == 1 { "" } else { "s" }),
            };
            let mut chart = ChartBuilder::on(panel)
                .caption(caption, (FONT, 16))
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(56)
                .build_cartesian_2d(x0..x1, (y_lo - pad)..(y_hi + pad))
                .map_err(err)?;
            let mut mesh = chart.configure_mesh();
            mesh.light_line_style(RGBColor(238, 238, 238)).label_style((FONT, 13)).y_desc(y_desc);
            let desc = if log { format!("{x_desc}, log scale") } else { x_desc.to_string() };
            mesh.x_desc(desc);
            // Evaluation points are whole numbers: a tick between two is left unlabelled, so that
            // a short run's axis never repeats a rounded label.
            let whole = |v: &f64| if v.fract() == 0.0 { format!("{v:.0}") } else { String::new() };
            if log {
                mesh.x_label_formatter(&|_| String::new());
            } else if axis == Axis::Points {
                mesh.x_label_formatter(&whole);
            }
            mesh.draw().map_err(err)?;
            if log {
                let ticks = log_ticks(x_lo, x_hi);
                for t in ticks {
                    let (x, y) = chart.backend_coord(&(t.log10(), y_lo - pad));
                    let style = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
                    top.draw(&Text::new(significant(t), (x, y + 6), style)).map_err(err)?;
                }
            }
            for ((s, points), under) in curves.iter().zip(under) {
                let style = SeriesStyle::of(*s);
                let points: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (to_x(x), y)).collect();
                style.line(&mut chart, &points)?;
                match under {
                    0 => style.markers(&mut chart, &points, 3)?,
                    _ => style.rings(&mut chart, &points, 3 + 3 * under as i32)?,
                }
            }
        }
        Ok(())
    })
    .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_curve_on_earlier_ones_counts_them() {
        let line = vec![(1.0, 0.5), (2.0, 0.4)];
        let other = vec![(1.0, 0.5), (2.0, 0.3)];
        let curves: Vec<Curve> = vec![(0, line.clone()), (1, line.clone()), (2, other), (3, line)];
        assert_eq!(coinciding(&curves), [0, 1, 0, 2]);
    }
}
