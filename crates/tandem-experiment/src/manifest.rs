//! Experiment manifests: TOML files with `[experiment]`, `[data]`, `[train]`, `[strategy]`
//! (or several `[[strategies]]`)
//! and one `[[models]]` entry per model. Unknown keys are rejected; errors name the file,
//! the field and, where the TOML parser knows it, the line.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tandem_data::VocabConfig;
use tandem_models::{InputSpec, ModelConfig};
use tandem_parallel::{DataParallelConfig, ModelParallelConfig};
use tandem_sync::PredictiveSyncConfig;
use tandem_train::TrainConfig;

use crate::backend::{BackendKind, DeviceSpec};

/// A manifest that could not be read or is not valid.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ManifestError {
    pub path: PathBuf,
    pub message: String,
}

/// `[experiment]`: what to call the results, which seeds, where to run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExperimentSection {
    /// Names the results folder `results/<name>/`.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// One run per model per seed (parameter init, shuffling, dropout).
    #[serde(default = "default_seeds")]
    pub seeds: Vec<u64>,
    #[serde(default = "default_backend")]
    pub backend: BackendKind,
    /// Devices as `cpu`, `wgpu:N`, `cuda:N`; the sequential strategy uses the first.
    #[serde(default = "default_devices")]
    pub devices: Vec<String>,
}

fn default_seeds() -> Vec<u64> {
    vec![42]
}
fn default_backend() -> BackendKind {
    BackendKind::Flex
}
fn default_devices() -> Vec<String> {
    vec!["cpu".into()]
}

/// `[cluster]`: a job of several processes ("ranks", on one machine or several), launched by
/// `mpirun -np N tandem run …` or a batch scheduler. Each rank runs the manifest's devices and
/// replicas; the job's size comes from the launcher.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// The job must have exactly this many ranks (unset: any number, 1 included).
    pub ranks: Option<usize>,
}

/// `[data]`: where AG News is and how it is split, tokenized and truncated.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DataSection {
    /// Directory with `test.csv` (and `train.csv` for the full dataset). Relative paths are
    /// relative to the manifest's directory. Default: `$TANDEM_DATA_DIR`, else `datasets/ag_news`.
    pub dir: Option<PathBuf>,
    /// Holdout share when only the test split is present (stratified re-split).
    pub holdout_fraction: f64,
    /// Seed of the train/holdout re-split (kept fixed across training seeds).
    pub split_seed: u64,
    /// Tokens per sample: longer texts are truncated, shorter padded.
    pub max_len: usize,
    pub vocab: VocabConfig,
    /// Use at most this many training / holdout rows (stratified), e.g. for smoke tests.
    pub max_train_rows: Option<usize>,
    pub max_holdout_rows: Option<usize>,
    /// Check the published md5 of the full dataset's files.
    pub verify_md5: bool,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            dir: None,
            holdout_fraction: 0.2,
            split_seed: 42,
            max_len: 64,
            vocab: VocabConfig::default(),
            max_train_rows: None,
            max_holdout_rows: None,
            verify_md5: true,
        }
    }
}

/// `[strategy]` (or one `[[strategies]]` entry): how training is spread over devices.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum StrategyConfig {
    /// One model on one device.
    Sequential(SequentialConfig),
    /// Replicas on several devices, gradients averaged by all-reduce.
    DataParallel(DataParallelConfig),
    /// The model cut into stages on several devices, run by a pipeline schedule.
    ModelParallel(ModelParallelConfig),
    /// Model parallelism whose stages skip most exchanges, predicting their parameters instead.
    PredictiveSync(PredictiveSyncConfig),
}

impl Default for StrategyConfig {
    fn default() -> Self {
        Self::Sequential(SequentialConfig::default())
    }
}

/// `kind = "sequential"`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct SequentialConfig {
    /// Compute threads, overriding `[train] threads` (e.g. the baseline on all cores).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
}

impl StrategyConfig {
    /// Name recorded in results.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sequential(_) => "sequential",
            Self::DataParallel(_) => "data-parallel",
            Self::ModelParallel(_) => "model-parallel",
            Self::PredictiveSync(_) => "predictive-sync",
        }
    }

    /// Names the run folder: the kind plus what tells two entries of one kind apart.
    pub fn label(&self) -> String {
        match self {
            Self::Sequential(SequentialConfig { threads: None }) => "sequential".into(),
            Self::Sequential(SequentialConfig { threads: Some(t) }) => format!("sequential-{t}t"),
            Self::DataParallel(c) => c.label(),
            Self::ModelParallel(c) => c.label(),
            Self::PredictiveSync(c) => c.label(),
        }
    }

    /// Compute threads per device for a model trained with `train`.
    pub fn threads(&self, train: &TrainConfig) -> usize {
        match self {
            Self::Sequential(SequentialConfig { threads: Some(t) }) => *t,
            _ => train.threads,
        }
    }

    /// The stages of a strategy that cuts the model into stages (model parallel, predictive sync).
    pub fn stages(&self) -> Option<usize> {
        match self {
            Self::ModelParallel(c) => Some(c.stages),
            Self::PredictiveSync(c) => Some(c.model_parallel.stages),
            _ => None,
        }
    }

    /// Number of devices the strategy computes on.
    pub fn num_devices(&self) -> usize {
        match self {
            Self::Sequential(_) => 1,
            Self::DataParallel(c) => c.replicas,
            Self::ModelParallel(c) => c.stages,
            Self::PredictiveSync(c) => c.model_parallel.stages,
        }
    }

    fn validate(&self) -> Result<(), String> {
        match self {
            Self::Sequential(SequentialConfig { threads: Some(0) }) => Err("threads: must be at least 1".into()),
            Self::Sequential(_) => Ok(()),
            Self::DataParallel(c) => c.validate(),
            Self::ModelParallel(c) => c.validate(),
            Self::PredictiveSync(c) => c.validate(),
        }
    }
}

/// One `[[models]]` entry, with its training settings resolved.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ModelEntry {
    /// Names the run (`<name>-<strategy>-seed<seed>`).
    pub name: String,
    #[serde(flatten)]
    pub config: ModelConfig,
    /// `[train]` with this entry's `train = { … }` overrides applied.
    pub train: TrainConfig,
}

/// A parsed and validated manifest.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Manifest {
    pub experiment: ExperimentSection,
    pub data: DataSection,
    /// Every model is trained with each of these strategies.
    pub strategies: Vec<StrategyConfig>,
    pub models: Vec<ModelEntry>,
    #[serde(default)]
    pub cluster: ClusterSection,
    /// Where the manifest was read from (relative data paths resolve against it).
    #[serde(skip)]
    pub source: PathBuf,
}

/// The first parsing pass: every section but the model entries, with line-numbered errors.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    experiment: ExperimentSection,
    #[serde(default)]
    data: DataSection,
    #[serde(default)]
    train: TrainConfig,
    strategy: Option<StrategyConfig>,
    strategies: Option<Vec<StrategyConfig>>,
    models: Vec<toml::Table>,
    #[serde(default)]
    cluster: ClusterSection,
}

impl Manifest {
    /// Reads and validates a manifest file.
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|e| ManifestError {
            path: path.to_path_buf(),
            message: format!("cannot read the manifest: {e}"),
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates manifest text; `path` is used in messages and for relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ManifestError> {
        let err = |message: String| ManifestError { path: path.to_path_buf(), message };
        let raw: RawManifest = toml::from_str(text).map_err(|e| err(e.to_string().trim_end().to_string()))?;
        let doc: toml::Table = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        let global_train = doc.get("train").and_then(|t| t.as_table()).cloned().unwrap_or_default();
        let models = raw
            .models
            .into_iter()
            .enumerate()
            .map(|(i, table)| model_entry(table, &global_train).map_err(|m| err(format!("models[{i}]{m}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let strategies = match (raw.strategy, raw.strategies) {
            (Some(_), Some(_)) => return Err(err("use either [strategy] or [[strategies]], not both".into())),
            (Some(one), None) => vec![one],
            (None, Some(list)) => list,
            (None, None) => vec![StrategyConfig::default()],
        };
        let manifest = Manifest {
            experiment: raw.experiment,
            data: raw.data,
            strategies,
            models,
            cluster: raw.cluster,
            source: path.to_path_buf(),
        };
        raw.train.validate().map_err(|m| err(format!("[train]: {m}")))?;
        manifest.validate().map_err(err)?;
        Ok(manifest)
    }

    fn validate(&self) -> Result<(), String> {
        let e = &self.experiment;
        if e.name.is_empty() || !e.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(format!(
                "[experiment] name: `{}` must be non-empty and use only letters, digits, `-`, `_`, `.`",
                e.name
            ));
        }
        if e.seeds.is_empty() {
            return Err("[experiment] seeds: list at least one seed".into());
        }
        if e.devices.is_empty() {
            return Err("[experiment] devices: list at least one device".into());
        }
        for d in &e.devices {
            let spec: DeviceSpec = d.parse().map_err(|m| format!("[experiment] devices: {m}"))?;
            spec.check_backend(e.backend).map_err(|m| format!("[experiment] devices: {m}"))?;
        }
        let d = &self.data;
        if !(d.holdout_fraction > 0.0 && d.holdout_fraction < 1.0) {
            return Err(format!("[data] holdout_fraction: must be in (0, 1), got {}", d.holdout_fraction));
        }
        if d.max_len == 0 {
            return Err("[data] max_len: must be at least 1".into());
        }
        if d.vocab.max_size < 3 {
            return Err("[data] vocab.max_size: must be at least 3 (<pad>, <unk> and one word)".into());
        }
        if self.strategies.is_empty() {
            return Err("[[strategies]]: list at least one strategy".into());
        }
        for (i, strategy) in self.strategies.iter().enumerate() {
            strategy.validate().map_err(|m| format!("strategies[{i}] ({}): {m}", strategy.name()))?;
            if self.strategies[..i].iter().any(|o| o.label() == strategy.label()) {
                return Err(format!("strategies[{i}]: `{}` is listed twice", strategy.label()));
            }
        }
        if self.cluster.ranks == Some(0) {
            return Err("[cluster] ranks: must be at least 1".into());
        }
        if self.models.is_empty() {
            return Err("[[models]]: list at least one model".into());
        }
        let input =
            InputSpec { vocab_size: d.vocab.max_size, max_len: d.max_len, num_classes: tandem_data::NUM_CLASSES };
        for (i, m) in self.models.iter().enumerate() {
            if self.models[..i].iter().any(|o| o.name == m.name) {
                return Err(format!("models[{i}] name: `{}` is used twice", m.name));
            }
            m.config.validate(&input).map_err(|msg| format!("models[{i}] (`{}`): {msg}", m.name))?;
            m.train.validate().map_err(|msg| format!("models[{i}] (`{}`) train: {msg}", m.name))?;
        }
        Ok(())
    }

    /// The data directory: `[data] dir` (relative to the manifest), else `$TANDEM_DATA_DIR`, else the default.
    pub fn data_dir(&self) -> PathBuf {
        let from_manifest = self.data.dir.as_ref().map(|d| {
            if d.is_absolute() {
                d.clone()
            } else {
                self.source.parent().unwrap_or(Path::new(".")).join(d)
            }
        });
        tandem_data::resolve_data_dir(from_manifest.as_deref())
    }

    /// This manifest narrowed to one model, strategy and seed, as recorded in a run's folder.
    pub fn for_run(&self, model: &ModelEntry, strategy: &StrategyConfig, seed: u64) -> Manifest {
        let mut m = self.clone();
        let dir = self.data_dir();
        m.data.dir = Some(std::path::absolute(&dir).unwrap_or(dir));
        m.models = vec![model.clone()];
        m.strategies = vec![strategy.clone()];
        m.experiment.seeds = vec![seed];
        m
    }

    /// TOML text of the manifest.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# could not serialize the manifest: {e}\n"))
    }
}

/// Builds one model entry from its raw table: `name`, an optional `train` override table,
/// and the architecture's fields. The error starts with the entry's name where known.
fn model_entry(mut table: toml::Table, global_train: &toml::Table) -> Result<ModelEntry, String> {
    let name = match table.remove("name") {
        Some(toml::Value::String(s)) if !s.is_empty() => s,
        Some(_) => return Err(" name: must be a non-empty string".into()),
        None => return Err(": missing field `name`".into()),
    };
    let mut train = global_train.clone();
    match table.remove("train") {
        Some(toml::Value::Table(overrides)) => train.extend(overrides),
        Some(_) => return Err(format!(" (`{name}`) train: must be a table of [train] overrides")),
        None => {}
    }
    let train: TrainConfig =
        toml::Value::Table(train).try_into().map_err(|e| format!(" (`{name}`) train: {}", one_line(e)))?;
    let config: ModelConfig =
        toml::Value::Table(table).try_into().map_err(|e| format!(" (`{name}`): {}", one_line(e)))?;
    Ok(ModelEntry { name, config, train })
}

fn one_line(e: toml::de::Error) -> String {
    e.to_string().lines().filter(|l| !l.trim().is_empty()).collect::<Vec<_>>().join(" ")
}
