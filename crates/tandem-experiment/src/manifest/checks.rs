//! The checks serde cannot make: ranges and constraints across fields and sections. Each
//! problem names its field as a dotted path (`strategies[1].model_parallel.micro_batches`),
//! which the caller turns into a line of the manifest.

use tandem_models::{InputSpec, Invalid, ModelConfig};
use tandem_parallel::{ModelParallelConfig, Schedule};

use super::{Launch, Manifest, StrategyConfig};
use crate::backend::{BadDevice, DeviceSpec};
use crate::memory::{gib, parameter_count, training_bytes, MAX_SEQUENCE_LEN, MAX_TRAINING_BYTES};

/// What is wrong, and the fields it may be written at, best first.
pub(super) struct Problem {
    pub fields: Vec<String>,
    pub message: String,
}

impl Problem {
    pub(super) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { fields: vec![field.into()], message: message.into() }
    }

    /// A setting a config's own checks refuse, under `prefix`.
    pub(super) fn invalid(prefix: &str, invalid: &Invalid) -> Self {
        let field = std::iter::once(prefix.to_string()).chain(invalid.path()).collect::<Vec<_>>().join(".");
        Self::new(field, invalid.message.clone())
    }

    /// A problem serde found under `prefix`. Its message may start
    /// with `section: ` steps and names the field in backticks (`` `micro_batches` must … ``):
    /// those extend the path.
    pub(super) fn nested(prefix: &str, message: &str) -> Self {
        let mut field = prefix.to_string();
        let mut rest = message;
        while let Some((head, tail)) = rest.split_once(": ") {
            if head.is_empty() || !head.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                break;
            }
            field = format!("{field}.{head}");
            rest = tail;
        }
        // A field's name, not a value such as `16.5` that serde quotes the same way.
        let named = rest.split('`').nth(1).filter(|name| {
            name.starts_with(|c: char| c.is_ascii_lowercase())
                && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.".contains(c))
        });
        if let Some(name) = named {
            field = format!("{field}.{name}");
        }
        Self::new(field, rest)
    }

    /// The same problem, also looked for at `field` when the first place is not written.
    pub(super) fn or_at(mut self, field: String) -> Self {
        self.fields.push(field);
        self
    }
}

/// Keys serde accepted without reading them (the fields of a variant without settings, such as
/// `predictor = { kind = "static", alpha = 0.5 }`): every key the manifest writes in a strategy
/// must appear in the strategy as parsed and written back.
pub(super) fn check_no_ignored_keys(written: &toml::Table, parsed: &StrategyConfig, path: &str) -> Result<(), Problem> {
    fn compare(written: &toml::Table, parsed: &toml::Table, path: &str) -> Result<(), Problem> {
        for (key, value) in written {
            match (value, parsed.get(key)) {
                (_, None) => return Err(Problem::new(format!("{path}.{key}"), format!("unknown field `{key}` here"))),
                (toml::Value::Table(written), Some(toml::Value::Table(parsed))) => {
                    compare(written, parsed, &format!("{path}.{key}"))?
                }
                _ => {}
            }
        }
        Ok(())
    }
    match toml::Value::try_from(parsed) {
        Ok(toml::Value::Table(parsed)) => compare(written, &parsed, path),
        _ => Ok(()),
    }
}

/// Every check of a parsed manifest; `strategy_path(i)` names strategy `i` as the manifest wrote it.
pub(super) fn check(m: &Manifest, strategy_path: &dyn Fn(usize) -> String) -> Result<(), Problem> {
    check_experiment(m)?;
    check_data(m)?;
    if m.strategies.is_empty() {
        return Err(Problem::new("strategies", "list at least one strategy"));
    }
    for (i, strategy) in m.strategies.iter().enumerate() {
        let path = strategy_path(i);
        strategy.kind().validate().map_err(|e| Problem::invalid(&path, &e))?;
        if m.strategies[..i].iter().any(|o| o.label() == strategy.label()) {
            return Err(Problem::new(path, format!("`{}` is listed twice", strategy.label())));
        }
    }
    if m.cluster.ranks == Some(0) {
        return Err(Problem::new("cluster.ranks", "must be at least 1"));
    }
    if m.cluster.launch == Launch::Local && m.cluster.ranks.is_none() {
        return Err(Problem::new(
            "cluster.launch",
            "`launch = \"local\"` starts `ranks` processes: set `[cluster] ranks`",
        ));
    }
    if let Some((field, message)) = m.report.target.as_ref().and_then(|t| t.problem()) {
        return Err(Problem::new(format!("report.target.{field}"), message));
    }
    check_models(m)?;
    for (i, strategy) in m.strategies.iter().enumerate() {
        check_stages(m, strategy, &strategy_path(i))?;
        check_shards(m, strategy, &strategy_path(i))?;
    }
    Ok(())
}

fn check_experiment(m: &Manifest) -> Result<(), Problem> {
    let e = &m.experiment;
    if e.name.is_empty() || !e.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        let message = format!("`{}` must be non-empty and use only letters, digits, `-`, `_`, `.`", e.name);
        return Err(Problem::new("experiment.name", message));
    }
    if e.seeds.is_empty() {
        return Err(Problem::new("experiment.seeds", "list at least one seed"));
    }
    if let Some((i, seed)) = e.seeds.iter().enumerate().find(|(i, s)| e.seeds[..*i].contains(s)) {
        return Err(Problem::new(format!("experiment.seeds[{i}]"), format!("seed {seed} is listed twice")));
    }
    if e.devices.is_empty() {
        return Err(Problem::new("experiment.devices", "list at least one device"));
    }
    for (i, d) in e.devices.iter().enumerate() {
        let field = format!("experiment.devices[{i}]");
        let spec: DeviceSpec = d.parse().map_err(|e: BadDevice| Problem::new(&field, e.to_string()))?;
        spec.check_backend(e.backend).map_err(|m| Problem::new(&field, m))?;
    }
    Ok(())
}

fn check_data(m: &Manifest) -> Result<(), Problem> {
    let d = &m.data;
    if !(d.holdout_fraction > 0.0 && d.holdout_fraction < 1.0) {
        return Err(Problem::new("data.holdout_fraction", format!("must be in (0, 1), got {}", d.holdout_fraction)));
    }
    if let Some(fraction) = d.validation_fraction.filter(|f| !(*f > 0.0 && *f < 1.0)) {
        return Err(Problem::new("data.validation_fraction", format!("must be in (0, 1), got {fraction}")));
    }
    if d.max_len == 0 {
        return Err(Problem::new("data.max_len", "must be at least 1"));
    }
    if d.max_len > MAX_SEQUENCE_LEN {
        let message = format!(
            "must be at most {MAX_SEQUENCE_LEN} tokens (AG News texts are far shorter: longer rows only add \
             padding that every model computes over, and the encoded dataset grows with them), got {}",
            d.max_len
        );
        return Err(Problem::new("data.max_len", message));
    }
    if d.vocab.max_size < 3 {
        return Err(Problem::new("data.vocab.max_size", "must be at least 3 (<pad>, <unk> and one word)"));
    }
    for (field, rows) in [("max_train_rows", d.max_train_rows), ("max_holdout_rows", d.max_holdout_rows)] {
        if rows == Some(0) {
            return Err(Problem::new(format!("data.{field}"), "must be at least 1 (or left out: all rows)"));
        }
    }
    Ok(())
}

/// The input `validate` checks models against: the vocabulary at its largest.
fn input_of(m: &Manifest) -> InputSpec {
    InputSpec { vocab_size: m.data.vocab.max_size, max_len: m.data.max_len, num_classes: tandem_data::NUM_CLASSES }
}

fn check_models(m: &Manifest) -> Result<(), Problem> {
    if m.models.is_empty() {
        return Err(Problem::new("models", "list at least one model"));
    }
    let input = input_of(m);
    // Data parallelism keeps one copy of the model per replica in the process.
    let copies = m.strategies.iter().map(StrategyConfig::model_copies).max().unwrap_or(1);
    for (i, entry) in m.models.iter().enumerate() {
        let path = format!("models[{i}]");
        let named = |msg: String| format!("model `{}`: {msg}", entry.name);
        if m.models[..i].iter().any(|o| o.name == entry.name) {
            return Err(Problem::new(format!("{path}.name"), format!("`{}` is used twice", entry.name)));
        }
        entry.config.validate(&input).map_err(|e| {
            let problem = Problem::invalid(&path, &e);
            Problem { message: named(problem.message), ..problem }
        })?;
        entry.train.validate().map_err(|e| {
            let problem = Problem::invalid(&format!("{path}.train"), &e);
            let global = problem.fields[0].replacen(&format!("{path}.train"), "train", 1);
            Problem { message: named(problem.message), ..problem }.or_at(global)
        })?;
        let parameters = parameter_count(&entry.config, &input);
        let bytes = training_bytes(parameters, copies);
        if bytes > MAX_TRAINING_BYTES {
            let replicas = if copies > 1 { format!(" × {copies} replicas") } else { String::new() };
            return Err(Problem::new(
                path,
                named(format!(
                    "about {parameters} parameters (with `vocab.max_size` = {} words) need {}{replicas} to train \
                     (weights, gradients, two Adam moments, 4 bytes each), over the limit of {}",
                    input.vocab_size,
                    gib(training_bytes(parameters, 1)),
                    gib(MAX_TRAINING_BYTES)
                )),
            ));
        }
    }
    Ok(())
}

/// The model-parallel settings of a strategy that cuts the model into stages, and their path.
fn model_parallel_of<'a>(strategy: &'a StrategyConfig, path: &str) -> Option<(&'a ModelParallelConfig, String)> {
    let (mp, key) = strategy.kind().model_parallel()?;
    Some((mp, key.map_or(path.to_string(), |key| format!("{path}.{key}"))))
}

/// Stages, cuts and micro-batches against every model's blocks and batch size.
fn check_stages(m: &Manifest, strategy: &StrategyConfig, path: &str) -> Result<(), Problem> {
    let Some((mp, path)) = model_parallel_of(strategy, path) else {
        return Ok(());
    };
    for (i, entry) in m.models.iter().enumerate() {
        let blocks = entry.config.num_blocks();
        let of_model = format!("model `{}` ({})", entry.name, blocks_of(&entry.config));
        if mp.pieces() > blocks {
            let message = match mp.virtual_stages {
                1 => format!("{} stages, but {of_model} has only {blocks} blocks", mp.stages),
                v => format!(
                    "{} stages × {v} virtual stages = {} pieces, but {of_model} has only {blocks} blocks",
                    mp.stages,
                    mp.pieces()
                ),
            };
            return Err(Problem::new(format!("{path}.stages"), message));
        }
        if let Some(cuts) = &mp.cuts {
            if let Some((j, cut)) = cuts.iter().enumerate().find(|(_, &c)| c == 0 || c >= blocks) {
                let message = format!("cut {cut} must be between 1 and {}: {of_model} has {blocks} blocks", blocks - 1);
                return Err(Problem::new(format!("{path}.cuts[{j}]"), message));
            }
            if let Some(j) = (1..cuts.len()).find(|&j| cuts[j - 1] >= cuts[j]) {
                let message = format!("cuts must be strictly increasing, got {} after {}", cuts[j], cuts[j - 1]);
                return Err(Problem::new(format!("{path}.cuts[{j}]"), message));
            }
        }
        let batch_size = entry.train.batch_size;
        if mp.schedule != Schedule::NAIVE && mp.micro_batches > batch_size {
            let message = format!(
                "{} micro-batches exceed the batch size {batch_size} of model `{}` (each needs at least one sample)",
                mp.micro_batches, entry.name
            );
            let train = format!("models[{i}].train.batch_size");
            return Err(Problem::new(format!("{path}.micro_batches"), message).or_at(train));
        }
    }
    Ok(())
}

/// Data parallelism cuts every global batch into one shard per replica (per replica of every
/// rank, in a job of `[cluster] ranks`): each shard needs at least one sample of every model's
/// batch, or a replica computes on nothing.
fn check_shards(m: &Manifest, strategy: &StrategyConfig, path: &str) -> Result<(), Problem> {
    let StrategyConfig::DataParallel(c) = strategy else {
        return Ok(());
    };
    let ranks = m.cluster.ranks.unwrap_or(1);
    let shards = c.replicas.saturating_mul(ranks);
    let Some((i, entry)) = m.models.iter().enumerate().find(|(_, e)| shards > e.train.batch_size) else {
        return Ok(());
    };
    let shards = match ranks {
        1 => format!("{} replicas", c.replicas),
        _ => format!("{} replicas × {ranks} ranks = {shards} shards", c.replicas),
    };
    let message = format!(
        "{shards} exceed the batch size {} of model `{}` (each replica's shard of a batch needs at least one sample)",
        entry.train.batch_size, entry.name
    );
    Err(Problem::new(format!("{path}.replicas"), message).or_at(format!("models[{i}].train.batch_size")))
}

/// The blocks of a model, for messages.
fn blocks_of(config: &ModelConfig) -> &'static str {
    match config {
        ModelConfig::Cnn(_) => "embedding, conv-pool, head",
        ModelConfig::Lstm(_) | ModelConfig::Gru(_) | ModelConfig::Transformer(_) => "embedding, one per layer, head",
    }
}
