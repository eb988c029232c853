//! Where a field of a manifest is written: dotted paths such as
//! `strategies[1].model_parallel.micro_batches` mapped to their line in the TOML text.

use std::ops::Range;

use toml_edit::{ImDocument, Item, Table, TableLike, Value};

/// A manifest's text with the position of every key and value.
pub(super) struct Spans<'a> {
    text: &'a str,
    doc: ImDocument<&'a str>,
}

/// One step down a dotted path: a key, or an index into an array.
enum Step<'p> {
    Key(&'p str),
    Index(usize),
}

/// A place in the document: a table, an item or a value inside an array.
#[derive(Clone, Copy)]
enum Node<'a> {
    Item(&'a Item),
    Table(&'a Table),
    Value(&'a Value),
}

impl<'a> Node<'a> {
    fn table_like(self) -> Option<&'a dyn TableLike> {
        match self {
            Self::Item(item) => item.as_table_like(),
            Self::Table(table) => Some(table),
            Self::Value(value) => value.as_inline_table().map(|t| t as &dyn TableLike),
        }
    }

    /// The child and where it is written (its key, for a table entry).
    fn child(self, step: &Step) -> Option<(Node<'a>, Option<Range<usize>>)> {
        match *step {
            Step::Key(key) => {
                let (key, item) = self.table_like()?.get_key_value(key)?;
                Some((Node::Item(item), key.span().or_else(|| item.span())))
            }
            Step::Index(i) => match self {
                Self::Item(Item::ArrayOfTables(tables)) => tables.get(i).map(|t| (Node::Table(t), t.span())),
                Self::Item(Item::Value(Value::Array(values))) | Self::Value(Value::Array(values)) => {
                    values.get(i).map(|v| (Node::Value(v), v.span()))
                }
                _ => None,
            },
        }
    }

    /// Children with the path step that leads to them and where they are written.
    fn children(self) -> Vec<(String, Node<'a>, Option<Range<usize>>)> {
        if let Some(table) = self.table_like() {
            return table
                .iter()
                .filter_map(|(key, _)| {
                    let (child, span) = self.child(&Step::Key(key))?;
                    Some((format!(".{key}"), child, span))
                })
                .collect();
        }
        let len = match self {
            Self::Item(Item::ArrayOfTables(tables)) => tables.len(),
            Self::Item(Item::Value(Value::Array(values))) | Self::Value(Value::Array(values)) => values.len(),
            _ => 0,
        };
        (0..len)
            .filter_map(|i| self.child(&Step::Index(i)).map(|(child, span)| (format!("[{i}]"), child, span)))
            .collect()
    }

    /// Where the node itself is written (a value, or a table's header).
    fn span(self) -> Option<Range<usize>> {
        match self {
            Self::Item(item) => item.span(),
            Self::Table(table) => table.span(),
            Self::Value(value) => value.span(),
        }
    }

    fn float(self) -> Option<f64> {
        match self {
            Self::Item(Item::Value(Value::Float(f))) | Self::Value(Value::Float(f)) => Some(*f.value()),
            _ => None,
        }
    }
}

impl<'a> Spans<'a> {
    /// Parses `text`; the error is the TOML parser's, with its line and column.
    pub(super) fn parse(text: &'a str) -> Result<Self, String> {
        let doc = ImDocument::parse(text).map_err(|e| e.to_string().trim_end().to_string())?;
        Ok(Self { text, doc })
    }

    /// Whether the document writes `path` (a key or an array element).
    pub(super) fn contains(&self, path: &str) -> bool {
        self.walk(path).1 == steps(path).len()
    }

    /// The 1-based line of `path`, or of the nearest enclosing entry the document writes (a
    /// field left at its default is reported at its table); `None` when not even the section is.
    pub(super) fn line(&self, path: &str) -> Option<usize> {
        self.walk(path).0.map(|span| self.line_at(span.start))
    }

    /// The longest start of `path` the document writes.
    pub(super) fn written_prefix(&self, path: &str) -> String {
        let mut prefix = path;
        while !prefix.is_empty() && !self.contains(prefix) {
            prefix = &prefix[..prefix.rfind(['.', '[']).unwrap_or(0)];
        }
        prefix.to_string()
    }

    /// The path of the first key named `name`, or string value equal to it, at or under `under`.
    pub(super) fn find(&self, under: &str, name: &str) -> Option<String> {
        fn visit(node: Node, path: &str, name: &str) -> Option<String> {
            node.children().into_iter().find_map(|(step, child, _)| {
                let path = format!("{path}{step}");
                let is_string = matches!(child, Node::Item(Item::Value(Value::String(s))) | Node::Value(Value::String(s)) if s.value() == name);
                if step == format!(".{name}") || is_string {
                    Some(path)
                } else {
                    visit(child, &path, name)
                }
            })
        }
        let node = self.node(under)?;
        visit(node, under, name).map(|p| p.trim_start_matches('.').to_string())
    }

    /// The first float that is NaN or infinite, as its path and value.
    pub(super) fn first_non_finite_float(&self) -> Option<(String, f64)> {
        fn visit(node: Node, path: &str) -> Option<(String, f64)> {
            if let Some(v) = node.float().filter(|v| !v.is_finite()) {
                return Some((path.trim_start_matches('.').to_string(), v));
            }
            node.children().into_iter().find_map(|(step, child, _)| visit(child, &format!("{path}{step}")))
        }
        visit(Node::Item(self.doc.as_item()), "")
    }

    /// The path of the deepest key or value written across byte `offset` (where a parser's error
    /// points).
    pub(super) fn path_at(&self, offset: usize) -> Option<String> {
        fn visit(node: Node, path: &str, offset: usize) -> Option<String> {
            node.children().into_iter().find_map(|(step, child, key)| {
                let path = format!("{path}{step}");
                let holds = |span: Option<Range<usize>>| span.is_some_and(|s| s.contains(&offset));
                visit(child, &path, offset).or_else(|| (holds(key) || holds(child.span())).then_some(path))
            })
        }
        visit(Node::Item(self.doc.as_item()), "", offset).map(|p| p.trim_start_matches('.').to_string())
    }

    /// The node at `path`, if the document writes it.
    fn node(&self, path: &str) -> Option<Node<'_>> {
        steps(path).iter().try_fold(Node::Item(self.doc.as_item()), |node, step| node.child(step).map(|(c, _)| c))
    }

    /// The span of the deepest step of `path` the document writes, and how many steps matched.
    fn walk(&self, path: &str) -> (Option<Range<usize>>, usize) {
        let mut node = Node::Item(self.doc.as_item());
        let (mut span, mut matched) = (None, 0);
        for step in steps(path) {
            match node.child(&step) {
                Some((child, child_span)) => {
                    node = child;
                    span = child_span.or(span);
                    matched += 1;
                }
                None => break,
            }
        }
        (span, matched)
    }

    fn line_at(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())].matches('\n').count() + 1
    }
}

/// `a.b[2].c` → `a`, `b`, `[2]`, `c`.
fn steps(path: &str) -> Vec<Step<'_>> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (key, indices) = part.split_once('[').map_or((part, ""), |(k, rest)| (k, rest));
        if !key.is_empty() {
            steps.push(Step::Key(key));
        }
        for index in indices.split('[') {
            if let Ok(i) = index.trim_end_matches(']').parse() {
                steps.push(Step::Index(i));
            }
        }
    }
    steps
}
