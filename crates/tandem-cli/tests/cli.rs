//! The `tandem` binary: exit codes and messages a user sees.

use std::process::Command;

fn tandem(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem")).args(args).output().expect("run tandem");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn list_names_the_compiled_backends() {
    let (ok, stdout, _) = tandem(&["list"]);
    assert!(ok);
    assert!(stdout.contains("flex     yes") && stdout.contains("ndarray  yes"), "{stdout}");
    for arch in ["cnn", "lstm", "gru", "transformer"] {
        assert!(stdout.contains(arch));
    }
}

#[test]
fn validate_accepts_the_quickstart_and_names_the_bad_field_otherwise() {
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/../../experiments/quickstart.toml");
    let (ok, stdout, _) = tandem(&["validate", quickstart]);
    assert!(ok, "{stdout}");
    assert!(stdout.contains("4 models"), "{stdout}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[experiment]\nname = \"x\"\n\n[train]\nbatch_sise = 3\n\n[[models]]\nname = \"m\"\narchitecture = \"cnn\"\n").unwrap();
    let (ok, _, stderr) = tandem(&["validate", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("bad.toml") && stderr.contains("batch_sise") && stderr.contains("line 5"), "{stderr}");
}

#[test]
fn run_offline_without_data_fails_with_the_fetch_command() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("m.toml");
    std::fs::write(&manifest, "[experiment]\nname = \"x\"\n\n[data]\ndir = \"nothing-here\"\n\n[[models]]\nname = \"m\"\narchitecture = \"gru\"\n").unwrap();
    let out = dir.path().join("results");
    let (ok, _, stderr) = tandem(&["run", manifest.to_str().unwrap(), "--offline", "--out", out.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("tandem data fetch"), "{stderr}");
}

#[test]
fn data_check_reports_a_missing_directory() {
    let (ok, _, stderr) = tandem(&["data", "check", "--dir", "/no/such/dir"]);
    assert!(!ok);
    assert!(stderr.contains("/no/such/dir"), "{stderr}");
}
