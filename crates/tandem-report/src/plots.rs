//! The report's SVG plots, drawn with plotters' SVG backend (text is left to the viewer's fonts).
//! Each function returns the SVG text, or `None` when the results hold nothing to plot.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::aggregate::{accuracy_curve, pareto_front, stage_breakdown, SettingTable, BASELINE};

/// One strategy's curve in a plot: its colour index, its name and its points.
type Curve<'a> = (usize, &'a str, Vec<(f64, f64)>);

pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type PlotResult<T> = Result<T, String>;

pub(crate) const FONT: &str = "sans-serif";
/// Distinguishable colours (Okabe–Ito), one per series.
const COLORS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
    RGBColor(240, 228, 66),
    RGBColor(0, 0, 0),
];

/// Minor grid lines.
const LIGHT: RGBColor = RGBColor(238, 238, 238);

/// The colour of a strategy: its position in the table's strategy order, so that every plot
/// draws a strategy in the same colour.
fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Category labels, drawn by hand on the root area (`backend_coord` gives root pixels) at the categories' centres (axis ticks fall where they like).
/// Draws the chart's legend at `position`, boxed on a near-opaque white background.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

fn label_style(h: HPos, v: VPos) -> TextStyle<'static> {
    TextStyle::from((FONT, 14).into_font()).pos(Pos::new(h, v))
}

/// Round values for a log axis from `lo` to `hi`: 1-2-5 steps per decade, or every digit when
/// that gives fewer than three.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
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
fn significant(v: f64) -> String {
    let decimals = if v >= 100.0 { 0 } else { (2.0 - v.abs().max(1e-12).log10().floor()).clamp(0.0, 12.0) as usize };
    let text = format!("{v:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A generous estimate of the width in pixels of `text` in the sans-serif font at `size` pixels
/// (the SVG viewer picks the font, so labels are given room for a wide one).
pub(crate) fn text_width(text: &str, size: i32) -> i32 {
    (text.chars().count() as f64 * size as f64 * 0.62).ceil() as i32
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
fn panels<'a>(root: &Area<'a>, title: &str, count: usize) -> PlotResult<Vec<Area<'a>>> {
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
        table.strategies().into_iter().enumerate().filter(|(_, s)| *s != BASELINE).collect();
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
    svg((860, 480), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(format!("Speedup over {BASELINE} (mean ± std over seeds)"), (FONT, 20))
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
        for (s, (colour, strategy)) in strategies.iter().enumerate() {
            let c = color(*colour);
            let mine: Vec<_> = bars.iter().filter(|b| b.1 == s).collect();
            chart
                .draw_series(
                    mine.iter()
                        .map(|b| Rectangle::new([(left(b.0, s), 0.0), (left(b.0, s) + width * 0.9, b.2)], c.filled())),
                )
                .map_err(err)?
                .label(*strategy)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
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
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
    .map(Some)
}

/// Holdout accuracy after each epoch against cumulative training time, one line per strategy
/// (mean over seeds), one panel per model.
pub fn accuracy_over_time(table: &SettingTable) -> PlotResult<Option<String>> {
    let models = table.models();
    let strategies = table.strategies();
    if models.is_empty() {
        return Ok(None);
    }
    let rows = models.len().div_ceil(2) as u32;
    svg((960, 360 * rows + 40), |root| {
        for (panel, model) in
            panels(root, "Holdout accuracy against training time (mean over seeds)", models.len())?.iter().zip(&models)
        {
            let curves: Vec<Curve> = strategies
                .iter()
                .enumerate()
                .filter_map(|(s, strategy)| Some((s, *strategy, accuracy_curve(&table.group(model, strategy)?.runs))))
                .filter(|c| !c.2.is_empty())
                .collect();
            let points = curves.iter().flat_map(|c| c.2.iter());
            let (t_max, a_min, a_max) =
                points.fold((1e-9f64, 1.0f64, 0.0f64), |(t, lo, hi), p| (t.max(p.0), lo.min(p.1), hi.max(p.1)));
            let (lo, hi) = ((a_min * 100.0 - 2.0).max(0.0), (a_max * 100.0 + 2.0).min(100.0));
            let mut chart = ChartBuilder::on(panel)
                .caption(*model, (FONT, 16))
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(50)
                .build_cartesian_2d(0.0..t_max * 1.05, lo.min(hi - 1.0)..hi)
                .map_err(err)?;
            chart
                .configure_mesh()
                .light_line_style(LIGHT)
                .label_style((FONT, 13))
                .x_desc("training time (s)")
                .y_desc("holdout accuracy (%)")
                .draw()
                .map_err(err)?;
            for (s, strategy, curve) in &curves {
                let c = color(*s);
                let pts: Vec<(f64, f64)> = curve.iter().map(|(t, a)| (*t, a * 100.0)).collect();
                chart
                    .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                    .map_err(err)?
                    .label(*strategy)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], c.stroke_width(2)));
                chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled()))).map_err(err)?;
            }
            legend(&mut chart, SeriesLabelPosition::LowerRight)?;
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
    let rows = models.len().div_ceil(2) as u32;
    svg((960, 360 * rows + 40), |root| {
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
            for (s, strategy, p) in &points {
                let c = color(*s);
                chart
                    .draw_series(std::iter::once(Circle::new(*p, 5, c.filled())))
                    .map_err(err)?
                    .label(*strategy)
                    .legend(move |(x, y)| Circle::new((x + 6, y), 5, c.filled()));
            }
            legend(&mut chart, SeriesLabelPosition::LowerRight)?;
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
    svg((960, 130 + 34 * n as u32), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption("Model-parallel stages: where the last epoch's time went (mean over seeds)", (FONT, 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(380)
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
        for (k, part) in ["compute", "transfer", "idle"].iter().enumerate() {
            let c = [color(0), color(5), RGBColor(190, 190, 190)][k];
            chart
                .draw_series(bars.iter().enumerate().map(|(i, (_, t))| {
                    let start: f64 = t[..k].iter().sum();
                    let y = (n - 1 - i) as f64;
                    Rectangle::new([(start, y + 0.15), (start + t[k], y + 0.85)], c.filled())
                }))
                .map_err(err)?
                .label(*part)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        }
        for (i, (name, _)) in bars.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(0.0, (n - 1 - i) as f64 + 0.5));
            root.draw(&Text::new(name.clone(), (x - 8, y), label_style(HPos::Right, VPos::Center))).map_err(err)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
    .map(Some)
}
