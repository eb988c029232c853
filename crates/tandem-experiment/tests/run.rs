//! A whole (tiny) experiment on the real AG News test split, end to end, on ndarray.

mod common;

use std::path::Path;

use common::{check_results, data_dir, manifest, run_tiny};
use tandem_experiment::{run, BackendKind, Manifest, RunOptions};

#[test]
fn a_run_writes_a_complete_results_folder() {
    let Some(data) = data_dir() else { return };
    let (out, result) = run_tiny(&data, BackendKind::Ndarray, &["cpu"]);
    let summaries = result.unwrap();
    check_results(out.path(), &summaries, BackendKind::Ndarray);
    assert!(summaries.iter().all(|s| !s.shared_devices), "CPU replicas and stages have their own cores");
}

#[test]
fn a_missing_dataset_is_reported_with_the_fetch_command() {
    let empty = tempfile::tempdir().unwrap();
    let m = Manifest::parse(&manifest(empty.path(), "ndarray", &["cpu"]), Path::new("tiny.toml")).unwrap();
    let options = RunOptions { out: empty.path().join("results"), progress: false, ..Default::default() };
    let err = run(&m, &options).unwrap_err();
    assert!(err.is_missing_data());
    assert!(err.to_string().contains("tandem data fetch"), "{err}");
}

#[test]
fn a_manifest_for_several_ranks_refuses_to_run_in_one_process() {
    let empty = tempfile::tempdir().unwrap();
    let text = manifest(empty.path(), "ndarray", &["cpu"]) + "\n[cluster]\nranks = 2\n";
    let m = Manifest::parse(&text, Path::new("tiny.toml")).unwrap();
    let options = RunOptions { out: empty.path().join("results"), progress: false, ..Default::default() };
    let err = run(&m, &options).unwrap_err().to_string();
    assert!(err.contains("tiny.toml") && err.contains("[cluster] ranks = 2") && err.contains("mpirun -np 2"), "{err}");
    assert!(!empty.path().join("results").exists(), "nothing written");
}

#[test]
fn a_stream_run_records_its_evaluation_points_and_prequential_accuracy() {
    let Some(data) = data_dir() else { return };
    let out = tempfile::tempdir().unwrap();
    // 200 rows in batches of 32: 7 batches a pass, 2 passes, holdout every 3 batches and at each
    // pass end: after batches 3, 6, 7, 9, 12, 14.
    let text =
        manifest(&data, "ndarray", &["cpu"]).replace("batch_size = 32", "batch_size = 32\nstream = { eval_every = 3 }");
    let m = Manifest::parse(&text, Path::new("tiny.toml")).unwrap();
    let options = RunOptions { out: out.path().to_path_buf(), progress: false, ..Default::default() };
    let summaries = run(&m, &options).unwrap();
    assert_eq!(summaries.len(), 6);
    for s in &summaries {
        let dir = out.path().join("tiny").join(&s.run_id);
        let records: Vec<tandem_train::EpochRecord> = std::fs::read_to_string(dir.join("epochs.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let points: Vec<usize> = records.iter().map(|r| r.stream.as_ref().unwrap().batches).collect();
        assert_eq!(points, [3, 6, 7, 9, 12, 14], "{}", s.run_id);
        assert_eq!(s.epochs_completed, 2, "{}: two passes", s.run_id);
        assert_eq!(s.prequential_samples, 400, "{}: every sample of both passes tested once", s.run_id);
        assert!(s.prequential_accuracy.is_some_and(|a| (0.0..=1.0).contains(&a)), "{}", s.run_id);
        assert!(s.data.contains("as a stream (2 passes in one fixed order, holdout every 3 batches)"), "{}", s.data);
    }
}
