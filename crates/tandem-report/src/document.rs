//! A report as a list of blocks, rendered to Markdown and to a standalone HTML page (plots inlined),
//! so both always say the same thing. Text is plain: renderers escape it.

/// One piece of a report.
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    Heading(u8, String),
    Paragraph(String),
    List(Vec<String>),
    Table {
        header: Vec<String>,
        rows: Vec<Vec<String>>,
    },
    /// An SVG file next to the report, and the plot's SVG text for the HTML page.
    Figure {
        file: String,
        caption: String,
        svg: String,
    },
    /// Small figures side by side (a grid in HTML, a list of links in Markdown).
    Gallery {
        caption: String,
        figures: Vec<GalleryFigure>,
    },
}

/// One figure of a [`Block::Gallery`]: its SVG file next to the report, title and SVG text.
#[derive(Clone, Debug, PartialEq)]
pub struct GalleryFigure {
    pub file: String,
    pub title: String,
    pub svg: String,
}

/// A titled list of blocks.
#[derive(Clone, Debug, Default)]
pub struct Document {
    pub title: String,
    pub blocks: Vec<Block>,
}

impl Document {
    pub fn push(&mut self, block: Block) {
        self.blocks.push(block);
    }

    /// GitHub-flavoured Markdown; figures link to their SVG files.
    pub fn markdown(&self) -> String {
        let mut out = format!("# {}\n", self.title);
        for block in &self.blocks {
            out.push('\n');
            match block {
                Block::Heading(level, text) => out.push_str(&format!("{} {text}\n", "#".repeat(*level as usize + 1))),
                Block::Paragraph(text) => out.push_str(&format!("{}\n", md_escape(text))),
                Block::List(items) => items.iter().for_each(|i| out.push_str(&format!("- {}\n", md_escape(i)))),
                Block::Table { header, rows } => {
                    let line = |cells: &[String]| {
                        format!(
                            "| {} |\n",
                            cells.iter().map(|c| md_escape(c).replace('|', "\\|")).collect::<Vec<_>>().join(" | ")
                        )
                    };
                    out.push_str(&line(header));
                    let align = numeric_columns(header.len(), rows);
                    out.push_str(&format!(
                        "|{}\n",
                        align.iter().map(|n| if *n { "---:|" } else { "---|" }).collect::<String>()
                    ));
                    rows.iter().for_each(|r| out.push_str(&line(r)));
                }
                Block::Figure { file, caption, .. } => {
                    let name = file.trim_end_matches(".svg");
                    out.push_str(&format!("![{}]({file})\n\n*{}*\n", md_escape(name), md_escape(caption)))
                }
                Block::Gallery { caption, figures } => {
                    out.push_str(&format!("*{}*\n\n", md_escape(caption)));
                    figures.iter().for_each(|f| out.push_str(&format!("- [{}]({})\n", md_escape(&f.title), f.file)));
                }
            }
        }
        out
    }

    /// One self-contained HTML page: no external files, the SVG plots inline.
    pub fn html(&self) -> String {
        let mut out = format!(
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{0}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n<h1>{0}</h1>\n",
            html_escape(&self.title)
        );
        for block in &self.blocks {
            match block {
                Block::Heading(level, text) => {
                    out.push_str(&format!("<h{0}>{1}</h{0}>\n", level + 1, html_escape(text)))
                }
                Block::Paragraph(text) => out.push_str(&format!("<p>{}</p>\n", html_escape(text))),
                Block::List(items) => {
                    out.push_str("<ul>\n");
                    items.iter().for_each(|i| out.push_str(&format!("<li>{}</li>\n", html_escape(i))));
                    out.push_str("</ul>\n");
                }
                Block::Table { header, rows } => {
                    out.push_str("<div class=\"wide\"><table>\n<tr>");
                    header.iter().for_each(|h| out.push_str(&format!("<th>{}</th>", html_escape(h))));
                    out.push_str("</tr>\n");
                    let align = numeric_columns(header.len(), rows);
                    for row in rows {
                        out.push_str("<tr>");
                        for (c, numeric) in row.iter().zip(&align) {
                            out.push_str(&format!(
                                "<td class=\"{}\">{}</td>",
                                if *numeric { "n" } else { "t" },
                                html_escape(c)
                            ));
                        }
                        out.push_str("</tr>\n");
                    }
                    out.push_str("</table></div>\n");
                }
                Block::Figure { caption, svg, .. } => {
                    out.push_str(&format!(
                        "<figure>\n{}\n<figcaption>{}</figcaption>\n</figure>\n",
                        inline_svg(svg),
                        html_escape(caption)
                    ));
                }
                Block::Gallery { caption, figures } => {
                    out.push_str("<figure>\n<div class=\"gallery\">\n");
                    figures.iter().for_each(|f| out.push_str(&format!("{}\n", inline_svg(&f.svg))));
                    out.push_str(&format!("</div>\n<figcaption>{}</figcaption>\n</figure>\n", html_escape(caption)));
                }
            }
        }
        out.push_str("</body>\n</html>\n");
        out
    }
}

/// The `<svg>` element of an SVG file's text (without the XML declaration).
fn inline_svg(svg: &str) -> &str {
    svg.find("<svg").map_or(svg, |i| &svg[i..])
}

const STYLE: &str =
    "body { font-family: sans-serif; max-width: 1300px; margin: 2em auto; padding: 0 1em; color: #222; }
.wide { overflow-x: auto; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
td.n { text-align: right; white-space: nowrap; }
figure { margin: 1.5em 0; } figure svg { max-width: 100%; height: auto; }
.gallery { display: grid; grid-template-columns: repeat(auto-fill, minmax(260px, 1fr)); gap: 0.5em; }
.gallery svg { width: 100%; height: auto; }
figcaption { font-style: italic; color: #555; }
";

/// Which columns hold figures (right-aligned): those whose every cell starts like a number
/// (or is "—" for a missing figure).
fn numeric_columns(columns: usize, rows: &[Vec<String>]) -> Vec<bool> {
    let looks_numeric = |c: &str| c == "—" || c.starts_with(|ch: char| ch.is_ascii_digit() || ch == '-' || ch == '+');
    (0..columns).map(|i| !rows.is_empty() && rows.iter().all(|r| r.get(i).is_some_and(|c| looks_numeric(c)))).collect()
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Escapes the characters that would turn plain text into Markdown markup.
fn md_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '\\' | '*' | '_' | '`' | '[' | ']' | '<' | '>') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_and_html_say_the_same_and_escape_markup() {
        let doc = Document {
            title: "T".into(),
            blocks: vec![
                Block::Heading(1, "Setting".into()),
                Block::Paragraph("a_b <c>".into()),
                Block::Table {
                    header: vec!["model".into(), "x".into()],
                    rows: vec![vec!["cnn|1".into(), "1.0".into()]],
                },
            ],
        };
        let md = doc.markdown();
        assert!(md.contains("## Setting"));
        assert!(md.contains("a\\_b \\<c\\>"));
        assert!(md.contains("| cnn\\|1 | 1.0 |"));
        assert!(md.contains("|---|---:|"), "text columns left, figures right: {md}");
        let html = doc.html();
        assert!(html.contains("<h2>Setting</h2>"));
        assert!(html.contains("<p>a_b &lt;c&gt;</p>"));
        assert!(html.contains("<td class=\"t\">cnn|1</td><td class=\"n\">1.0</td>"));
    }
}
