//! The hyper-parameters of a setting, read from each run's resolved `manifest.toml` (every
//! default filled in): the data keys, the model's keys and its training keys, one column per
//! model, with the keys whose values differ between models or between runs of a model marked.

use std::collections::{BTreeMap, BTreeSet};

use tandem_results::Run;

use crate::aggregate::SettingTable;
use crate::document::{Block, Document};

/// `data.*`, `model.*` and `train.*` keys of a run's resolved manifest and their values (TOML
/// text); `None` without a readable manifest. The data folder is left out: it names a machine's
/// path, not a hyper-parameter.
pub fn run_keys(run: &Run) -> Option<BTreeMap<String, String>> {
    let manifest: toml::Table = run.manifest_text()?.parse().ok()?;
    let mut keys = BTreeMap::new();
    if let Some(toml::Value::Table(data)) = manifest.get("data") {
        data.iter().filter(|(k, _)| *k != "dir").for_each(|(k, v)| flatten(&format!("data.{k}"), v, &mut keys));
    }
    let model = manifest.get("models")?.as_array()?.first()?.as_table()?;
    for (k, v) in model.iter().filter(|(k, _)| *k != "name") {
        let prefix = if k == "train" { "train".to_string() } else { format!("model.{k}") };
        flatten(&prefix, v, &mut keys);
    }
    Some(keys)
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    match value {
        toml::Value::Table(table) => table.iter().for_each(|(k, v)| flatten(&format!("{prefix}.{k}"), v, out)),
        toml::Value::String(s) => {
            out.insert(prefix.to_string(), s.clone());
        }
        // TOML writes 1e-8 as 0.00000001.
        toml::Value::Float(f) if *f != 0.0 && f.abs() < 1e-4 => {
            out.insert(prefix.to_string(), format!("{f:e}"));
        }
        other => {
            out.insert(prefix.to_string(), other.to_string().replace('\n', "").replace(",]", "]"));
        }
    }
}

/// The hyper-parameter table of `table`'s setting (nothing when no run has a manifest).
pub fn section(doc: &mut Document, table: &SettingTable) {
    let models = table.models();
    // Per model, per key, the values its runs have.
    let values: Vec<BTreeMap<String, BTreeSet<String>>> = models
        .iter()
        .map(|model| {
            let mut per_key: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for run in table.groups.iter().filter(|g| g.model == *model).flat_map(|g| &g.runs) {
                for (k, v) in run_keys(run).unwrap_or_default() {
                    per_key.entry(k).or_default().insert(v);
                }
            }
            per_key
        })
        .collect();
    let keys: BTreeSet<&String> = values.iter().flat_map(|v| v.keys()).collect();
    if keys.is_empty() {
        return;
    }
    let rows = keys
        .into_iter()
        .map(|key| {
            let cells: Vec<Option<&BTreeSet<String>>> = values.iter().map(|v| v.get(key)).collect();
            let within = cells.iter().flatten().any(|set| set.len() > 1);
            let across = cells.iter().any(Option::is_none) || cells.windows(2).any(|w| w[0] != w[1]);
            let mut row = vec![key.clone()];
            row.extend(
                cells.iter().map(|c| c.map_or("—".into(), |set| set.iter().cloned().collect::<Vec<_>>().join(" / "))),
            );
            row.push(
                match (within, across) {
                    (true, _) => "between runs",
                    (false, true) => "between models",
                    (false, false) => "",
                }
                .into(),
            );
            row
        })
        .collect();
    doc.push(Block::Heading(2, "Hyper-parameters".into()));
    doc.push(Block::Paragraph(
        "From each run's resolved manifest.toml (every default filled in): the data, model and training keys. Where the runs of a model differ, their values are joined by \" / \"; the last column says which keys differ between runs of a model or between models.".into(),
    ));
    let mut header = vec!["key".to_string()];
    header.extend(models.iter().map(|m| m.to_string()));
    header.push("differs".into());
    doc.push(Block::Table { header, rows });
}
