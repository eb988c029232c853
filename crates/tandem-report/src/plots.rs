//! The report's SVG plots, drawn with plotters' SVG backend (text is left to the viewer's fonts).
//! Each function returns the SVG text, or `None` when the results hold nothing to plot.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::aggregate::{pareto_front, stage_breakdown, SettingTable};
use crate::style::{err, legend_below, legend_size, text_width, Sample, SeriesStyle, FONT};
use crate::sync::{self, SyncComparison};

pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
pub(crate) type PlotResult<T> = Result<T, String>;

/// Minor grid lines.
const LIGHT: RGBColor = RGBColor(238, 238, 238);

fn label_style(h: HPos, v: VPos) -> TextStyle<'static> {
    TextStyle::from((FONT, 14).into_font()).pos(Pos::new(h, v))
}

/// Round values for a log axis from `lo` to `hi`: 1-2-5 steps per decade, or every digit when
/// that gives fewer than three.
pub(crate) fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let decades = (lo.log10().floor() as i32)..=(hi.log10().ceil() as i32);
    let ticks = |digits: &[f64]| -> Vec<f64> {
        decades
            .clone()
            .flat_map(|d| digits.iter().map(move |m| m * 10f64.powi(d)))
            .filter(|v| (lo..=hi).contains(v))
            .collect()
    };
    let coarse = ticks(&[1.0, 2.0, 5.0]);
    if coarse.len() >= 3 {
        coarse
    } else {
        ticks(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    }
}

/// A positive number with about three significant digits and no trailing zeros.
pub(crate) fn significant(v: f64) -> String {
    let decimals = if v >= 100.0 { 0 } else { (2.0 - v.abs().max(1e-12).log10().floor()).clamp(0.0, 12.0) as usize };
    let text = format!("{v:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// Draws into an SVG string of `size` pixels.
pub(crate) fn svg(size: (u32, u32), draw: impl FnOnce(&Area) -> PlotResult<()>) -> PlotResult<String> {
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, size).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        draw(&root)?;
        root.present().map_err(err)?;
    }
    Ok(text)
}

/// Splits `root` into one panel per model (up to 2 columns), under a title.
pub(crate) fn panels<'a>(root: &Area<'a>, title: &str, count: usize) -> PlotResult<Vec<Area<'a>>> {
    let body = root.titled(title, (FONT, 20)).map_err(err)?;
    let cols = count.clamp(1, 2);
    let rows = count.div_ceil(cols).max(1);
    Ok(body.split_evenly((rows, cols)).into_iter().take(count).collect())
}

/// Mean speedup over the baseline per architecture (groups of bars, one per strategy), with
/// ± one standard deviation over seeds and a line at 1×.
pub fn speedup(table: &SettingTable) -> PlotResult<Option<String>> {
    let models = table.models();
    // (colour index, label) of every strategy but the baseline, which is the line at 1×.
    let strategies: Vec<(usize, &str)> =
        table.strategies().into_iter().enumerate().filter(|(_, s)| !table.is_baseline(s)).collect();
    let bars: Vec<(usize, usize, f64, f64)> = models
        .iter()
        .enumerate()
        .flat_map(|(m, model)| strategies.iter().enumerate().map(move |(s, (_, strategy))| (m, s, *model, *strategy)))
        .filter_map(|(m, s, model, strategy)| {
            let stat = table.group(model, strategy)?.speedup?;
            Some((m, s, stat.mean, stat.std))
        })
        .collect();
    if bars.is_empty() {
        return Ok(None);
    }
    let top = bars.iter().map(|b| b.2 + b.3).fold(1.0f64, f64::max) * 1.15;
    let width = 0.8 / strategies.len() as f64;
    let left = |m: usize, s: usize| m as f64 + 0.1 + s as f64 * width;
    let entries: Vec<(SeriesStyle, &str)> = strategies.iter().map(|(i, s)| (SeriesStyle::of(*i), *s)).collect();
    let (_, legend_height) = legend_size(&entries.iter().map(|e| e.1).collect::<Vec<_>>(), 960);
    svg((960, 480 + legend_height), |root| {
        let (root, below) = root.split_vertically(480);
        legend_below(&below, &entries, Sample::Bar)?;
        let root = &root;
        let mut chart = ChartBuilder::on(root)
            .caption("Speedup over sequential (mean ± std over seeds)", (FONT, 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..models.len() as f64, 0.0..top)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(LIGHT)
            .label_style((FONT, 13))
            .disable_x_mesh()
            .x_label_formatter(&|_| String::new())
            .y_desc("speedup (×)")
            .draw()
            .map_err(err)?;
        for (s, (colour, _)) in strategies.iter().enumerate() {
            let style = SeriesStyle::of(*colour);
            let mine: Vec<_> = bars.iter().filter(|b| b.1 == s).collect();
            for b in &mine {
                style.bar(&mut chart, [(left(b.0, s), 0.0), (left(b.0, s) + width * 0.9, b.2)])?;
            }
            chart
                .draw_series(mine.iter().map(|b| {
                    let x = left(b.0, s) + width * 0.45;
                    PathElement::new(vec![(x, b.2 - b.3), (x, b.2 + b.3)], BLACK.stroke_width(1))
                }))
                .map_err(err)?;
        }
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, 1.0), (models.len() as f64, 1.0)],
                BLACK.mix(0.6).stroke_width(1),
            )))
            .map_err(err)?;
        for (m, model) in models.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(m as f64 + 0.5, 0.0));
            root.draw(&Text::new(model.to_string(), (x, y + 8), label_style(HPos::Center, VPos::Top))).map_err(err)?;
        }
        Ok(())
    })
    .map(Some)
}

/// Bytes communicated over a run against holdout accuracy, one point per strategy that
/// communicates (mean over seeds), one panel per model; the Pareto front (least bytes for the
/// accuracy) is joined by a dashed line and its points ringed.
pub fn communication_vs_accuracy(table: &SettingTable) -> PlotResult<Option<String>> {
    let strategies = table.strategies();
    let models: Vec<&str> = table
        .models()
        .into_iter()
        .filter(|m| strategies.iter().any(|s| table.group(m, s).is_some_and(|g| g.bytes.is_some())))
        .collect();
    if models.is_empty() {
        return Ok(None);
    }
    let entries: Vec<(SeriesStyle, &str)> = strategies
        .iter()
        .enumerate()
        .filter(|(_, s)| models.iter().any(|m| table.group(m, s).is_some_and(|g| g.bytes.is_some())))
        .map(|(i, s)| (SeriesStyle::of(i), *s))
        .collect();
    let (_, legend_height) = legend_size(&entries.iter().map(|e| e.1).collect::<Vec<_>>(), 960);
    let rows = models.len().div_ceil(2) as u32;
    let plots_height = 360 * rows + 40;
    svg((960, plots_height + legend_height), |root| {
        let (root, below) = root.split_vertically(plots_height);
        legend_below(&below, &entries, Sample::Marker)?;
        let root = &root;
        for (panel, model) in
            panels(root, "Communication against accuracy (mean over seeds; Pareto front dashed)", models.len())?
                .iter()
                .zip(&models)
        {
            let points: Vec<(usize, &str, (f64, f64))> = strategies
                .iter()
                .enumerate()
                .filter_map(|(s, strategy)| {
                    let g = table.group(model, strategy)?;
                    Some((s, *strategy, (g.bytes?.mean.max(1.0) / 1e6, g.accuracy.mean * 100.0)))
                })
                .collect();
            let (b_lo, b_hi) = points.iter().fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.2 .0), hi.max(p.2 .0)));
            let (a_lo, a_hi) = points.iter().fold((100.0f64, 0.0f64), |(lo, hi), p| (lo.min(p.2 .1), hi.max(p.2 .1)));
            let mut chart = ChartBuilder::on(panel)
                .caption(*model, (FONT, 16))
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(50)
                .build_cartesian_2d(
                    (b_lo / 1.5..b_hi * 1.5).log_scale(),
                    (a_lo - 2.0).max(0.0)..(a_hi + 2.0).min(100.0),
                )
                .map_err(err)?;
            chart
                .configure_mesh()
                .light_line_style(LIGHT)
                .label_style((FONT, 13))
                .x_label_formatter(&|_| String::new())
                .x_desc("MB communicated per run (log)")
                .y_desc("holdout accuracy (%)")
                .draw()
                .map_err(err)?;
            // plotters puts no labels on a log axis spanning less than a decade: place our own.
            for mb in log_ticks(b_lo / 1.5, b_hi * 1.5) {
                let (x, y) = chart.backend_coord(&(mb, (a_lo - 2.0).max(0.0)));
                root.draw(&Text::new(significant(mb), (x, y + 6), label_style(HPos::Center, VPos::Top)))
                    .map_err(err)?;
            }
            let front: Vec<(f64, f64)> = pareto_front(&points.iter().map(|p| p.2).collect::<Vec<_>>())
                .into_iter()
                .map(|i| points[i].2)
                .collect();
            chart
                .draw_series(DashedLineSeries::new(front.clone(), 6, 4, BLACK.mix(0.7).stroke_width(1)))
                .map_err(err)?;
            chart.draw_series(front.iter().map(|p| Circle::new(*p, 8, BLACK.stroke_width(1)))).map_err(err)?;
            for (s, _, p) in &points {
                SeriesStyle::of(*s).markers(&mut chart, &[*p], 5)?;
            }
        }
        Ok(())
    })
    .map(Some)
}

/// Per stage of each model-parallel group, the last epoch's compute / transfer / idle seconds
/// (mean over seeds) as stacked horizontal bars.
pub fn stage_time(table: &SettingTable) -> PlotResult<Option<String>> {
    let bars: Vec<(String, [f64; 3])> = table
        .groups
        .iter()
        .flat_map(|g| {
            stage_breakdown(&g.runs)
                .into_iter()
                .enumerate()
                .map(move |(s, t)| (format!("{} {} · stage {s}", g.model, g.strategy), t))
        })
        .collect();
    if bars.is_empty() {
        return Ok(None);
    }
    let longest = bars.iter().map(|b| b.1.iter().sum::<f64>()).fold(1e-9, f64::max);
    let n = bars.len();
    let parts = ["compute", "transfer", "idle"];
    let colours = [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(190, 190, 190)];
    let entries: Vec<(SeriesStyle, &str)> =
        colours.iter().zip(parts).map(|(&color, part)| (SeriesStyle { color, variant: 0 }, part)).collect();
    // The bars' names left of the axis, measured so that none is cut.
    let label_area = bars.iter().map(|b| text_width(&b.0, 14)).max().unwrap_or(0) + 24;
    let width = (label_area + 560).max(960) as u32;
    let (_, legend_height) = legend_size(&parts, width);
    let plots_height = 130 + 34 * n as u32;
    svg((width, plots_height + legend_height), |root| {
        let (root, below) = root.split_vertically(plots_height);
        legend_below(&below, &entries, Sample::Bar)?;
        let root = &root;
        let mut chart = ChartBuilder::on(root)
            .caption("Model-parallel stages: where the last epoch's time went (mean over seeds)", (FONT, 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(label_area as u32)
            .build_cartesian_2d(0.0..longest * 1.4, 0.0..n as f64)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(LIGHT)
            .label_style((FONT, 13))
            .disable_y_mesh()
            .y_label_formatter(&|_| String::new())
            .x_desc("seconds")
            .draw()
            .map_err(err)?;
        for (k, c) in colours.iter().enumerate() {
            chart
                .draw_series(bars.iter().enumerate().map(|(i, (_, t))| {
                    let start: f64 = t[..k].iter().sum();
                    let y = (n - 1 - i) as f64;
                    Rectangle::new([(start, y + 0.15), (start + t[k], y + 0.85)], c.filled())
                }))
                .map_err(err)?;
        }
        for (i, (name, _)) in bars.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(0.0, (n - 1 - i) as f64 + 0.5));
            root.draw(&Text::new(name.clone(), (x - 8, y), label_style(HPos::Right, VPos::Center))).map_err(err)?;
        }
        Ok(())
    })
    .map(Some)
}

/// Points lost beyond the target's below which the protocols plot stops (such points sit on its
/// floor, labelled with their change).
const PROTOCOL_FLOOR: f64 = 12.0;

/// The top of each label of `height` pixels wanted at (left, top, width), in order: where it is
/// wanted, or moved up a line at a time until it overlaps no label placed before it.
fn place_labels(wanted: &[(i32, i32, i32)], height: i32) -> Vec<i32> {
    let mut placed: Vec<(i32, i32, i32)> = Vec::new();
    for &(left, top, width) in wanted {
        let overlaps = |t: i32, p: &(i32, i32, i32)| {
            left < p.0 + p.2 && p.0 < left + width && t < p.1 + height && p.1 < t + height
        };
        let mut t = top;
        while placed.iter().any(|p| overlaps(t, p)) {
            t -= height;
        }
        placed.push((left, t, width));
    }
    placed.iter().map(|p| p.1).collect()
}

/// Per model, each protocol against vanilla model parallelism: less communication (log) against
/// the accuracy change in points, the marker's size growing with the speedup (its value beside
/// it), the target region of the experiment's `[report]` (e.g. ≥ 27× less communication, ≥ −3
/// points), where it sets one, shaded, and the Pareto front
/// (most reduction for the accuracy) dashed with its points ringed. Each protocol has a number,
/// in the legend and before its points' labels (which move up until no two overlap), since past
/// ten protocols colours repeat with other marker shapes.
pub fn protocols(table: &SettingTable) -> PlotResult<Option<String>> {
    let comparisons: Vec<SyncComparison> =
        sync::compare(table).into_iter().filter(|c| c.communication_reduction.is_some()).collect();
    let models: Vec<&str> = table.models().into_iter().filter(|m| comparisons.iter().any(|c| c.model == *m)).collect();
    if models.is_empty() {
        return Ok(None);
    }
    let strategies = table.strategies();
    let style_of = |strategy: &str| SeriesStyle::of(strategies.iter().position(|s| *s == strategy).unwrap_or(0));
    let mut labels: Vec<&str> = Vec::new();
    for c in &comparisons {
        if !labels.contains(&c.strategy.as_str()) {
            labels.push(&c.strategy);
        }
    }
    let numbered: Vec<String> = labels.iter().enumerate().map(|(k, s)| format!("{} {s}", k + 1)).collect();
    let number_of = |strategy: &str| labels.iter().position(|s| *s == strategy).map_or(0, |k| k + 1);
    let entries: Vec<(SeriesStyle, &str)> =
        labels.iter().zip(&numbered).map(|(s, text)| (style_of(s), text.as_str())).collect();
    let (_, legend_height) = legend_size(&numbered.iter().map(String::as_str).collect::<Vec<_>>(), 960);
    let rows = models.len().div_ceil(2) as u32;
    let plots_height = 400 * rows + 40;
    let title = "Protocols against vanilla model parallelism (mean over seeds; marker size and label: speedup)";
    // The accuracy the verdict reads: validation where the runs have a split.
    let on_validation = comparisons.iter().any(|c| c.intervals.validation_change.is_some());
    let y_desc = if on_validation { "validation accuracy change (points)" } else { "accuracy change (points)" };
    // Without a target, the axes still reach vanilla's point (1×, 0 points).
    let target = table.report.target;
    let (target_reduction, target_points) = target.map_or((1.0, 0.0), |t| (t.communication_reduction, t.points_lost));
    svg((960, plots_height + legend_height), |root| {
        let (root, below) = root.split_vertically(plots_height);
        legend_below(&below, &entries, Sample::Marker)?;
        let root = &root;
        for (panel, model) in panels(root, title, models.len())?.iter().zip(&models) {
            let points: Vec<(&SyncComparison, (f64, f64))> = comparisons
                .iter()
                .filter(|c| c.model == *model)
                .map(|c| {
                    let change = c.judged_change().map_or(c.accuracy_change, |i| i.mean * 100.0);
                    (c, (c.communication_reduction.unwrap_or(1.0).max(1e-3), change))
                })
                .collect();
            let fold = |f: fn(f64, f64) -> f64, of: fn(&(f64, f64)) -> f64, start: f64| {
                points.iter().map(|p| of(&p.1)).fold(start, f)
            };
            let (x_lo, x_hi) =
                (fold(f64::min, |p| p.0, target_reduction) / 1.5, fold(f64::max, |p| p.0, target_reduction) * 1.5);
            // Points far below the target would squeeze the ones near it: they sit on the floor,
            // labelled with their change.
            let floor = -target_points - PROTOCOL_FLOOR;
            let y_lo = fold(f64::min, |p| p.1, -target_points).max(floor) - 2.0;
            let y_hi = fold(f64::max, |p| p.1, 0.0) + 2.0;
            let mut chart = ChartBuilder::on(panel)
                .caption(*model, (FONT, 16))
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(50)
                .build_cartesian_2d((x_lo..x_hi).log_scale(), y_lo..y_hi)
                .map_err(err)?;
            chart
                .configure_mesh()
                .light_line_style(WHITE)
                .label_style((FONT, 13))
                .x_label_formatter(&|_| String::new())
                .x_desc("less communication than vanilla (×, log)")
                .y_desc(y_desc)
                .draw()
                .map_err(err)?;
            for factor in log_ticks(x_lo, x_hi) {
                let (x, y) = chart.backend_coord(&(factor, y_lo));
                root.draw(&Text::new(significant(factor), (x, y + 6), label_style(HPos::Center, VPos::Top)))
                    .map_err(err)?;
            }
            if target.is_some() {
                let region = [(target_reduction, -target_points), (x_hi, y_hi)];
                chart
                    .draw_series(std::iter::once(Rectangle::new(region, RGBColor(44, 160, 44).mix(0.12).filled())))
                    .map_err(err)?;
            }
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x_lo, 0.0), (x_hi, 0.0)],
                    BLACK.mix(0.4).stroke_width(1),
                )))
                .map_err(err)?;
            // The front: most reduction for the accuracy (least bytes, i.e. 1 / reduction).
            let front: Vec<(f64, f64)> =
                pareto_front(&points.iter().map(|(_, (r, a))| (1.0 / r, *a)).collect::<Vec<_>>())
                    .into_iter()
                    .map(|i| points[i].1)
                    .collect();
            chart
                .draw_series(DashedLineSeries::new(front.clone(), 6, 4, BLACK.mix(0.7).stroke_width(1)))
                .map_err(err)?;
            chart.draw_series(front.iter().map(|p| Circle::new(*p, 11, BLACK.stroke_width(1)))).map_err(err)?;
            let mut labelled = Vec::new();
            for (c, (reduction, change)) in &points {
                let size = (3.0 + 2.0 * c.speedup.max(1.0).ln()).round() as i32;
                let shown = (*reduction, change.max(y_lo + 1.0));
                style_of(&c.strategy).markers(&mut chart, &[shown], size.min(9))?;
                let (x, y) = chart.backend_coord(&shown);
                // A point on the floor says how far below it really is.
                let text = match *change < y_lo + 1.0 {
                    true => format!("{}: {:.1}×, {change:+.0} pts", number_of(&c.strategy), c.speedup),
                    false => format!("{}: {:.1}×", number_of(&c.strategy), c.speedup),
                };
                labelled.push(((x, y), text));
            }
            let wanted: Vec<(i32, i32, i32)> =
                labelled.iter().map(|((x, y), text)| (x + 10, y - 14, text_width(text, 11))).collect();
            for (((x, y), text), top) in labelled.iter().zip(place_labels(&wanted, 13)) {
                if top != y - 14 {
                    // Moved up: a thin line back to its point.
                    let leader = PathElement::new(vec![(*x + 4, *y - 4), (*x + 10, top + 10)], BLACK.mix(0.4));
                    root.draw(&leader).map_err(err)?;
                }
                let style = TextStyle::from((FONT, 11).into_font());
                root.draw(&Text::new(text.clone(), (x + 10, top), style)).map_err(err)?;
            }
        }
        Ok(())
    })
    .map(Some)
}

#[cfg(test)]
mod tests {
    use super::place_labels;

    #[test]
    fn labels_that_would_overlap_move_up_until_none_does() {
        // Three labels at one point, one beside them, one far away.
        let wanted = [(100, 50, 40), (100, 50, 40), (110, 50, 40), (300, 50, 40), (100, 50, 40)];
        assert_eq!(place_labels(&wanted, 13), [50, 37, 24, 50, 11]);
    }
}
