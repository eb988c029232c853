//! The `tandem` binary: exit codes and messages a user sees.

mod common;

use common::{data_dir, tandem};

#[test]
fn list_names_the_compiled_backends() {
    let (ok, stdout, _) = tandem(&["list"]);
    assert!(ok);
    assert!(stdout.contains("flex     yes") && stdout.contains("ndarray  yes"), "{stdout}");
    for arch in ["cnn", "lstm", "gru", "transformer"] {
        assert!(stdout.contains(arch));
    }
    for kind in ["sequential", "data-parallel", "model-parallel", "predictive-sync", "local-learning"] {
        assert!(stdout.contains(&format!("\n  {kind} ")), "{kind} missing:\n{stdout}");
    }
    assert!(stdout.contains("pipeline schedules: naive, gpipe, 1f1b, interleaved-1f1b"), "{stdout}");
}

#[test]
fn validate_accepts_the_quickstart_and_names_the_bad_field_otherwise() {
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/../../experiments/quickstart.toml");
    let (ok, stdout, _) = tandem(&["validate", quickstart]);
    assert!(ok, "{stdout}");
    assert!(stdout.contains("4 models"), "{stdout}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[experiment]\nname = \"x\"\n\n[train]\nbatch_sise = 3\n\n[[models]]\nname = \"m\"\narchitecture = \"cnn\"\n",
    )
    .unwrap();
    let (ok, _, stderr) = tandem(&["validate", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("bad.toml") && stderr.contains("batch_sise") && stderr.contains("line 5"), "{stderr}");
}

#[test]
fn validate_refuses_what_a_run_would_fail_on_naming_the_field_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    let cases = [
        ("[train]\nweight_decay = nan\n", "train.weight_decay (line 5)"),
        ("[strategy]\nkind = \"model-parallel\"\nstages = 9\n", "strategy.stages (line 6)"),
        ("[data]\ndir = \"nothing-here\"\n", "data.dir (line 5)"),
        ("[data]\nvocab = { max_size = 1000, bogus = 1 }\n", "line 5"),
    ];
    for (section, needle) in cases {
        let text =
            format!("[experiment]\nname = \"x\"\n\n{section}\n[[models]]\nname = \"m\"\narchitecture = \"cnn\"\n");
        std::fs::write(&bad, text).unwrap();
        let (ok, _, stderr) = tandem(&["validate", bad.to_str().unwrap()]);
        assert!(!ok && stderr.contains("bad.toml") && stderr.contains(needle), "`{needle}` in {stderr}");
    }
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

#[test]
fn report_summarises_a_real_run_and_refuses_a_folder_without_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, stderr) = tandem(&["report", dir.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("no runs under"), "{stderr}");

    let Some(data) = data_dir() else { return };
    let manifest = dir.path().join("tiny.toml");
    std::fs::write(
        &manifest,
        format!(
            "[experiment]\nname = \"tiny\"\nseeds = [1, 2]\nbackend = \"ndarray\"\n\n[data]\ndir = \"{}\"\nmax_len = 12\nmax_train_rows = 128\nmax_holdout_rows = 64\nvocab = {{ max_size = 300, min_freq = 1 }}\n\n[train]\nepochs = 2\nbatch_size = 32\n\n[[strategies]]\nkind = \"sequential\"\n\n[[strategies]]\nkind = \"data-parallel\"\nreplicas = 2\n\n[[models]]\nname = \"cnn\"\narchitecture = \"cnn\"\nembedding_dim = 8\nfilters = 4\nkernel_widths = [2]\n",
            data.display()
        ),
    )
    .unwrap();
    let results = dir.path().join("results");
    let (ok, _, stderr) = tandem(&["run", manifest.to_str().unwrap(), "--offline", "--out", results.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let out = dir.path().join("report");
    let (ok, stdout, stderr) = tandem(&["report", results.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("4 finished runs reported (0 did not finish)"), "{stdout}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("| cnn | sequential |") && md.contains("| cnn | data-parallel-2x-tree |"), "{md}");
    assert!(md.contains("Machine: ") && md.contains("Backend: ndarray"), "{md}");
    assert!(md.contains("### Communication"), "{md}");
    for plot in ["speedup.svg", "accuracy-time.svg", "communication-accuracy.svg", "report.html"] {
        assert!(out.join(plot).is_file(), "{plot} missing");
    }
    assert!(!out.join("stage-time.svg").exists(), "no model-parallel run, no stage plot");
}

#[cfg(not(feature = "mpi"))]
#[test]
fn a_build_without_mpi_refuses_to_run_under_an_mpi_launcher() {
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/../../experiments/quickstart.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["run", quickstart, "--offline"])
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--features mpi"), "{stderr}");
}
