//! The tiny experiment the end-to-end tests run, and the checks of its results folders.
#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};

use tandem_experiment::results::RunStatus;
use tandem_experiment::runner::RunError;
use tandem_experiment::{run, BackendKind, Manifest, RunOptions, RunSummary};

/// The AG News directory (see [`tandem_testing::ag_news_dir`]), naming the calling test.
#[track_caller]
pub fn data_dir() -> Option<PathBuf> {
    tandem_testing::ag_news_dir(&std::panic::Location::caller().to_string())
}

/// Two tiny models (GRU, Transformer) × sequential, data parallel (2 replicas) and model
/// parallel (2 stages, 1F1B), 2 epochs on 200 rows.
pub fn manifest(dir: &Path, backend: &str, devices: &[&str]) -> String {
    format!(
        r#"
[experiment]
name = "tiny"
seeds = [1]
backend = "{backend}"
devices = {devices:?}

[data]
dir = "{}"
max_len = 16
max_train_rows = 200
max_holdout_rows = 80
vocab = {{ max_size = 500, min_freq = 1 }}

[train]
epochs = 2
batch_size = 32

[[strategies]]
kind = "sequential"

[[strategies]]
kind = "data-parallel"
replicas = 2

[[strategies]]
kind = "model-parallel"
stages = 2
schedule = "1f1b"
micro_batches = 4

[[models]]
name = "gru"
architecture = "gru"
embedding_dim = 8
hidden = 8

[[models]]
name = "transformer"
architecture = "transformer"
d_model = 8
heads = 2
layers = 1
d_ff = 16
"#,
        dir.display()
    )
}

/// Runs [`manifest`] on `backend` and `devices`, into a fresh temporary results root.
pub fn run_tiny(
    data: &Path,
    backend: BackendKind,
    devices: &[&str],
) -> (tempfile::TempDir, Result<Vec<RunSummary>, RunError>) {
    let out = tempfile::tempdir().unwrap();
    let m = Manifest::parse(&manifest(data, backend.name(), devices), Path::new("tiny.toml")).unwrap();
    let options =
        RunOptions { backend: Some(backend), out: out.path().to_path_buf(), progress: false, ..Default::default() };
    let result = run(&m, &options);
    (out, result)
}

/// Checks the results folder of every run of [`manifest`]'s experiment (2 models × sequential,
/// data-parallel and model-parallel), run on `backend`.
pub fn check_results(out: &Path, summaries: &[RunSummary], backend: BackendKind) {
    assert_eq!(summaries.len(), 6, "2 models × 3 strategies");
    for s in summaries {
        let dir = out.join("tiny").join(&s.run_id);
        for file in ["manifest.toml", "vocab.json", "epochs.jsonl", "summary.json", "model.bin"] {
            assert!(dir.join(file).is_file(), "{} missing in {}", file, dir.display());
        }
        let on_disk: RunSummary =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
        assert_eq!(&on_disk, s);
        assert_eq!(s.status, RunStatus::Finished);
        assert_eq!((s.backend.as_str(), s.seed, s.epochs_completed), (backend.name(), 1, 2));
        assert!(s.data.contains("test split"), "{}", s.data);
        assert_eq!((s.train_samples, s.holdout_samples), (200, 80));
        assert_eq!(s.final_metrics.as_ref().unwrap().confusion.total(), 80);
        assert_eq!(s.tandem_version, env!("CARGO_PKG_VERSION"));
        let epochs = std::fs::read_to_string(dir.join("epochs.jsonl")).unwrap();
        assert_eq!(epochs.lines().count(), 2);
        // The recorded manifest reproduces the run: it parses and names the model, seed and backend.
        let recorded = Manifest::load(&dir.join("manifest.toml")).unwrap();
        assert_eq!(recorded.models.len(), 1);
        assert_eq!(recorded.models[0].name, s.model);
        assert_eq!(recorded.experiment.seeds, vec![1]);
        assert_eq!(recorded.experiment.backend, backend);
        assert_eq!(recorded.strategies.len(), 1);
        assert_eq!(recorded.strategies[0].label(), s.strategy);
        if s.strategy.starts_with("data-parallel") {
            assert_eq!(s.devices.len(), 2, "one device per replica");
            let last: tandem_train::EpochRecord = serde_json::from_str(epochs.lines().last().unwrap()).unwrap();
            let figures = last.figures.data_parallel().expect("data-parallel figures");
            assert_eq!(figures.replica_max_abs_difference, 0.0);
            assert!(figures.bytes_sent_per_replica_per_step > 0.0);
        }
        if s.strategy.starts_with("model-parallel") {
            assert_eq!(s.devices.len(), 2, "one device per stage");
            let last: tandem_train::EpochRecord = serde_json::from_str(epochs.lines().last().unwrap()).unwrap();
            let figures = last.figures.pipeline().expect("pipeline figures");
            assert_eq!(figures.cuts.len(), 1, "balanced by time into 2 stages");
            assert!(figures.bytes_per_step > 0.0);
        }
    }
}
