//! `tandem predict` and `tandem evaluate`: a trained run's answers, printed as a table or JSON.

use std::path::Path;

use tandem_data::{SplitMode, CLASS_NAMES};
use tandem_experiment::inference::{read_labelled, read_texts};
use tandem_experiment::TrainedRun;
use tandem_results::ClassificationMetrics;

use crate::InferenceOptions;

/// Classifies `texts` (or the texts of `file`) and prints one line per text.
pub fn predict(run: &Path, texts: Vec<String>, file: Option<&Path>, options: &InferenceOptions) -> Result<(), String> {
    let trained = TrainedRun::open(run).map_err(|e| e.to_string())?;
    let texts = match file {
        Some(file) => read_texts(file).map_err(|e| e.to_string())?,
        None => texts,
    };
    let backend = options.backend.unwrap_or_else(|| trained.default_backend());
    let encoded = trained.encode_texts(&texts);
    let predictions = trained.predict(&encoded, backend, options.batch_size).map_err(|e| e.to_string())?;
    if options.json {
        let rows: Vec<serde_json::Value> = texts
            .iter()
            .zip(&predictions)
            .map(|(text, p)| {
                let probabilities: serde_json::Map<String, serde_json::Value> =
                    CLASS_NAMES.iter().zip(&p.probabilities).map(|(c, v)| (c.to_string(), (*v).into())).collect();
                serde_json::json!({ "text": text, "class": p.label, "probabilities": probabilities })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?);
        return Ok(());
    }
    for (text, p) in texts.iter().zip(&predictions) {
        let probabilities: Vec<String> =
            CLASS_NAMES.iter().zip(&p.probabilities).map(|(c, v)| format!("{c} {v:.3}")).collect();
        println!("{:<9} ({})  {}", p.label, probabilities.join(", "), shorten(text, 70));
    }
    Ok(())
}

/// Evaluates the run on the labelled CSV `data` (or a data folder's test.csv) and prints the metrics.
pub fn evaluate(run: &Path, data: &Path, options: &InferenceOptions) -> Result<(), String> {
    let trained = TrainedRun::open(run).map_err(|e| e.to_string())?;
    let samples = read_labelled(data).map_err(|e| e.to_string())?;
    if holds_training_rows(&trained, data) {
        eprintln!(
            "note: {} holds the rows {} was trained on (its summary.json: {} training samples); \
             these figures include them and are optimistic: the run's holdout figures are in its summary.json",
            data.display(),
            run.display(),
            trained.summary.as_ref().map_or("?".into(), |s| tandem_data::thousands(s.train_samples))
        );
    }
    let backend = options.backend.unwrap_or_else(|| trained.default_backend());
    let metrics = trained.evaluate(&samples, backend, options.batch_size).map_err(|e| e.to_string())?;
    if options.json {
        println!("{}", serde_json::to_string_pretty(&metrics_json(&metrics)?).map_err(|e| e.to_string())?);
    } else {
        let rows = tandem_data::thousands(samples.len());
        println!("{} on {rows} samples of {} (backend {backend})", run.display(), data.display());
        print!("{}", metrics_table(&metrics));
    }
    Ok(())
}

/// Whether `data` (a data folder or a CSV) holds rows `trained` trained on: its own data folder's
/// `train.csv`, or its `test.csv` where the run carved its split from it.
fn holds_training_rows(trained: &TrainedRun, data: &Path) -> bool {
    let dir = trained.manifest.data_dir();
    let (folder, file) = match data.is_dir() {
        true => (data, None),
        false => (data.parent().unwrap_or(Path::new(".")), data.file_name()),
    };
    let same = matches!((dir.canonicalize(), folder.canonicalize()), (Ok(a), Ok(b)) if a == b);
    let resplit = trained.manifest.data.split.resolve(&dir) != SplitMode::Official;
    same && (resplit || file.is_some_and(|f| f == "train.csv"))
}

/// The metrics as JSON with the class names: `classes` (the confusion matrix's row and column
/// order) and each per-class entry's `class`.
fn metrics_json(m: &ClassificationMetrics) -> Result<serde_json::Value, String> {
    let mut value = serde_json::to_value(m).map_err(|e| e.to_string())?;
    if let Some(per_class) = value.get_mut("per_class").and_then(|v| v.as_array_mut()) {
        for (entry, name) in per_class.iter_mut().zip(CLASS_NAMES) {
            if let Some(entry) = entry.as_object_mut() {
                entry.insert("class".into(), name.into());
            }
        }
    }
    if let Some(object) = value.as_object_mut() {
        object.insert("classes".into(), CLASS_NAMES.to_vec().into());
    }
    Ok(value)
}

/// Accuracy, the macro averages, per-class precision / recall / F1 and the confusion matrix.
fn metrics_table(m: &ClassificationMetrics) -> String {
    let mut out = format!(
        "accuracy {:.4}, macro precision {:.4}, macro recall {:.4}, macro F1 {:.4}\n\n",
        m.accuracy, m.macro_precision, m.macro_recall, m.macro_f1
    );
    out += &format!("{:<10} {:>9} {:>9} {:>9} {:>8}\n", "class", "precision", "recall", "F1", "support");
    for (name, c) in CLASS_NAMES.iter().zip(&m.per_class) {
        out += &format!("{name:<10} {:>9.4} {:>9.4} {:>9.4} {:>8}\n", c.precision, c.recall, c.f1, c.support);
    }
    out += "\nconfusion matrix (rows: true class, columns: predicted)\n";
    out += &format!("{:<10}", "");
    for name in CLASS_NAMES {
        out += &format!(" {name:>9}");
    }
    out.push('\n');
    for (name, row) in CLASS_NAMES.iter().zip(&m.confusion.counts) {
        out += &format!("{name:<10}");
        for count in row {
            out += &format!(" {count:>9}");
        }
        out.push('\n');
    }
    out
}

/// `text` cut to `max` characters, with an ellipsis when cut.
fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}
