//! Per-class figures: precision / recall / F1 per class (mean over seeds) and the confusion
//! matrix of each model × strategy (summed over seeds) as an SVG heat map of row-normalised
//! counts (each cell: the share of a true class predicted as a class; the diagonal is recall).

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::aggregate::{Group, SettingTable};
use crate::document::{Block, Document, GalleryFigure};
use crate::plots::svg;
use crate::style::{err, text_width, FONT};
use tandem_results::{ClassMetrics, ConfusionMatrix};

/// AG News's classes, in label order.
pub const AG_NEWS_CLASSES: [&str; 4] = ["World", "Sports", "Business", "Sci/Tech"];

/// The names of `classes` classes: AG News's when there are four, else "class 0", "class 1"….
pub fn class_names(classes: usize) -> Vec<String> {
    match classes == AG_NEWS_CLASSES.len() {
        true => AG_NEWS_CLASSES.map(String::from).to_vec(),
        false => (0..classes).map(|k| format!("class {k}")).collect(),
    }
}

/// Per class, the mean over the group's runs of (precision, recall, F1).
pub fn per_class_means(group: &Group) -> Vec<[f64; 3]> {
    let metrics: Vec<_> = group.runs.iter().filter_map(|r| r.finished()?.final_metrics.as_ref()).collect();
    let classes = metrics.iter().map(|m| m.per_class.len()).min().unwrap_or(0);
    let n = metrics.len() as f64;
    (0..classes)
        .map(|k| {
            let sum = |f: fn(&ClassMetrics) -> f64| metrics.iter().map(|m| f(&m.per_class[k])).sum::<f64>();
            [sum(|c| c.precision) / n, sum(|c| c.recall) / n, sum(|c| c.f1) / n]
        })
        .collect()
}

/// The confusion matrix of the group's final evaluations, summed over its runs; `None` when a
/// run has none or the sizes differ.
pub fn summed_confusion(group: &Group) -> Option<ConfusionMatrix> {
    let mut total: Option<ConfusionMatrix> = None;
    for run in &group.runs {
        let matrix = &run.finished()?.final_metrics.as_ref()?.confusion;
        match &mut total {
            None => total = Some(matrix.clone()),
            Some(t) if t.classes() == matrix.classes() => t.merge(matrix),
            Some(_) => return None,
        }
    }
    total
}

/// The per-class tables (one per model) and the confusion heat maps of a setting.
pub(crate) fn section(doc: &mut Document, table: &SettingTable, suffix: &str) -> Result<(), String> {
    let classes = table.groups.iter().map(|g| per_class_means(g).len()).max().unwrap_or(0);
    if classes == 0 {
        return Ok(());
    }
    let names = class_names(classes);
    doc.push(Block::Heading(2, "Per class".into()));
    doc.push(Block::Paragraph(
        "Holdout precision / recall / F1 (%) of each class after the last evaluation, means over seeds (n seeds)."
            .into(),
    ));
    for model in table.models() {
        doc.push(Block::Heading(3, model.to_string()));
        let mut header = vec!["strategy".to_string(), "n".to_string()];
        header.extend(names.iter().map(|c| format!("{c} P / R / F1")));
        let rows = table
            .groups
            .iter()
            .filter(|g| g.model == model)
            .map(|g| {
                let mut row = vec![g.strategy.clone(), g.runs.len().to_string()];
                let means = per_class_means(g);
                row.extend((0..classes).map(|k| match means.get(k) {
                    Some([p, r, f]) => format!("{:.1} / {:.1} / {:.1}", p * 100.0, r * 100.0, f * 100.0),
                    None => "—".into(),
                }));
                row
            })
            .collect();
        doc.push(Block::Table { header, rows });
    }
    let mut figures = Vec::new();
    for g in &table.groups {
        let Some(confusion) = summed_confusion(g) else { continue };
        figures.push(GalleryFigure {
            file: format!("confusion-{}-{}{suffix}.svg", g.model, g.strategy),
            title: format!("{} · {}", g.model, g.strategy),
            svg: heat_map(&g.model, &g.strategy, &confusion.counts, g.runs.len())?,
        });
    }
    if !figures.is_empty() {
        doc.push(Block::Gallery {
            caption: "Confusion matrices, summed over seeds: rows are the true class, columns the predicted one; each cell shows the share of its row (the diagonal is the class's recall) and the count.".into(),
            figures,
        });
    }
    Ok(())
}

const SIDE: i32 = 70;
/// Room for the row labels (class names) left of the grid.
const LEFT: i32 = 90;
const TOP: i32 = 92;

/// The heat map of `counts` (`counts[truth][predicted]`, summed over `seeds` runs).
pub(crate) fn heat_map(model: &str, strategy: &str, counts: &[Vec<u64>], seeds: usize) -> Result<String, String> {
    let k = counts.len() as i32;
    let names = class_names(counts.len());
    // One size for every heat map, so that they line up in a grid: long strategy names wrap.
    let width = (LEFT + SIDE * k + 20) as u32;
    let height = (TOP + SIDE * k + 40) as u32;
    let lines = wrap(strategy, width as i32 - 16, 12);
    let text = |size: i32, h: HPos, v: VPos| TextStyle::from((FONT, size).into_font()).pos(Pos::new(h, v));
    let left = LEFT;
    svg((width, height), |root| {
        let centre = width as i32 / 2;
        root.draw(&Text::new(model.to_string(), (centre, 6), text(15, HPos::Center, VPos::Top))).map_err(err)?;
        for (i, line) in lines.iter().take(2).enumerate() {
            let y = 25 + 15 * i as i32;
            root.draw(&Text::new(line.clone(), (centre, y), text(12, HPos::Center, VPos::Top))).map_err(err)?;
        }
        let grid_centre = left + SIDE * k / 2;
        root.draw(&Text::new("predicted", (grid_centre, 58), text(12, HPos::Center, VPos::Top))).map_err(err)?;
        for (i, row) in counts.iter().enumerate() {
            let total = row.iter().sum::<u64>().max(1) as f64;
            let y = TOP + SIDE * i as i32;
            root.draw(&Text::new(names[i].clone(), (left - 6, y + SIDE / 2), text(12, HPos::Right, VPos::Center)))
                .map_err(err)?;
            for (j, &count) in row.iter().enumerate() {
                let x = left + SIDE * j as i32;
                let share = count as f64 / total;
                let shade = |full: u8| (255.0 - share * (255.0 - full as f64)).round() as u8;
                let fill = RGBColor(shade(8), shade(69), shade(148));
                root.draw(&Rectangle::new([(x, y), (x + SIDE, y + SIDE)], fill.filled())).map_err(err)?;
                root.draw(&Rectangle::new([(x, y), (x + SIDE, y + SIDE)], WHITE.stroke_width(1))).map_err(err)?;
                let ink = if share > 0.5 { WHITE } else { BLACK };
                let style = |size| text(size, HPos::Center, VPos::Center).color(&ink);
                root.draw(&Text::new(format!("{:.0}%", share * 100.0), (x + SIDE / 2, y + SIDE / 2 - 7), style(15)))
                    .map_err(err)?;
                root.draw(&Text::new(count.to_string(), (x + SIDE / 2, y + SIDE / 2 + 12), style(11))).map_err(err)?;
            }
        }
        for (j, name) in names.iter().enumerate() {
            let x = left + SIDE * j as i32 + SIDE / 2;
            root.draw(&Text::new(name.clone(), (x, TOP - 4), text(12, HPos::Center, VPos::Bottom))).map_err(err)?;
        }
        root.draw(&Text::new("true", (left - 6, TOP - 4), text(12, HPos::Right, VPos::Bottom))).map_err(err)?;
        let note = format!("summed over {seeds} seed{}; shade = share of the row", if seeds == 1 { "" } else { "s" });
        root.draw(&Text::new(note, (grid_centre, TOP + SIDE * k + 12), text(11, HPos::Center, VPos::Top)))
            .map_err(err)?;
        Ok(())
    })
}

/// `text` in lines of at most `max_px` pixels at font `size`, broken after hyphens.
fn wrap(text: &str, max_px: i32, size: i32) -> Vec<String> {
    let mut lines = vec![String::new()];
    for piece in text.split_inclusive('-') {
        let last = lines.last_mut().expect("lines start with one");
        if !last.is_empty() && text_width(&format!("{last}{piece}"), size) > max_px {
            lines.push(piece.to_string());
        } else {
            last.push_str(piece);
        }
    }
    lines
}
