//! Series styles and the legend: every strategy of a setting gets its own colour and line/marker
//! style (ten colours, then the same colours dashed with squares, then dotted with triangles), and
//! legends sit below the plots in columns sized to their labels, never over the data.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The font of every label (the SVG viewer picks which sans-serif).
pub(crate) const FONT: &str = "sans-serif";

/// A plotting error as the report's error text.
pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A generous estimate of the width in pixels of `text` in the sans-serif font at `size` pixels
/// (the SVG viewer picks the font, so labels are given room for a wide one).
pub(crate) fn text_width(text: &str, size: i32) -> i32 {
    (text.chars().count() as f64 * size as f64 * 0.62).ceil() as i32
}

/// Ten distinguishable colours (Tableau 10).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// How one series is drawn: the `index`-th strategy of the setting's table order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeriesStyle {
    pub color: RGBColor,
    /// 0: solid line, circles; 1: dashed, squares; 2: dotted, triangles.
    pub variant: usize,
}

impl SeriesStyle {
    /// Unique for the first 30 series.
    pub fn of(index: usize) -> Self {
        Self { color: PALETTE[index % PALETTE.len()], variant: (index / PALETTE.len()) % 3 }
    }

    /// The line through `points` in this style.
    pub fn line<'a, DB: DrawingBackend + 'a, CT: CoordTranslate<From = (f64, f64)>>(
        &self,
        chart: &mut ChartContext<'a, DB, CT>,
        points: &[(f64, f64)],
    ) -> Result<(), String> {
        let stroke = self.color.stroke_width(2);
        let points = points.to_vec();
        match self.variant {
            0 => chart.draw_series(LineSeries::new(points, stroke)).map(|_| ()),
            1 => chart.draw_series(DashedLineSeries::new(points, 9, 5, stroke)).map(|_| ()),
            _ => chart.draw_series(DashedLineSeries::new(points, 2, 4, stroke)).map(|_| ()),
        }
        .map_err(err)
    }

    /// This style's marker at each of `points` (`size`: radius in pixels).
    pub fn markers<'a, DB: DrawingBackend + 'a, CT: CoordTranslate<From = (f64, f64)>>(
        &self,
        chart: &mut ChartContext<'a, DB, CT>,
        points: &[(f64, f64)],
        size: i32,
    ) -> Result<(), String> {
        let fill = self.color.filled();
        let square = |p: (f64, f64)| EmptyElement::at(p) + Rectangle::new([(-size, -size), (size, size)], fill);
        match self.variant {
            0 => chart.draw_series(points.iter().map(|&p| Circle::new(p, size, fill))).map(|_| ()),
            1 => chart.draw_series(points.iter().map(|&p| square(p))).map(|_| ()),
            _ => chart.draw_series(points.iter().map(|&p| TriangleMarker::new(p, size + 1, fill))).map(|_| ()),
        }
        .map_err(err)
    }

    /// A ring of `radius` pixels around each of `points`: a series drawn over others marks its
    /// points without hiding theirs.
    pub fn rings<'a, DB: DrawingBackend + 'a, CT: CoordTranslate<From = (f64, f64)>>(
        &self,
        chart: &mut ChartContext<'a, DB, CT>,
        points: &[(f64, f64)],
        radius: i32,
    ) -> Result<(), String> {
        let stroke = self.color.stroke_width(2);
        chart.draw_series(points.iter().map(|&p| Circle::new(p, radius, stroke))).map(|_| ()).map_err(err)
    }

    /// A bar from `corners[0]` to `corners[1]` in this style: filled; outlined from the eleventh
    /// series on, and crossed by a white line from the twenty-first.
    pub fn bar<'a, DB: DrawingBackend + 'a, CT: CoordTranslate<From = (f64, f64)>>(
        &self,
        chart: &mut ChartContext<'a, DB, CT>,
        corners: [(f64, f64); 2],
    ) -> Result<(), String> {
        chart.draw_series(std::iter::once(Rectangle::new(corners, self.color.filled()))).map_err(err)?;
        if self.variant >= 1 {
            chart.draw_series(std::iter::once(Rectangle::new(corners, BLACK.stroke_width(1)))).map_err(err)?;
        }
        if self.variant >= 2 {
            let [(x0, y0), (x1, y1)] = corners;
            let mid = vec![((x0 + x1) / 2.0, y0), ((x0 + x1) / 2.0, y1)];
            chart.draw_series(std::iter::once(PathElement::new(mid, WHITE.stroke_width(2)))).map_err(err)?;
        }
        Ok(())
    }

    /// The legend's sample of this style at `(x, y)` (its left end), drawn as `kind`.
    fn sample<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        x: i32,
        y: i32,
        kind: Sample,
    ) -> Result<(), String> {
        let stroke = self.color.stroke_width(2);
        let fill = self.color.filled();
        if kind == Sample::Bar {
            let corners = [(x, y - 6), (x + 22, y + 6)];
            area.draw(&Rectangle::new(corners, fill)).map_err(err)?;
            if self.variant >= 1 {
                area.draw(&Rectangle::new(corners, BLACK.stroke_width(1))).map_err(err)?;
            }
            if self.variant >= 2 {
                area.draw(&PathElement::new(vec![(x + 11, y - 6), (x + 11, y + 6)], WHITE.stroke_width(2)))
                    .map_err(err)?;
            }
            return Ok(());
        }
        if kind == Sample::Line {
            match self.variant {
                0 => area.draw(&PathElement::new(vec![(x, y), (x + 26, y)], stroke)).map_err(err)?,
                1 => {
                    area.draw(&PathElement::new(vec![(x, y), (x + 9, y)], stroke)).map_err(err)?;
                    area.draw(&PathElement::new(vec![(x + 17, y), (x + 26, y)], stroke)).map_err(err)?
                }
                _ => {
                    for dot in (0..26).step_by(6) {
                        area.draw(&PathElement::new(vec![(x + dot, y), (x + dot + 2, y)], stroke)).map_err(err)?;
                    }
                }
            }
        }
        let c = (x + 13, y);
        match self.variant {
            0 => area.draw(&Circle::new(c, 4, fill)).map_err(err),
            1 => area.draw(&Rectangle::new([(c.0 - 4, c.1 - 4), (c.0 + 4, c.1 + 4)], fill)).map_err(err),
            _ => area.draw(&TriangleMarker::new(c, 5, fill)).map_err(err),
        }
    }
}

/// What a legend entry shows of its series' style.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sample {
    /// A short line with the marker (line plots).
    Line,
    /// The marker alone (scatter plots).
    Marker,
    /// A filled box (bar charts).
    Bar,
}

/// Legend font size and row height in pixels.
const LEGEND_FONT: i32 = 13;
const LEGEND_ROW: i32 = 20;

/// The legend's layout for `labels` in a figure `width` pixels wide: (columns, height in pixels).
pub fn legend_size(labels: &[&str], width: u32) -> (usize, u32) {
    let widest = labels.iter().map(|l| text_width(l, LEGEND_FONT)).max().unwrap_or(0) + 48;
    let columns = ((width as i32 - 20) / widest.max(1)).clamp(1, labels.len().max(1) as i32) as usize;
    let rows = labels.len().div_ceil(columns) as u32;
    (columns, rows * LEGEND_ROW as u32 + 16)
}

/// Draws the legend of `entries` (style, label) in `area` (as tall as [`legend_size`] says), in
/// columns filled row by row, each sample drawn as `kind`.
pub fn legend_below<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(SeriesStyle, &str)],
    kind: Sample,
) -> Result<(), String> {
    let labels: Vec<&str> = entries.iter().map(|e| e.1).collect();
    let (columns, _) = legend_size(&labels, area.dim_in_pixel().0);
    let column_width = (area.dim_in_pixel().0 as i32 - 20) / columns as i32;
    let font = TextStyle::from((FONT, LEGEND_FONT).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (k, (style, label)) in entries.iter().enumerate() {
        let x = 10 + (k % columns) as i32 * column_width;
        let y = 8 + (k / columns) as i32 * LEGEND_ROW + LEGEND_ROW / 2;
        style.sample(area, x, y, kind)?;
        area.draw(&Text::new(label.to_string(), (x + 34, y), font.clone())).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_two_of_thirty_series_share_colour_and_style() {
        let styles: Vec<SeriesStyle> = (0..30).map(SeriesStyle::of).collect();
        for (i, a) in styles.iter().enumerate() {
            assert!(styles[i + 1..].iter().all(|b| a != b), "series {i} repeats");
        }
    }

    #[test]
    fn the_legend_takes_as_many_columns_as_its_longest_label_allows_and_a_row_per_line() {
        let (columns, height) = legend_size(&["a", "b", "c"], 960);
        assert_eq!((columns, height), (3, LEGEND_ROW as u32 + 16));
        let long = "predictive-sync-velocity-damping0.9-periodic27-2s-gpipe-4m-1gbe";
        let (columns, height) = legend_size(&[long; 11], 960);
        assert_eq!(columns, 1, "a long label gets the width it needs");
        assert_eq!(height, 11 * LEGEND_ROW as u32 + 16);
    }
}
