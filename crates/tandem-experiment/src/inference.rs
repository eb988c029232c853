//! Using a trained run: its folder's manifest, vocabulary and parameters loaded back, texts
//! classified and datasets evaluated, on any compiled backend.
//!
//! A run folder holds `manifest.toml` (the resolved manifest of one model), `vocab.json` and
//! `model.bin` (Burn's binary record at full precision). Texts are encoded as training encoded
//! them: cleaned like AG News fields, tokenized, looked up in the run's vocabulary and padded or
//! truncated to the manifest's `max_len`.

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use tandem_data::{Encoded, Sample, Vocab, CLASS_NAMES, NUM_CLASSES};
use tandem_models::{Classifier, InputSpec};
use tandem_results::{ClassificationMetrics, ConfusionMatrix, RunSummary};

use crate::backend::{compiled_backends, is_compiled, with_backend, BackendKind, BackendTask, DeviceSpec};
use crate::manifest::{Manifest, ModelEntry};

/// A run folder or input that cannot be used; the message names the file at fault.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct InferenceError {
    pub path: PathBuf,
    pub message: String,
}

impl InferenceError {
    fn new(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        let path = path.into();
        Self { message: format!("{}: {message}", path.display()), path }
    }

    /// An error whose message already names the file (tandem-data's errors do).
    fn data(path: &Path, error: tandem_data::DataError) -> Self {
        Self { path: path.to_path_buf(), message: error.to_string() }
    }
}

/// One text's predicted class and the probability of every class.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Prediction {
    /// 0-based class index.
    pub class: usize,
    /// The class's name ([`CLASS_NAMES`]).
    pub label: &'static str,
    /// Softmax probabilities, indexed by class.
    pub probabilities: Vec<f64>,
}

impl Prediction {
    fn from_probabilities(probabilities: Vec<f64>) -> Self {
        let class = probabilities.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i);
        Self { class, label: CLASS_NAMES[class], probabilities }
    }
}

/// A trained run loaded from its folder: the model entry, data settings and vocabulary.
#[derive(Clone, Debug)]
pub struct TrainedRun {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub vocab: Vocab,
    /// Its `summary.json`, where one is there and readable.
    pub summary: Option<RunSummary>,
}

impl TrainedRun {
    /// Reads `manifest.toml` and `vocab.json` of run folder `dir`, and checks that `model.bin`
    /// exists (its contents are checked against the manifest when it is loaded).
    pub fn open(dir: &Path) -> Result<Self, InferenceError> {
        let manifest_path = dir.join("manifest.toml");
        let vocab_path = dir.join("vocab.json");
        for file in [&manifest_path, &vocab_path, &dir.join("model.bin")] {
            if !file.is_file() {
                return Err(InferenceError::new(
                    file,
                    "missing: not a finished run folder (one that `tandem run` wrote, <out>/<experiment>/<run-id>/)",
                ));
            }
        }
        let summary = std::fs::read_to_string(dir.join("summary.json")).ok();
        let summary = summary.and_then(|text| tandem_results::folder::parse_summary(&text).ok());
        check_manifest_hash(summary.as_ref(), &manifest_path)?;
        let manifest = Manifest::load(&manifest_path)
            .map_err(|e| InferenceError { path: manifest_path.clone(), message: e.to_string() })?;
        if manifest.models.len() != 1 {
            return Err(InferenceError::new(
                &manifest_path,
                format!("a run's manifest names one model, this one {}", manifest.models.len()),
            ));
        }
        let vocab = Vocab::load(&vocab_path).map_err(|e| InferenceError::data(&vocab_path, e))?;
        if vocab.len() > manifest.data.vocab.max_size {
            return Err(InferenceError::new(
                &vocab_path,
                format!(
                    "vocabulary size mismatch: {} tokens, but the manifest allows at most {} ([data] vocab.max_size)",
                    vocab.len(),
                    manifest.data.vocab.max_size
                ),
            ));
        }
        Ok(Self { dir: dir.to_path_buf(), manifest, vocab, summary })
    }

    /// The run's one model entry.
    pub fn model(&self) -> &ModelEntry {
        &self.manifest.models[0]
    }

    /// The backend to use by default: the manifest's when compiled in, else flex, else the
    /// first compiled backend.
    pub fn default_backend(&self) -> BackendKind {
        let wanted = [self.manifest.experiment.backend, BackendKind::Flex];
        wanted.into_iter().find(|b| is_compiled(*b)).unwrap_or_else(|| compiled_backends()[0])
    }

    /// Encodes texts as training did (AG News cleaning, tokenizer, vocabulary, `max_len`).
    pub fn encode_texts(&self, texts: &[String]) -> Encoded {
        let samples: Vec<Sample> = texts
            .iter()
            .map(|t| Sample { label: 0, title: tandem_data::clean_text(t), description: String::new() })
            .collect();
        self.encode(&samples)
    }

    /// Encodes labelled samples (e.g. read from an AG News CSV).
    pub fn encode(&self, samples: &[Sample]) -> Encoded {
        Encoded::new(samples, &self.vocab, self.manifest.data.max_len)
    }

    /// Class probabilities and the predicted class of every row of `data`, `batch_size` rows at
    /// a time on `backend`'s first device.
    pub fn predict(
        &self,
        data: &Encoded,
        backend: BackendKind,
        batch_size: usize,
    ) -> Result<Vec<Prediction>, InferenceError> {
        let rows = probabilities_on(backend, self, data, batch_size)?;
        Ok(rows.into_iter().map(Prediction::from_probabilities).collect())
    }

    /// Accuracy, macro and per-class precision / recall / F1 and the confusion matrix on `samples`.
    pub fn evaluate(
        &self,
        samples: &[Sample],
        backend: BackendKind,
        batch_size: usize,
    ) -> Result<ClassificationMetrics, InferenceError> {
        let data = self.encode(samples);
        let predicted: Vec<usize> = self.predict(&data, backend, batch_size)?.iter().map(|p| p.class).collect();
        let mut confusion = ConfusionMatrix::new(NUM_CLASSES);
        confusion.add(&data.labels, &predicted);
        Ok(ClassificationMetrics::from_confusion(confusion))
    }
}

/// Runs [`probabilities`] on `backend` and its first device.
fn probabilities_on(
    backend: BackendKind,
    run: &TrainedRun,
    data: &Encoded,
    batch_size: usize,
) -> Result<Vec<Vec<f64>>, InferenceError> {
    let task = Probabilities { run, data, batch_size };
    with_backend(backend, &[DeviceSpec::first_of(backend)], task).map_err(|e| InferenceError::new(&run.dir, e))?
}

/// [`probabilities`], on whichever backend it is given (without autodiff).
struct Probabilities<'a> {
    run: &'a TrainedRun,
    data: &'a Encoded,
    batch_size: usize,
}

impl BackendTask for Probabilities<'_> {
    type Output = Result<Vec<Vec<f64>>, InferenceError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        probabilities::<B::InnerBackend>(self.run, self.data, self.batch_size, &devices[0])
    }
}

/// Loads the run's model on `device` and returns the softmax of its logits, row by row.
fn probabilities<B: Backend>(
    run: &TrainedRun,
    data: &Encoded,
    batch_size: usize,
    device: &B::Device,
) -> Result<Vec<Vec<f64>>, InferenceError> {
    let model = load_model::<B>(run, device)?;
    let order: Vec<usize> = (0..data.len()).collect();
    let mut rows = Vec::with_capacity(data.len());
    for indices in tandem_data::batches(&order, batch_size.max(1)) {
        let batch = data.batch::<B>(indices, device);
        let logits = model.forward(batch.tokens, &batch.mask_pad);
        let probs = burn::tensor::activation::softmax(logits, 1).into_data();
        let values: Vec<f64> = probs.iter::<f64>().collect();
        rows.extend(values.chunks(NUM_CLASSES).map(<[f64]>::to_vec));
    }
    Ok(rows)
}

/// Checks `manifest.toml` against the hash `summary.json` recorded of it (where a summary with
/// one exists): the resolved manifest says how texts are encoded and the model built, so one
/// changed after training would predict from other settings without a word.
fn check_manifest_hash(summary: Option<&RunSummary>, manifest_path: &Path) -> Result<(), InferenceError> {
    let Some(recorded) = summary.and_then(|s| s.manifest_hash.as_ref()) else { return Ok(()) };
    let text = std::fs::read_to_string(manifest_path)
        .map_err(|e| InferenceError::new(manifest_path, format!("cannot read it: {e}")))?;
    match crate::results::manifest_hash(&text) == *recorded {
        true => Ok(()),
        false => Err(InferenceError::new(
            manifest_path,
            "differs from the manifest the run was trained with (summary.json records another `manifest_hash`); \
             restore it from a copy or train the run again",
        )),
    }
}

/// Builds the manifest's model for the run's vocabulary and loads `model.bin` into it, checking
/// that every parameter has the shape the manifest's architecture gives it.
fn load_model<B: Backend>(run: &TrainedRun, device: &B::Device) -> Result<Classifier<B>, InferenceError> {
    let path = run.dir.join("model.bin");
    let mismatch = |why: String| {
        InferenceError::new(
            &path,
            format!(
                "does not match the model of manifest.toml (`{}`): {why}",
                run.model().config.architecture().name()
            ),
        )
    };
    let input = InputSpec { vocab_size: run.vocab.len(), max_len: run.manifest.data.max_len, num_classes: NUM_CLASSES };
    let fresh: Classifier<B> = run.model().config.init(&input, device);
    let expected = shapes(&fresh);
    let (bytes, sealed) = tandem_results::read_sealed(&path).map_err(|e| InferenceError {
        message: format!("{e}; train the run again (`tandem run --fresh`) or restore model.bin from a copy"),
        path: path.clone(),
    })?;
    let record = tandem_train::checkpoint::load_record_bytes(&bytes, device).map_err(|e| match sealed {
        true => mismatch(format!("cannot read it as its parameters ({e})")),
        false => {
            mismatch(format!("cannot read it as its parameters: written without a checksum, it may be damaged ({e})"))
        }
    })?;
    // Burn asserts (panics) when a record's structure differs from the module's.
    let previous_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fresh.load_record(record)));
    std::panic::set_hook(previous_hook);
    let model = loaded.map_err(|_| mismatch("its blocks differ from the architecture's".into()))?;
    let found = shapes(&model);
    if found == expected {
        return Ok(model);
    }
    // The token embedding comes first: a different row count there is a vocabulary mismatch.
    let vocab_rows = |s: &[Vec<usize>]| s.first().and_then(|dims| dims.first().copied());
    let (want, got) = (vocab_rows(&expected), vocab_rows(&found));
    if want != got && expected.len() == found.len() && expected[1..] == found[1..] {
        return Err(InferenceError::new(
            &path,
            format!(
                "vocabulary size mismatch: its embedding has {} rows, vocab.json has {} tokens",
                got.unwrap_or(0),
                run.vocab.len()
            ),
        ));
    }
    let first = expected.iter().zip(&found).position(|(a, b)| a != b).unwrap_or(expected.len().min(found.len()));
    let shape = |s: &[Vec<usize>]| s.get(first).map_or("none".to_string(), |dims| format!("{dims:?}"));
    Err(mismatch(format!(
        "parameter tensor {first} has shape {} where the manifest's model has {} ({} tensors, {} expected)",
        shape(&found),
        shape(&expected),
        found.len(),
        expected.len()
    )))
}

/// The shape of every float parameter, in visiting order.
fn shapes<B: Backend>(model: &Classifier<B>) -> Vec<Vec<usize>> {
    struct Shapes(Vec<Vec<usize>>);
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.lazy_shape().iter().copied().collect());
        }
    }
    let mut visitor = Shapes(Vec::new());
    model.visit(&mut visitor);
    visitor.0
}

/// Reads texts to classify: an AG News CSV (class,title,description; the text is title and
/// description) or any other file as one text per non-empty line.
pub fn read_texts(path: &Path) -> Result<Vec<String>, InferenceError> {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv")) {
        let samples = tandem_data::read_csv(path).map_err(|e| InferenceError::data(path, e))?;
        return Ok(samples.iter().map(Sample::text).collect());
    }
    let text = std::fs::read_to_string(path).map_err(|e| InferenceError::new(path, format!("cannot read: {e}")))?;
    Ok(text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect())
}

/// Reads labelled samples to evaluate on: an AG News CSV file, or a data folder's `test.csv`.
pub fn read_labelled(path: &Path) -> Result<Vec<Sample>, InferenceError> {
    let file = if path.is_dir() { path.join(tandem_data::TEST_FILE) } else { path.to_path_buf() };
    tandem_data::read_csv(&file).map_err(|e| InferenceError::data(&file, e))
}
