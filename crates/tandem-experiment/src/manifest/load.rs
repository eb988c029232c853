//! A manifest file read with `--set` overrides applied, its errors naming the override or the
//! file's line they come from.

use std::path::Path;

use super::{Manifest, ManifestError, Origin};
use crate::overrides::{applied, apply_overrides, Override};

impl Manifest {
    /// Reads a manifest file with `overrides` applied (see [`apply_overrides`](crate::overrides::apply_overrides)). An error at a
    /// field an override sets names that `--set` (the rewritten document's lines are no line of
    /// the file); one elsewhere gives its line in the file, and, when the file is valid on its
    /// own, the overrides that make it fail.
    pub fn load_with(path: &Path, overrides: &[Override]) -> Result<Self, ManifestError> {
        if overrides.is_empty() {
            return Self::load(path);
        }
        let err = |message: String| ManifestError { path: path.to_path_buf(), message };
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read the manifest: {e}")))?;
        let (changed, paths) = applied(&text, overrides).map_err(err)?;
        let set: Vec<(String, Override)> = paths.into_iter().zip(overrides.iter().cloned()).collect();
        let origin = Origin::new(&text, &set).map_err(err)?;
        let failure = match Self::parse_from(&changed, path, Some(&origin)) {
            Ok(manifest) => return Ok(Self { overrides: set, ..manifest }),
            Err(failure) => failure,
        };
        if failure.at_override || Self::parse(&text, path).is_err() {
            return Err(failure.error);
        }
        let culprits: Vec<String> = overrides
            .iter()
            .filter(|o| {
                apply_overrides(&text, std::slice::from_ref(o)).is_ok_and(|alone| Self::parse(&alone, path).is_err())
            })
            .map(ToString::to_string)
            .collect();
        let from = if culprits.is_empty() { "the --set overrides together".to_string() } else { culprits.join(", ") };
        Err(err(format!("{from}: {}", failure.error.message)))
    }

    /// The `--set` overrides of a `[train]` key that some model does not take, because its own
    /// `train = { … }` sets that key: one line each, naming the models and the `--set` that would
    /// reach them.
    pub fn shadowed_overrides(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (_, set) in &self.overrides {
            let [section, key] = set.path.as_slice() else { continue };
            if section != "train" {
                continue;
            }
            let shadowed: Vec<&str> = self
                .models
                .iter()
                .filter(|entry| {
                    let own = toml::Value::try_from(&entry.train).ok();
                    own.as_ref().and_then(|t| t.get(key.as_str())).is_some_and(|value| *value != set.value)
                })
                .map(|entry| entry.name.as_str())
                .collect();
            if let Some(first) = shadowed.first() {
                lines.push(format!(
                    "note: {set} does not reach {} (their own `train` sets `{key}`); \
                     set it per model, e.g. --set models.{first}.train.{key}={}",
                    shadowed.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", "),
                    set.value
                ));
            }
        }
        lines
    }
}
