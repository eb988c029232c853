//! The manifest's schema, as JSON Schema (for editors) and as the Markdown key reference of
//! `docs/guide/manifest-reference.md`: every key with its type, default, allowed values and
//! meaning, all taken from the configuration types and their doc comments.

use std::collections::HashMap;

use serde_json::{Map, Value};

use schemars::JsonSchema;
use tandem_models::ModelConfig;
use tandem_train::TrainConfig;

use super::{ClusterSection, DataSection, ExperimentSection, StrategyConfig};

/// A manifest file as written (the resolved manifest merges `[train]` into each model).
#[derive(JsonSchema)]
#[schemars(deny_unknown_fields, title = "Tandem experiment manifest")]
#[allow(dead_code)] // read through its schema only
struct ManifestFile {
    experiment: ExperimentSection,
    #[schemars(default)]
    data: DataSection,
    /// Training settings of every model; a model's `train = { … }` overrides some of them.
    #[schemars(default)]
    train: TrainConfig,
    /// The one strategy every model is trained with (or list several as `[[strategies]]`).
    strategy: Option<StrategyConfig>,
    /// Every model is trained with each of these strategies (default: one sequential).
    strategies: Option<Vec<StrategyConfig>>,
    /// The models, each trained with each strategy and seed.
    models: Vec<ModelFileEntry>,
    #[schemars(default)]
    cluster: ClusterSection,
    /// How `tandem report` judges the experiment; kept as `report.toml` beside its run folders.
    #[schemars(default)]
    report: tandem_results::ReportSettings,
}

/// One `[[models]]` entry: a name, an architecture with its keys, and `[train]` overrides.
#[derive(JsonSchema)]
#[allow(dead_code)] // read through its schema only
struct ModelFileEntry {
    /// Names the runs (`<name>-<strategy>-seed<seed>`).
    name: String,
    #[schemars(flatten)]
    config: ModelConfig,
    /// `[train]` keys overridden for this model only, e.g. `train = { learning_rate = 1e-3 }`.
    train: Option<TrainConfig>,
}

/// The manifest's JSON Schema.
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(ManifestFile)).expect("a schema is JSON")
}

/// The key reference in Markdown, from [`json_schema`].
pub fn markdown() -> String {
    let schema = json_schema();
    let root = Node { schema: &schema, defs: schema.get("$defs").and_then(Value::as_object) };
    let mut writer = Writer {
        out: String::from(
            "# Manifest reference\n\n\
             Every key an experiment manifest accepts, with its type, default, allowed values and meaning. \
             Generated from the configuration types by `tandem manifest reference` (a test keeps this \
             file in sync); `tandem manifest schema` prints the same as JSON Schema, for editors. \
             Unknown keys are errors. [manifests.md](manifests.md) shows how the sections fit together.\n",
        ),
        seen: HashMap::new(),
    };
    let order = ["experiment", "data", "train", "models", "strategy", "strategies", "cluster", "report"];
    let mut sections = root.properties();
    sections.sort_by_key(|(key, _)| order.iter().position(|k| k == key).unwrap_or(order.len()));
    for (key, property) in sections {
        let (heading, path) = match key.as_str() {
            "models" => ("[[models]]".to_string(), "[[models]]".to_string()),
            "strategy" | "strategies" => ("[strategy] / [[strategies]]".to_string(), "[strategy]".to_string()),
            other => (format!("[{other}]"), format!("[{other}]")),
        };
        writer.section(&heading, &path, root, property, 2);
    }
    writer.out
}

/// Every strategy kind a manifest accepts, with its meaning: `kind = "…"` and the variant's doc
/// comment, from the schema (`tandem list` prints them).
pub fn strategy_kinds() -> Vec<(String, String)> {
    let schema = serde_json::to_value(schemars::schema_for!(StrategyConfig)).expect("a schema is JSON");
    let root = Node { schema: &schema, defs: schema.get("$defs").and_then(Value::as_object) };
    root.variants()
        .into_iter()
        .map(|(tag, variant)| {
            let kind = tag.split('"').nth(1).unwrap_or(&tag).to_string();
            (kind, variant.description().unwrap_or_default())
        })
        .collect()
}

/// The pipeline schedules `schedule = "…"` accepts.
pub fn schedules() -> Vec<&'static str> {
    tandem_parallel::schedule::SCHEDULES.iter().map(|s| s.name()).collect()
}

/// Writes sections depth first; a definition met twice is written once and linked after.
struct Writer {
    out: String,
    /// Definition name → the heading it was written under.
    seen: HashMap<String, String>,
}

impl Writer {
    /// Writes the section of `property` (a table, or a table with variants) under `heading`;
    /// `path` names the TOML table its keys are in. Returns the heading the keys are found
    /// under (an earlier one for a definition or table already written).
    fn section(&mut self, heading: &str, path: &str, parent: Node, property: &Value, level: usize) -> String {
        let name = definition_name(property).unwrap_or_else(|| heading.to_string());
        if let Some(written) = self.seen.get(&name) {
            return written.clone();
        }
        self.seen.insert(name, heading.to_string());
        let node = Node { schema: parent.resolve(property), defs: parent.defs };
        self.out += &format!("\n{} {heading}\n\n", "#".repeat(level.min(4)));
        if let Some(text) = node.description() {
            self.out += &format!("{text}\n\n");
        }
        if !node.properties().is_empty() {
            self.table(path, node, level);
        }
        for (tag, variant) in node.variants() {
            self.section(&format!("{path} · {tag}"), path, node, variant.schema, level + 1);
        }
        heading.to_string()
    }

    /// The rows of an object's keys (in TOML table `path`), then the sections of the tables
    /// nested in it.
    fn table(&mut self, path: &str, node: Node, level: usize) {
        let mut rows = String::from("| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n");
        let mut nested: Vec<(String, String, &Value)> = Vec::new();
        for (key, property) in node.properties() {
            let own = Node { schema: property, defs: node.defs };
            let target = Node { schema: node.resolve(property), defs: node.defs };
            let (kind, allowed) = type_and_allowed(property, target);
            let is_table = target.schema.get("properties").is_some() || !target.variants().is_empty();
            let table_form = target
                .schema
                .get("anyOf")
                .and_then(Value::as_array)
                .and_then(|any| any.iter().find(|s| node.resolve(s).get("properties").is_some()));
            let mut meaning = match property.get("const").and_then(Value::as_str) {
                Some(value) => format!("`{key} = \"{value}\"` selects the keys of this table."),
                None => own.description().or_else(|| target.description()).unwrap_or_default(),
            };
            let choices = target.choices();
            if !is_table && choices.iter().any(|(_, meaning)| meaning.is_some()) {
                let listed: Vec<String> = choices
                    .iter()
                    .map(|(v, m)| match m {
                        Some(m) => format!("`{v}`: {}", m.trim_end_matches('.')),
                        None => format!("`{v}`"),
                    })
                    .collect();
                meaning += &format!(" {}.", listed.join("; "));
            }
            if is_table {
                nested.push((key.clone(), format!("{path} {key}"), property));
            } else if let Some(table) = table_form {
                nested.push((key.clone(), format!("{path} {key} as a table"), table));
            }
            let default = property.get("default").map(toml_literal).unwrap_or_else(|| {
                if node.required(&key) {
                    "required".into()
                } else {
                    "unset".into()
                }
            });
            rows += &format!("| `{key}` | {kind} | {default} | {allowed} | {} |\n", cell(&meaning));
        }
        let at = self.out.len();
        self.out += &rows;
        // Nested sections come after the table; each row then links to where its keys are.
        let mut links = Vec::new();
        for (key, sub, property) in nested {
            let written = self.section(&sub, &sub, node, property, level + 1);
            links.push((key, written));
        }
        let mut table = self.out[at..at + rows.len()].to_string();
        for (key, written) in links {
            let row_start = format!("| `{key}` |");
            if let Some(start) = table.find(&row_start) {
                let end = start + table[start..].find(" |\n").expect("a row ends");
                table.insert_str(end, &format!(" Keys: [{written}](#{}).", anchor(&written)));
            }
        }
        self.out.replace_range(at..at + rows.len(), &table);
    }
}

/// The definition a property refers to (directly, in an `Option` or as array items).
fn definition_name(property: &Value) -> Option<String> {
    let reference = property
        .get("$ref")
        .or_else(|| property.get("items").and_then(|i| i.get("$ref")))
        .or_else(|| property.get("anyOf")?.as_array()?.iter().find_map(|s| s.get("$ref")))?;
    Some(reference.as_str()?.trim_start_matches("#/$defs/").to_string())
}

/// The keys, as dotted paths, whose meaning is documented nowhere (the reference test lists them).
pub fn undocumented_keys() -> Vec<String> {
    let schema = json_schema();
    let root = Node { schema: &schema, defs: schema.get("$defs").and_then(Value::as_object) };
    let mut missing = Vec::new();
    root.collect_undocumented("", &mut missing, 0);
    missing.sort();
    missing.dedup();
    missing
}

/// A schema node, with the definitions its references point to.
#[derive(Clone, Copy)]
struct Node<'a> {
    schema: &'a Value,
    defs: Option<&'a Map<String, Value>>,
}

impl<'a> Node<'a> {
    /// The schema behind a `$ref`, an `Option` (`anyOf` with null) or an array's items.
    fn resolve(&self, schema: &'a Value) -> &'a Value {
        if let Some(name) = schema.get("$ref").and_then(Value::as_str) {
            let name = name.trim_start_matches("#/$defs/");
            return self.resolve(&self.defs.expect("references come with definitions")[name]);
        }
        if let Some(items) = schema.get("items") {
            return self.resolve(items);
        }
        if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
            let not_null: Vec<&Value> = any.iter().filter(|s| s.get("type") != Some(&"null".into())).collect();
            if let [one] = not_null[..] {
                return self.resolve(one);
            }
        }
        schema
    }

    fn description(&self) -> Option<String> {
        let text = self.schema.get("description")?.as_str()?;
        Some(text.split("\n\n").next().unwrap_or(text).split_whitespace().collect::<Vec<_>>().join(" "))
    }

    /// `(key, schema)` of an object's properties, required keys first.
    fn properties(&self) -> Vec<(String, &'a Value)> {
        let Some(properties) = self.schema.get("properties").and_then(Value::as_object) else {
            return Vec::new();
        };
        let required: Vec<&str> = self
            .schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut keys: Vec<(String, &Value)> = properties.iter().map(|(k, v)| (k.clone(), v)).collect();
        keys.sort_by_key(|(k, _)| (!required.contains(&k.as_str()), k.clone()));
        keys
    }

    /// The variants of a tagged table (`kind = "…"`, `architecture = "…"`), as `tag = "value"`.
    fn variants(&self) -> Vec<(String, Node<'a>)> {
        let Some(one_of) = self.schema.get("oneOf").and_then(Value::as_array) else {
            return Vec::new();
        };
        one_of
            .iter()
            .filter_map(|variant| {
                let (tag, value) = variant.get("properties")?.as_object()?.iter().find_map(|(k, v)| {
                    let value = v.get("const")?.as_str()?;
                    Some((k.clone(), value.to_string()))
                })?;
                Some((format!("{tag} = \"{value}\""), Node { schema: variant, defs: self.defs }))
            })
            .collect()
    }

    /// The string values a key accepts, with their meaning where documented.
    fn choices(&self) -> Vec<(String, Option<String>)> {
        if let Some(values) = self.schema.get("enum").and_then(Value::as_array) {
            return values.iter().filter_map(Value::as_str).map(|v| (v.to_string(), None)).collect();
        }
        let options = self.schema.get("oneOf").or_else(|| self.schema.get("anyOf")).and_then(Value::as_array);
        options
            .into_iter()
            .flatten()
            .flat_map(|option| {
                let node = Node { schema: self.resolve(option), defs: self.defs };
                match node.schema.get("const").and_then(Value::as_str) {
                    Some(value) => vec![(value.to_string(), node.description())],
                    None => node.choices(),
                }
            })
            .collect()
    }

    fn collect_undocumented(&self, path: &str, missing: &mut Vec<String>, depth: usize) {
        if depth > 8 {
            return;
        }
        for (key, property) in self.properties() {
            let target = Node { schema: self.resolve(property), defs: self.defs };
            let own = Node { schema: property, defs: self.defs };
            let tag = property.get("const").is_some();
            let path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
            if !tag && own.description().or_else(|| target.description()).is_none_or(|d| d.is_empty()) {
                missing.push(path.clone());
            }
            target.collect_undocumented(&path, missing, depth + 1);
        }
        for (tag, variant) in self.variants() {
            variant.collect_undocumented(&format!("{path}[{tag}]"), missing, depth + 1);
        }
        if let Some(any) = self.schema.get("anyOf").and_then(Value::as_array) {
            for option in any {
                Node { schema: self.resolve(option), defs: self.defs }.collect_undocumented(path, missing, depth + 1);
            }
        }
    }

    fn required(&self, key: &str) -> bool {
        self.schema.get("required").and_then(Value::as_array).is_some_and(|r| r.iter().any(|k| k == key))
    }
}

/// The type column and the allowed-values column of a key.
fn type_and_allowed(property: &Value, target: Node) -> (String, String) {
    let choices = target.choices();
    let type_names: Vec<&str> = match property.get("type").or_else(|| target.schema.get("type")) {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect(),
        _ => Vec::new(),
    };
    let is_array = type_names.first() == Some(&"array");
    let item = if is_array { property.get("items").map(|i| target_type(i, target)) } else { None };
    let kind = match (item, choices.is_empty()) {
        (Some(item), _) => format!("array of {item}"),
        (None, false) if target.schema.get("anyOf").is_some() => "string or table".into(),
        (None, false) => "string".into(),
        (None, true) if target.schema.get("properties").is_some() || !target.variants().is_empty() => "table".into(),
        (None, true) => type_names.first().copied().unwrap_or("value").to_string(),
    };
    let bounds = if is_array { property.get("items").map(|i| target.resolve(i)) } else { Some(target.schema) };
    let allowed = match bounds.map(range) {
        Some(Some(range)) => range,
        _ if !choices.is_empty() && target.variants().is_empty() => {
            choices.iter().map(|(v, _)| format!("`{v}`")).collect::<Vec<_>>().join(", ")
        }
        _ => String::new(),
    };
    (kind, allowed)
}

fn target_type(items: &Value, node: Node) -> String {
    let resolved = node.resolve(items);
    if resolved.get("properties").is_some() || resolved.get("oneOf").is_some() {
        return "tables".into();
    }
    match resolved.get("type").and_then(Value::as_str) {
        Some("integer") => "integers".into(),
        Some("number") => "numbers".into(),
        Some("string") => "strings".into(),
        Some(other) => other.into(),
        None => "values".into(),
    }
}

/// `≥ 1`, `0 … 1`, from a schema's bounds.
fn range(schema: &Value) -> Option<String> {
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    let shown = |v: f64| if v.fract() == 0.0 { format!("{v:.0}") } else { v.to_string() };
    match (bound("minimum"), bound("exclusiveMinimum"), bound("maximum")) {
        (Some(lo), None, Some(hi)) => Some(format!("{} … {}", shown(lo), shown(hi))),
        (None, Some(lo), Some(hi)) => Some(format!("> {}, ≤ {}", shown(lo), shown(hi))),
        (Some(lo), None, None) => Some(format!("≥ {}", shown(lo))),
        (None, Some(lo), None) => Some(format!("> {}", shown(lo))),
        (None, None, Some(hi)) => Some(format!("≤ {}", shown(hi))),
        _ => None,
    }
}

/// A default as it would be written in TOML.
fn toml_literal(value: &Value) -> String {
    match value {
        Value::Null => "unset".into(),
        Value::Object(_) => "see its keys".into(),
        other => match toml::Value::try_from(other) {
            Ok(v) => format!("`{v}`"),
            Err(_) => format!("`{other}`"),
        },
    }
}

/// Text safe inside a Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The anchor GitHub gives a heading.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}
