//! The README's steps as a newcomer types them: run with `--set`, predict, evaluate, check the
//! data, install completions; and the errors a wrong run folder gets.

mod common;

use std::path::Path;

use common::{data_dir, tandem};
use tandem_results::ClassificationMetrics;

/// A quickstart-shaped manifest, small enough for a test: one small CNN, 1 epoch, 200 rows.
fn tiny_manifest(dir: &Path, data: &Path) -> std::path::PathBuf {
    let path = dir.join("tiny.toml");
    std::fs::write(
        &path,
        format!(
            "[experiment]\nname = \"tiny\"\nseeds = [1]\nbackend = \"ndarray\"\n\n[data]\ndir = \"{}\"\nmax_len = 16\nmax_train_rows = 200\nmax_holdout_rows = 80\nvocab = {{ max_size = 500, min_freq = 1 }}\n\n[train]\nepochs = 2\nbatch_size = 32\n\n[[models]]\nname = \"cnn\"\narchitecture = \"cnn\"\nembedding_dim = 8\nfilters = 4\nkernel_widths = [2]\n",
            data.display()
        ),
    )
    .unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_trained_run_is_changed_with_set_then_predicts_and_evaluates() {
    let Some(data) = data_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let manifest = tiny_manifest(tmp.path(), &data);
    let out = tmp.path().join("results");
    let (ok, _, stderr) = tandem(&[
        "run",
        s(&manifest),
        "--offline",
        "--out",
        s(&out),
        "--set",
        "train.epochs=1",
        "--set",
        "models.cnn.filters=6",
    ]);
    assert!(ok, "{stderr}");
    for line in ["experiment tiny", "runs:    1 = 1 model × 1 strategy × 1 seed", "run 1 of 1: cnn-sequential-seed1"]
    {
        assert!(stderr.contains(line), "{line:?} missing in {stderr}");
    }
    assert!(stderr.contains("cnn-sequential-seed1 epoch  1:"), "epoch lines name the run: {stderr}");
    let experiment = out.join("tiny");
    let hint = format!("next: tandem report {} --out report/tiny", experiment.display());
    assert!(stderr.trim_end().ends_with(&hint), "a report folder of the experiment's own: {stderr}");
    let run = experiment.join("cnn-sequential-seed1");
    let resolved = std::fs::read_to_string(run.join("manifest.toml")).unwrap();
    assert!(resolved.contains("filters = 6") && resolved.contains("epochs = 1"), "{resolved}");
    assert_eq!(std::fs::read_to_string(run.join("epochs.jsonl")).unwrap().lines().count(), 1);

    // Predict: a class name and the four probabilities per text.
    let (ok, stdout, stderr) =
        tandem(&["predict", s(&run), "Stocks fell as oil prices rose", "The team won the final"]);
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for line in lines {
        assert!(["World", "Sports", "Business", "Sci/Tech"].iter().any(|c| line.starts_with(c)), "{line}");
        assert!(line.contains("World 0.") && line.contains("Sci/Tech 0."), "{line}");
    }
    let texts = tmp.path().join("news.txt");
    std::fs::write(&texts, "Stocks fell as oil prices rose\n\nThe team won the final\nA new chip doubles speed\n")
        .unwrap();
    let (ok, stdout, stderr) = tandem(&["predict", s(&run), "--file", s(&texts), "--json", "--batch-size", "2"]);
    assert!(ok, "{stderr}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    assert_eq!(rows.len(), 3, "blank lines are skipped");
    let total: f64 = rows[0]["probabilities"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 1e-5, "{total}");
    assert_eq!(rows[2]["text"], "A new chip doubles speed");
    // Same answer on another backend and batch size.
    let (ok, flex, stderr) = tandem(&["predict", s(&run), "--file", s(&texts), "--json", "--backend", "flex"]);
    assert!(ok, "{stderr}");
    let flex: Vec<serde_json::Value> = serde_json::from_str(&flex).unwrap();
    assert_eq!(
        flex.iter().map(|r| &r["class"]).collect::<Vec<_>>(),
        rows.iter().map(|r| &r["class"]).collect::<Vec<_>>()
    );

    // Evaluate on the data folder (its test.csv): the full metrics block.
    let (ok, stdout, stderr) = tandem(&["evaluate", s(&run), "--data", s(&data)]);
    assert!(ok, "{stderr}");
    let note = "note: ".to_string() + s(&data) + " holds the rows";
    assert!(stderr.contains(&note) && stderr.contains("200 training samples"), "training rows named: {stderr}");
    for part in ["accuracy", "macro F1", "Sci/Tech", "support", "confusion matrix"] {
        assert!(stdout.contains(part), "{part} missing in {stdout}");
    }
    let (ok, stdout, stderr) = tandem(&["evaluate", s(&run), "--data", s(&data.join("test.csv")), "--json"]);
    assert!(ok, "{stderr}");
    let metrics: ClassificationMetrics = serde_json::from_str(&stdout).unwrap();
    assert_eq!(metrics.confusion.total(), 7600);
    assert_eq!(metrics.per_class.len(), 4);
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let names = ["World", "Sports", "Business", "Sci/Tech"];
    assert_eq!(json["classes"], serde_json::json!(names), "{stdout}");
    for (entry, name) in json["per_class"].as_array().unwrap().iter().zip(names) {
        assert_eq!(entry["class"], name, "each per-class entry names its class: {stdout}");
    }

    rejects_broken_run_folders(&run, tmp.path());
}

/// Copies of a good run folder, each broken in one way, are refused with the file named.
fn rejects_broken_run_folders(run: &Path, tmp: &Path) {
    let broken = |name: &str, breaks: &dyn Fn(&Path)| -> String {
        let dir = tmp.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for file in ["manifest.toml", "vocab.json", "model.bin"] {
            std::fs::copy(run.join(file), dir.join(file)).unwrap();
        }
        breaks(&dir);
        let (ok, _, stderr) = tandem(&["predict", s(&dir), "some text"]);
        assert!(!ok, "{name}: accepted");
        stderr
    };
    for file in ["manifest.toml", "vocab.json", "model.bin"] {
        let err = broken(&format!("no-{file}"), &|d| std::fs::remove_file(d.join(file)).unwrap());
        assert!(err.contains(file) && err.contains("missing"), "{err}");
    }
    let err = broken("short-vocab", &|d| {
        let path = d.join("vocab.json");
        let mut vocab: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let tokens = vocab["tokens"].as_array_mut().unwrap();
        tokens.truncate(tokens.len() - 5);
        // Written as a vocabulary of version 1, without the checksum the cut would break.
        vocab["version"] = 1.into();
        vocab.as_object_mut().unwrap().remove("checksum");
        std::fs::write(&path, vocab.to_string()).unwrap();
    });
    assert!(err.contains("model.bin") && err.contains("vocabulary size mismatch"), "{err}");
    // Replaces, in manifest.toml, the lines starting with each `from` by `to`.
    let edit = |d: &Path, changes: &[(&str, &str)]| {
        let path = d.join("manifest.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        for (from, to) in changes {
            let line = lines.iter_mut().find(|l| l.starts_with(from)).unwrap_or_else(|| panic!("{from}: {text}"));
            *line = to.to_string();
        }
        std::fs::write(&path, lines.join("\n")).unwrap();
    };
    let err = broken("other-shape", &|d| edit(d, &[("filters = 6", "filters = 5")]));
    assert!(err.contains("model.bin") && err.contains("does not match") && err.contains("[6, 8, 2]"), "{err}");
    let gru = [("architecture = ", "architecture = \"gru\"\nhidden = 8"), ("filters", ""), ("kernel_widths", "")];
    let err = broken("other-architecture", &|d| edit(d, &gru));
    assert!(err.contains("model.bin") && err.contains("does not match the model of manifest.toml (`gru`)"), "{err}");
}

#[test]
fn set_overrides_are_checked_like_the_file_and_named_when_wrong() {
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/../../experiments/quickstart.toml");
    let (ok, stdout, stderr) = tandem(&["validate", quickstart, "--set", "experiment.seeds=[1, 2, 3]"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("× 3 seeds = 12 runs"), "{stdout}");
    let (ok, _, stderr) = tandem(&["validate", quickstart, "--set", "train.epochs=2"]);
    assert!(ok && stderr.contains("note: --set train.epochs=2 does not reach `lstm`, `gru`"), "{stderr}");
    assert!(stderr.contains("--set models.lstm.train.epochs=2"), "{stderr}");
    let (ok, _, stderr) = tandem(&["validate", quickstart, "--set", "train.batch_size=32"]);
    assert!(ok && !stderr.contains("note:"), "every model takes it: {stderr}");
    let (ok, stdout, _) = tandem(&["validate", quickstart, "--set", "experiment.seeds=[1]"]);
    assert!(
        ok && stdout.contains("4 models × 1 strategy (sequential) × 1 seed = 4 runs"),
        "one of each, singular: {stdout}"
    );
    let (ok, _, stderr) = tandem(&["validate", quickstart, "--set", "train.epochs=2", "--set", "train.epocs=3"]);
    assert!(!ok);
    assert!(stderr.contains("--set train.epocs=3") && stderr.contains("epocs"), "{stderr}");
    assert!(!stderr.contains("train.epochs=2"), "only the faulty override is named: {stderr}");
    let (ok, _, stderr) = tandem(&["validate", quickstart, "--set", "models.rnn.hidden=3"]);
    assert!(!ok && stderr.contains("no `models` entry is named `rnn`"), "{stderr}");
    let (ok, _, stderr) = tandem(&["validate", quickstart, "--set", "train.epochs"]);
    assert!(!ok && stderr.contains("key.path=value"), "{stderr}");
}

#[test]
fn data_check_takes_the_directory_as_an_argument() {
    let (ok, _, stderr) = tandem(&["data", "check", "/no/such/dir"]);
    assert!(!ok && stderr.contains("/no/such/dir"), "{stderr}");
    let Some(data) = data_dir() else { return };
    let (ok, stdout, stderr) = tandem(&["data", "check", s(&data)]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("test.csv"), "{stdout}");
}

#[test]
fn completions_and_help_with_examples() {
    let (ok, stdout, stderr) = tandem(&["completions", "bash"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("_tandem()") && stdout.contains("predict") && stdout.contains("--set"), "{stdout}");
    for command in ["run", "validate", "predict", "evaluate", "report", "completions", "list"] {
        let (ok, stdout, _) = tandem(&[command, "--help"]);
        assert!(ok && stdout.contains("Example"), "`tandem {command} --help` has no example:\n{stdout}");
    }
    for command in ["check", "fetch"] {
        let (ok, stdout, _) = tandem(&["data", command, "--help"]);
        assert!(ok && stdout.contains("Example"), "`tandem data {command} --help` has no example:\n{stdout}");
    }
}

#[test]
fn a_failed_fetch_says_how_to_go_on_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("ag_news");
    // Nothing listens on the discard port of this machine: the download fails at once.
    let url = "http://127.0.0.1:9/ag_news_csv.tgz";
    let (ok, _, stderr) = tandem(&["data", "fetch", "--dir", target.to_str().unwrap(), "--url", url]);
    assert!(!ok);
    assert!(stderr.contains("TANDEM_DATA_DIR") && stderr.contains("test.csv"), "{stderr}");
}

#[test]
fn predict_without_texts_names_both_ways_to_give_them() {
    let (ok, _, stderr) = tandem(&["predict", "results/quickstart/cnn-sequential-seed42"]);
    assert!(!ok && stderr.contains("tandem predict <RUN> --file <FILE>"), "{stderr}");
}
