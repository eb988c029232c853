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
