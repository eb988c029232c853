//! Experiment manifests: TOML files with `[experiment]`, `[data]`, `[train]`, `[strategy]`
//! (or several `[[strategies]]`)
//! and one `[[models]]` entry per model. Unknown keys, non-finite numbers and settings a run
//! would fail on are rejected; errors name the file, the field and its line.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tandem_data::{SplitMode, VocabConfig};
use tandem_models::ModelConfig;
use tandem_results::ReportSettings;
use tandem_train::TrainConfig;

use crate::backend::BackendKind;
use crate::overrides::Override;

mod checks;
mod load;
pub mod reference;
mod spans;
mod strategy;

use checks::Problem;
use spans::Spans;
pub use strategy::{SequentialConfig, StrategyConfig};

/// A manifest that could not be read or is not valid.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ManifestError {
    pub path: PathBuf,
    pub message: String,
}

/// `[experiment]`: what to call the results, which seeds, where to run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExperimentSection {
    /// Names the results folder `results/<name>/`.
    pub name: String,
    /// One line saying what the experiment compares, quoted in reports.
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
/// `mpirun -np N tandem run …` or a batch scheduler, or by `tandem run` itself on one machine
/// (`launch = "local"`). Each rank runs the manifest's devices and replicas.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// The job must have exactly this many ranks (unset: any number, 1 included).
    #[schemars(range(min = 1))]
    pub ranks: Option<usize>,
    /// Who starts the ranks (unset: `external`).
    #[serde(skip_serializing_if = "Launch::is_external")]
    pub launch: Launch,
}

/// Who starts the ranks of a multi-process job.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Launch {
    /// An MPI launcher or a batch scheduler (`mpirun -np N tandem run …`, `srun`); run without
    /// one, `tandem run` is a job of one rank.
    #[default]
    External,
    /// `tandem run` starts `ranks` processes on this machine with `mpirun` (`$TANDEM_MPIRUN` names
    /// another launcher), one rank each, cores unbound; a build with the `mpi` feature.
    Local,
}

impl Launch {
    /// The default: written manifests leave it out, as those of builds before the key did.
    fn is_external(&self) -> bool {
        *self == Self::External
    }
}

/// `[data]`: where AG News is and how it is split, tokenized and truncated.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DataSection {
    /// Directory with `test.csv` (and `train.csv` for the full dataset). Relative paths are
    /// relative to the manifest's directory. Default: `$TANDEM_DATA_DIR`, else `datasets/ag_news`.
    pub dir: Option<PathBuf>,
    /// Which train/holdout split to train and evaluate on.
    pub split: SplitMode,
    /// Holdout share of the re-split.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub holdout_fraction: f64,
    /// Validation share of the training rows, carved class by class with `split_seed` (unset:
    /// no validation set). Choices made by looking at results (the report's selection and
    /// verdict, the best epoch) read validation figures, so holdout figures are reported once.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub validation_fraction: Option<f64>,
    /// Seed of the train/holdout re-split and of the validation carve (kept fixed across
    /// training seeds).
    pub split_seed: u64,
    /// Tokens per sample: longer texts are truncated, shorter padded.
    #[schemars(range(min = 1))]
    pub max_len: usize,
    pub vocab: VocabConfig,
    /// Use at most this many training rows (a stratified, seeded subset), e.g. for smoke tests.
    #[schemars(range(min = 1))]
    pub max_train_rows: Option<usize>,
    /// Use at most this many holdout rows (a stratified, seeded subset).
    #[schemars(range(min = 1))]
    pub max_holdout_rows: Option<usize>,
    /// Check the published md5 of the full dataset's files.
    pub verify_md5: bool,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            dir: None,
            split: SplitMode::Auto,
            holdout_fraction: 0.2,
            validation_fraction: None,
            split_seed: 42,
            max_len: 64,
            vocab: VocabConfig::default(),
            max_train_rows: None,
            max_holdout_rows: None,
            verify_md5: true,
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
    /// `[report]`: kept as `report.toml` beside the experiment's run folders, not in a run's
    /// own manifest (a changed target re-judges runs, it does not rerun them).
    #[serde(default, skip_serializing_if = "ReportSettings::is_empty")]
    pub report: ReportSettings,
    /// Where the manifest was read from (relative data paths resolve against it).
    #[serde(skip)]
    pub source: PathBuf,
    /// The `--set` overrides applied to the file, each with the dotted path it set, so that
    /// [`Manifest::check_paths`] names them too.
    #[serde(skip)]
    pub(crate) overrides: Vec<(String, Override)>,
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
    strategy: Option<toml::Table>,
    strategies: Option<Vec<toml::Table>>,
    models: Vec<toml::Table>,
    #[serde(default)]
    cluster: ClusterSection,
    #[serde(default)]
    report: ReportSettings,
}

impl Manifest {
    /// Reads and validates a manifest file.
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        Self::parse(&read(path)?, path)
    }

    /// Reads and validates a manifest file, and checks what `tandem validate` also checks
    /// outside it: a data directory the manifest names exists (`tandem run` would instead fetch
    /// the dataset into it), and holds `train.csv` where `split = "official"` asks for it.
    pub fn load_and_check_paths(path: &Path) -> Result<Self, ManifestError> {
        let manifest = Self::load(path)?;
        manifest.check_paths()?;
        Ok(manifest)
    }

    /// The checks of [`Manifest::load_and_check_paths`] on a manifest already read; errors
    /// give the line in the manifest file where the key is written there, or the `--set` that
    /// set it.
    pub fn check_paths(&self) -> Result<(), ManifestError> {
        let (manifest, path) = (self, self.source.as_path());
        let dir = manifest.data_dir();
        let shown = std::path::absolute(&dir).unwrap_or(dir.clone()).display().to_string();
        let problem = if manifest.data.dir.is_some() && !dir.is_dir() {
            Some(Problem::new(
                "data.dir",
                format!(
                    "the directory {shown} does not exist (`tandem data fetch --dir {shown}` downloads AG News there)"
                ),
            ))
        } else if manifest.data.split == SplitMode::Official
            && dir.join(tandem_data::TEST_FILE).is_file()
            && !dir.join(tandem_data::TRAIN_FILE).is_file()
        {
            Some(Problem::new(
                "data.split",
                format!(
                    "`official` needs the full dataset, and {shown} has no train.csv (only the test split); \
                     `tandem data fetch --dir {shown}` gets it, `split = \"resplit\"` carves a split from test.csv"
                ),
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            let text = read(path)?;
            let file = Spans::parse(&text).map_err(|message| ManifestError { path: path.into(), message })?;
            let origin = Origin { file, overrides: &self.overrides };
            return Err(located(&origin.file, problem, path, Some(&origin)).error);
        }
        Ok(())
    }

    /// Parses and validates manifest text; `path` is used in messages and for relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ManifestError> {
        Self::parse_from(text, path, None).map_err(|failure| failure.error)
    }

    /// [`Manifest::parse`], with errors placed by `origin` when the text is a file rewritten
    /// with `--set` overrides.
    pub(crate) fn parse_from(text: &str, path: &Path, origin: Option<&Origin>) -> Result<Self, Failure> {
        let err = |message: String| Failure::from(ManifestError { path: path.to_path_buf(), message });
        let spans = Spans::parse(text).map_err(err)?;
        let located = |problem: Problem| located(&spans, problem, path, origin);
        if let Some((field, value)) = spans.first_non_finite_float() {
            return Err(located(Problem::new(field, format!("must be a finite number, got {value}"))));
        }
        let doc: toml::Table = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        let raw: RawManifest = toml::from_str(text).map_err(|e| {
            // toml's message quotes the text parsed by line: with overrides, a text the user never
            // saw, so the problem is placed by its field instead.
            match (origin, e.span().and_then(|span| spans.path_at(span.start))) {
                (Some(_), Some(field)) => located(Problem::new(field, e.message())),
                _ => err(e.to_string().trim_end().to_string()),
            }
        })?;
        let global_train = doc.get("train").and_then(|t| t.as_table()).cloned().unwrap_or_default();
        let models = raw
            .models
            .into_iter()
            .enumerate()
            .map(|(i, table)| model_entry(table, &global_train, &format!("models[{i}]")))
            .collect::<Result<Vec<_>, _>>()
            .map_err(located)?;
        let single_strategy = raw.strategy.is_some();
        let strategy_path =
            |i: usize| if single_strategy { "strategy".to_string() } else { format!("strategies[{i}]") };
        let strategies = match (raw.strategy, raw.strategies) {
            (Some(_), Some(_)) => return Err(err("use either [strategy] or [[strategies]], not both".into())),
            (Some(one), None) => vec![one],
            (None, Some(list)) => list,
            (None, None) => vec![toml::Table::from_iter([("kind".to_string(), "sequential".into())])],
        };
        let strategies = strategies
            .into_iter()
            .enumerate()
            .map(|(i, table)| strategy_entry(table, &strategy_path(i)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(located)?;
        let manifest = Manifest {
            experiment: raw.experiment,
            data: raw.data,
            strategies,
            models,
            cluster: raw.cluster,
            report: raw.report,
            source: path.to_path_buf(),
            overrides: Vec::new(),
        };
        raw.train
            .validate()
            .map_err(|e| Problem::invalid("train", &e))
            .and_then(|()| checks::check(&manifest, &strategy_path))
            .map_err(located)?;
        Ok(manifest)
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
        m.report = ReportSettings::default();
        m
    }

    /// TOML text of the manifest.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# could not serialize the manifest: {e}\n"))
    }
}

fn read(path: &Path) -> Result<String, ManifestError> {
    std::fs::read_to_string(path)
        .map_err(|e| ManifestError { path: path.to_path_buf(), message: format!("cannot read the manifest: {e}") })
}

/// Where a manifest read with `--set` overrides came from: parsed as one document rewritten from
/// both, its errors name the override that sets their field, or else the line of the file.
pub(crate) struct Origin<'a> {
    /// The manifest file as written.
    file: Spans<'a>,
    /// Each override with the dotted path it sets (`models[0].train.epochs`).
    overrides: &'a [(String, Override)],
}

impl<'a> Origin<'a> {
    /// The manifest file's text and the overrides applied to it, with their paths.
    pub(crate) fn new(file: &'a str, overrides: &'a [(String, Override)]) -> Result<Self, String> {
        Ok(Self { file: Spans::parse(file)?, overrides })
    }

    /// The override whose value holds `field` (or is inside it, for a problem of the entry a
    /// key of it was set in).
    fn setting(&self, field: &str) -> Option<&'a Override> {
        let within = |inner: &str, outer: &str| {
            inner.strip_prefix(outer).is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        };
        let set = |at: &&(String, Override)| within(field, &at.0) || within(&at.0, field);
        self.overrides.iter().rev().find(set).map(|(_, o)| o)
    }
}

/// A manifest error, and whether it lies at a field a `--set` override sets.
pub(crate) struct Failure {
    pub(crate) error: ManifestError,
    pub(crate) at_override: bool,
}

impl From<ManifestError> for Failure {
    fn from(error: ManifestError) -> Self {
        Self { error, at_override: false }
    }
}

/// The error for `problem`, at the first of its fields the manifest writes, with that line. When
/// none is written (a serde error names a key or value, not where it is), at the first key or
/// string value under the nearest written table that the message names in backticks. With an
/// `origin`, `spans` are the rewritten document's: the field is named with the override that
/// sets it, else with its line in the file.
fn located(spans: &Spans, problem: Problem, path: &Path, origin: Option<&Origin>) -> Failure {
    let named = || {
        let name = problem.message.split('`').nth(1)?;
        spans.find(&spans.written_prefix(&problem.fields[0]), name)
    };
    let field = problem
        .fields
        .iter()
        .find(|f| spans.contains(f))
        .cloned()
        .or_else(named)
        .unwrap_or_else(|| problem.fields[0].clone());
    let field = &field;
    let setting = origin.and_then(|o| o.setting(field));
    let lines = origin.map_or(spans, |o| &o.file);
    let message = match (setting, lines.line(field)) {
        (Some(setting), _) => format!("{setting}: {field}: {}", problem.message),
        (None, Some(line)) => format!("{field} (line {line}): {}", problem.message),
        (None, None) => format!("{field}: {}", problem.message),
    };
    Failure { error: ManifestError { path: path.to_path_buf(), message }, at_override: setting.is_some() }
}

/// Builds model entry `path` from its raw table: `name`, an optional `train` override table,
/// and the architecture's fields.
fn model_entry(mut table: toml::Table, global_train: &toml::Table, path: &str) -> Result<ModelEntry, Problem> {
    let name = match table.remove("name") {
        Some(toml::Value::String(s)) if !s.is_empty() => s,
        Some(_) => return Err(Problem::new(format!("{path}.name"), "must be a non-empty string")),
        None => return Err(Problem::new(path, "missing field `name`")),
    };
    let named = |problem: Problem| Problem { message: format!("model `{name}`: {}", problem.message), ..problem };
    let mut train = global_train.clone();
    match table.remove("train") {
        Some(toml::Value::Table(overrides)) => train.extend(overrides),
        Some(_) => return Err(named(Problem::new(format!("{path}.train"), "must be a table of [train] overrides"))),
        None => {}
    }
    let train_path = format!("{path}.train");
    let train: TrainConfig = deserialize(&train, &train_path).map_err(|problem| {
        // A key the entry does not override is written in `[train]`.
        let global = problem.fields[0].replacen(&train_path, "train", 1);
        named(problem).or_at(global)
    })?;
    let config: ModelConfig = deserialize(&table, path).map_err(named)?;
    Ok(ModelEntry { name, config, train })
}

/// Builds strategy `path` from its raw table.
fn strategy_entry(table: toml::Table, path: &str) -> Result<StrategyConfig, Problem> {
    let strategy: StrategyConfig = deserialize(&table, path)?;
    checks::check_no_ignored_keys(&table, &strategy, path)?;
    Ok(strategy)
}

/// `table`, written at `path`, as a `T`. serde's message names the field for an unknown or
/// missing key but not for a value of the wrong type (`embedding_dim = 16.5`), nor anything
/// inside an internally tagged enum (models, strategies): the problem is then placed at the key
/// [`culprit`] finds, before the place the message suggests.
fn deserialize<T: serde::de::DeserializeOwned>(table: &toml::Table, path: &str) -> Result<T, Problem> {
    toml::Value::Table(table.clone()).try_into().map_err(|e| {
        let problem = Problem::nested(path, &one_line(e));
        match culprit::<T>(table) {
            Some(key) => Problem { fields: vec![format!("{path}.{key}")], ..problem }.or_at(problem.fields[0].clone()),
            None => problem,
        }
    })
}

/// The dotted path of the one key (searched depth-first, inner tables included) without which
/// `table` deserializes as a `T`: the field a deserialization error is about. `None` when no
/// single key is to blame (a missing key, an unknown `kind`, two wrong values).
fn culprit<T: serde::de::DeserializeOwned>(table: &toml::Table) -> Option<String> {
    fn search<T: serde::de::DeserializeOwned>(root: &toml::Table, at: &[String], here: &toml::Table) -> Option<String> {
        here.iter().find_map(|(key, value)| {
            let path = [at, std::slice::from_ref(key)].concat();
            let mut without = root.clone();
            let parent = path[..path.len() - 1]
                .iter()
                .try_fold(&mut without, |t, k| t.get_mut(k).and_then(toml::Value::as_table_mut))?;
            parent.remove(key);
            toml::Value::Table(without).try_into::<T>().ok()?;
            let inner = value.as_table().and_then(|inner| search::<T>(root, &path, inner));
            Some(inner.unwrap_or_else(|| path.join(".")))
        })
    }
    search::<T>(table, &[], table)
}

fn one_line(e: toml::de::Error) -> String {
    e.to_string().lines().filter(|l| !l.trim().is_empty()).collect::<Vec<_>>().join(" ")
}
