//! `--set key.path=value`: manifest settings changed from the command line.
//!
//! An override is applied to the manifest's TOML before it is read, so it goes through the same
//! checks as the file (an unknown key is rejected) and is recorded in each run's resolved
//! `manifest.toml`.
//!
//! Paths: dot-separated keys through tables (`train.epochs`, `data.vocab.max_size`). In an array
//! of tables (`[[models]]`, `[[strategies]]`), the next segment picks an entry by its 0-based
//! index (`models.0.hidden`) or by its `name` (`models.cnn.train.learning_rate`). Values are TOML
//! (`3`, `0.5`, `true`, `[1, 2]`, `"text"`); anything that is not valid TOML is taken as a string
//! (`experiment.backend=ndarray`).

use std::fmt;
use std::str::FromStr;

use toml::{Table, Value};

/// One `key.path=value` setting.
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    /// The path's segments, e.g. `["models", "cnn", "train", "epochs"]`.
    pub path: Vec<String>,
    pub value: Value,
    /// As the user wrote it, for messages.
    pub text: String,
}

/// A `--set` that is not `key.path=value`; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadOverride(String);

impl FromStr for Override {
    type Err = BadOverride;

    fn from_str(s: &str) -> Result<Self, BadOverride> {
        let (key, value) = s
            .split_once('=')
            .ok_or_else(|| BadOverride(format!("`{s}`: expected key.path=value, e.g. train.epochs=3")))?;
        let path: Vec<String> = key.trim().split('.').map(|p| p.trim().to_string()).collect();
        if path.iter().any(String::is_empty) {
            return Err(BadOverride(format!("`{s}`: empty key segment in `{key}`")));
        }
        Ok(Self { path, value: parse_value(value.trim()), text: s.to_string() })
    }
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--set {}", self.text)
    }
}

/// A TOML value, or the text itself as a string when it is not one.
fn parse_value(text: &str) -> Value {
    toml::from_str::<Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| Value::String(text.to_string()))
}

/// Applies `overrides`, in order, to the manifest text `text`; returns the new TOML text
/// (comments are not kept) or an error naming the override that does not fit.
pub(crate) fn apply_overrides(text: &str, overrides: &[Override]) -> Result<String, String> {
    if overrides.is_empty() {
        return Ok(text.to_string());
    }
    applied(text, overrides).map(|(text, _)| text)
}

/// [`apply_overrides`], with the dotted path each override set, as manifest errors name fields
/// (`models.cnn.train.epochs` → `models[0].train.epochs`).
pub(crate) fn applied(text: &str, overrides: &[Override]) -> Result<(String, Vec<String>), String> {
    let mut doc: Table = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
    let paths = overrides
        .iter()
        .map(|o| set(&mut doc, &o.path, o.value.clone()).map_err(|m| format!("{o}: {m}")))
        .collect::<Result<Vec<_>, _>>()?;
    let text = toml::to_string(&doc).map_err(|e| format!("cannot write the manifest back as TOML: {e}"))?;
    Ok((text, paths))
}

/// Sets `path` in `table` to `value`, creating missing tables on the way; returns the dotted
/// path set.
fn set(table: &mut Table, path: &[String], value: Value) -> Result<String, String> {
    let (key, rest) = path.split_first().expect("an override path has at least one segment");
    if rest.is_empty() {
        table.insert(key.clone(), value);
        return Ok(key.clone());
    }
    let slot = table.entry(key.clone()).or_insert_with(|| Value::Table(Table::new()));
    set_in(slot, key, rest, value).map(|below| format!("{key}{below}"))
}

/// Sets `rest` under `slot` (the value at `key`); returns the path below `key` (`.a`, `[0].b`).
fn set_in(slot: &mut Value, key: &str, rest: &[String], value: Value) -> Result<String, String> {
    match slot {
        Value::Table(inner) => set(inner, rest, value).map(|below| format!(".{below}")),
        Value::Array(entries) => {
            let pick = &rest[0];
            let index = match pick.parse::<usize>() {
                Ok(i) if i < entries.len() => i,
                Ok(i) => return Err(format!("`{key}` has {} entries, so there is no entry {i}", entries.len())),
                Err(_) => entries
                    .iter()
                    .position(|e| e.get("name").and_then(Value::as_str) == Some(pick.as_str()))
                    .ok_or_else(|| format!("no `{key}` entry is named `{pick}` (use its name or 0-based index)"))?,
            };
            if rest.len() == 1 {
                entries[index] = value;
                return Ok(format!("[{index}]"));
            }
            let below = set_in(&mut entries[index], &format!("{key}.{pick}"), &rest[1..], value)?;
            Ok(format!("[{index}]{below}"))
        }
        _ => Err(format!("`{key}` is a single value, not a table: it has no `{}`", rest[0])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    use crate::manifest::Manifest;

    const TEXT: &str = "[experiment]\nname = \"x\"\n\n[train]\nepochs = 2\n\n[[models]]\nname = \"cnn\"\narchitecture = \"cnn\"\n\n[[models]]\nname = \"gru\"\narchitecture = \"gru\"\n";

    fn apply(sets: &[&str]) -> Result<Manifest, String> {
        let overrides: Vec<Override> = sets.iter().map(|s| s.parse().unwrap()).collect();
        let text = apply_overrides(TEXT, &overrides)?;
        Manifest::parse(&text, Path::new("x.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn values_are_toml_or_else_strings() {
        let o: Override = "a.b=3".parse().unwrap();
        assert_eq!((o.path, o.value), (vec!["a".to_string(), "b".to_string()], Value::Integer(3)));
        assert_eq!("a=[1, 2]".parse::<Override>().unwrap().value, Value::Array(vec![1.into(), 2.into()]));
        assert_eq!("a=true".parse::<Override>().unwrap().value, Value::Boolean(true));
        assert_eq!("a=ndarray".parse::<Override>().unwrap().value, Value::String("ndarray".into()));
        assert_eq!("a=\"x y\"".parse::<Override>().unwrap().value, Value::String("x y".into()));
        assert!("train.epochs".parse::<Override>().unwrap_err().to_string().contains("key.path=value"));
        assert!("train..epochs=1".parse::<Override>().is_err());
    }

    #[test]
    fn paths_reach_tables_and_entries_by_index_or_name() {
        let m = apply(&["train.epochs=5", "models.gru.train.learning_rate=0.01", "models.0.filters=7"]).unwrap();
        assert_eq!(m.models[0].train.epochs, 5);
        assert_eq!(m.models[1].train.learning_rate, 0.01);
        assert!(m.to_toml().contains("filters = 7"), "{}", m.to_toml());
        let m = apply(&["experiment.backend=ndarray", "data.vocab.max_size=100", "experiment.seeds=[1, 2]"]).unwrap();
        assert_eq!((m.experiment.backend.name(), m.data.vocab.max_size), ("ndarray", 100));
        assert_eq!(m.experiment.seeds, [1, 2]);
    }

    #[test]
    fn an_override_that_does_not_fit_is_named() {
        assert!(apply(&["models.lstm.hidden=3"]).unwrap_err().contains("--set models.lstm.hidden=3"));
        assert!(apply(&["models.5.hidden=3"]).unwrap_err().contains("no entry 5"));
        assert!(apply(&["train.epochs.x=3"]).unwrap_err().contains("single value"));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.toml");
        std::fs::write(&path, TEXT).unwrap();
        let sets: Vec<Override> = ["train.epochs=4", "train.epocs=3"].iter().map(|s| s.parse().unwrap()).collect();
        let err = Manifest::load_with(&path, &sets).unwrap_err().to_string();
        assert!(err.contains("--set train.epocs=3") && err.contains("epocs") && !err.contains("epochs=4"), "{err}");
        assert_eq!(Manifest::load_with(&path, &sets[..1]).unwrap().models[1].train.epochs, 4);
    }
}
