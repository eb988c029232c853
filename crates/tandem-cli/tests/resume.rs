//! Runs you can interrupt and resume: a rerun of a finished run does nothing, a changed
//! manifest is refused (or, asked to, only the changed runs start over), a run killed (SIGKILL) after an epoch or a stream's evaluation point,
//! or interrupted (SIGINT, SIGTERM) part-way through one, resumes to the same bytes as a run
//! never stopped, for every strategy kind, with dropout, on flex, from a checkpoint written whole
//! or patched with what changed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::{data_dir, tandem};

const SEQUENTIAL: &str = "kind = \"sequential\"";
const DATA_PARALLEL: &str = "kind = \"data-parallel\"\nreplicas = 2";
/// Cut explicitly: a balance by time measures each run anew, and the uninterrupted run this is
/// compared with might cut elsewhere (a resumed run cuts where its checkpoint says).
const MODEL_PARALLEL: &str =
    "kind = \"model-parallel\"\nstages = 2\ncuts = [1]\nschedule = \"1f1b\"\nmicro_batches = 4";
const PREDICTIVE_SYNC: &str = "kind = \"predictive-sync\"\nmodel_parallel = { stages = 2, cuts = [1], schedule = \"gpipe\", micro_batches = 2 }\npredictor = { kind = \"holt\" }\ntrigger = { kind = \"adaptive\" }\nreplay_batches = 2";
/// Local learning with compressed transfers (AQ-SGD copies), a replay buffer and an auxiliary
/// head: every kind of state a protocol keeps.
const LOCAL_LEARNING: &str = "kind = \"local-learning\"\nmodel_parallel = { stages = 2, cuts = [1], schedule = \"1f1b\", micro_batches = 2, compression = { activation_bits = 4, gradient_bits = 8, scheme = \"delta\" } }\ntrigger = { kind = \"periodic\", every = 4 }\ntransfer_every = 2\nlater_stages = { kind = \"replay\", buffer_batches = 2 }";
/// Stream mode: 2 passes over the rows, evaluated every 25 batches (checkpoints mid-pass).
const STREAM: &str = "stream = { eval_every = 25 }\n";

/// A manifest of one GRU run (with dropout) under `strategy`, `epochs` epochs over `rows` rows,
/// on flex; the `[train]` table ends with `train_extra`.
fn manifest(dir: &Path, data: &Path, strategy: &str, epochs: usize, rows: usize, train_extra: &str) -> PathBuf {
    let path = dir.join(format!("m-{epochs}-{rows}-{}-{}.toml", strategy.len(), train_extra.len()));
    let text = format!(
        "[experiment]\nname = \"resume\"\nseeds = [7]\nbackend = \"flex\"\n\n[data]\ndir = \"{}\"\nmax_len = 24\n\
         max_train_rows = {rows}\nmax_holdout_rows = 64\nvocab = {{ max_size = 2000, min_freq = 1 }}\n\n[train]\n\
         epochs = {epochs}\nbatch_size = 16\n{train_extra}\n[[strategies]]\n{strategy}\n\n[[models]]\nname = \"gru\"\n\
         architecture = \"gru\"\nembedding_dim = 16\nhidden = 32\n",
        data.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// The one run folder of the experiment under `out`.
fn run_dir(out: &Path) -> PathBuf {
    let experiment = out.join("resume");
    let mut runs: Vec<PathBuf> = std::fs::read_dir(&experiment).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(runs.len(), 1, "one run folder, no copies: {runs:?}");
    runs.pop().unwrap()
}

fn run_args(manifest: &Path, out: &Path) -> Vec<String> {
    ["run", manifest.to_str().unwrap(), "--offline", "--out", out.to_str().unwrap()].map(String::from).to_vec()
}

fn spawn(manifest: &Path, out: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(run_args(manifest, out))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the run under `out` has written `file` (its checkpoint, or its first epoch's
/// record); fails when the process ends first.
fn wait_for(child: &mut Child, out: &Path, file: &str) {
    let started = Instant::now();
    loop {
        let dir = out.join("resume");
        let found = std::fs::read_dir(&dir).ok().and_then(|mut d| d.next()).and_then(|e| e.ok()).map(|e| e.path());
        if found.is_some_and(|run| run.join(file).is_file()) {
            return;
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended before writing {file}");
        assert!(started.elapsed() < Duration::from_secs(300), "no checkpoint after 5 minutes");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Each record's results, without the timings (which differ from run to run).
fn results_of(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("epochs.jsonl")).unwrap();
    text.lines()
        .map(|line| {
            let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
            let record = v.as_object_mut().unwrap();
            for timing in ["train_seconds", "eval_seconds", "wall_seconds", "train_samples_per_second", "figures"] {
                record.remove(timing);
            }
            v
        })
        .collect()
}

fn summary_of(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// Every file of `dir` with its bytes and modification time.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>, SystemTime)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
            (path.clone(), std::fs::read(&path).unwrap(), modified)
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
}

#[test]
fn a_rerun_trains_nothing_a_changed_manifest_is_refused_and_identical_runs_write_identical_bytes() {
    let Some(data) = data_dir() else { return eprintln!("AG News not found: skipped") };
    let tmp = tempfile::tempdir().unwrap();
    let m = manifest(tmp.path(), &data, SEQUENTIAL, 2, 96, "");
    let out = tmp.path().join("out");
    let (ok, _, stderr) = tandem(&run_args(&m, &out).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{stderr}");
    let dir = run_dir(&out);
    assert!(!dir.join("checkpoint.bin").exists(), "a finished run keeps no checkpoint");
    assert!(summary_of(&dir)["manifest_hash"].is_string());
    let before = snapshot(&dir);

    let (ok, _, stderr) = tandem(&run_args(&m, &out).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{stderr}");
    assert!(stderr.contains("skipped") && !stderr.contains("epoch  1"), "{stderr}");
    assert_eq!(snapshot(&dir), before, "the rerun wrote nothing");
    run_dir(&out);

    let changed = manifest(tmp.path(), &data, SEQUENTIAL, 3, 96, "");
    let (ok, _, stderr) = tandem(&run_args(&changed, &out).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!ok && stderr.contains("another manifest") && stderr.contains("train.epochs"), "{stderr}");
    assert_eq!(snapshot(&dir), before, "the refused run wrote nothing");

    let lock = dir.join("run.lock");
    std::fs::write(&lock, format!("{}\n", std::process::id())).unwrap();
    let mut fresh = run_args(&m, &out);
    fresh.push("--fresh".into());
    let (ok, _, stderr) = tandem(&fresh.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!ok && stderr.contains("run.lock"), "a locked run is refused, naming the lock: {stderr}");
    std::fs::remove_file(&lock).unwrap();

    let (ok, _, stderr) = tandem(&fresh.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{stderr}");
    assert!(stderr.contains("epoch  2"), "--fresh trains again: {stderr}");
    let model = |files: &[(PathBuf, Vec<u8>, SystemTime)]| {
        files.iter().find(|f| f.0.ends_with("model.bin")).map(|f| f.1.clone()).unwrap()
    };
    assert!(model(&snapshot(&dir)) == model(&before), "two identical runs write identical model.bin bytes");
    assert_eq!(results_of(&dir).len(), 2);
}

#[test]
fn restart_changed_trains_again_only_the_runs_a_change_reaches() {
    let Some(data) = data_dir() else { return eprintln!("AG News not found: skipped") };
    let tmp = tempfile::tempdir().unwrap();
    let m = manifest(tmp.path(), &data, SEQUENTIAL, 1, 64, "");
    let mut text = std::fs::read_to_string(&m).unwrap();
    text.push_str("\n[[models]]\nname = \"other\"\narchitecture = \"gru\"\nembedding_dim = 8\nhidden = 8\n");
    std::fs::write(&m, text).unwrap();
    let out = tmp.path().join("out");
    let args = |extra: &[&str]| {
        let mut args = run_args(&m, &out);
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let run = |extra: &[&str]| tandem(&args(extra).iter().map(String::as_str).collect::<Vec<_>>());
    let (ok, _, stderr) = run(&[]);
    assert!(ok, "{stderr}");
    let folder = |model: &str| out.join("resume").join(format!("{model}-sequential-seed7"));
    let (gru, other) = (snapshot(&folder("gru")), snapshot(&folder("other")));

    let change = ["--set", "models.other.train.epochs=2"];
    let (ok, _, stderr) = run(&change);
    assert!(!ok && stderr.contains("--restart-changed") && stderr.contains("epochs"), "{stderr}");
    assert_eq!(snapshot(&folder("other")), other, "the refused run wrote nothing");

    let (ok, _, stderr) = run(&[&change[..], &["--restart-changed"]].concat());
    assert!(ok, "{stderr}");
    assert!(stderr.contains("starting it over"), "{stderr}");
    assert_eq!(snapshot(&folder("gru")), gru, "the run the change does not reach is kept as it was");
    assert_eq!(results_of(&folder("other")).len(), 2, "the changed run trained its two epochs");
}

/// Runs `strategy` uninterrupted, then again stopped by `stop` (which kills or signals the
/// process) once it wrote `file`, and runs it once more; the resumed run ends with the same
/// model bytes and records. Returns the stopped process's exit status, the stderr of the
/// stopped and the resumed process, and the results folder (kept, for the caller to look at).
fn stopped_and_resumed(
    strategy: &str,
    train_extra: &str,
    file: &str,
    stop: impl Fn(&mut Child),
) -> Option<(Option<i32>, String, PathBuf)> {
    let data = data_dir()?;
    let tmp = tempfile::tempdir().unwrap();
    let epochs = if train_extra.contains("stream") { 2 } else { 3 };
    let m = manifest(tmp.path(), &data, strategy, epochs, 1600, train_extra);
    let whole = tmp.path().join("whole");
    let (ok, _, stderr) = tandem(&run_args(&m, &whole).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{stderr}");

    let out = tmp.path().join("stopped");
    let mut child = spawn(&m, &out);
    wait_for(&mut child, &out, file);
    stop(&mut child);
    let stopped = child.wait_with_output().unwrap();
    let dir = run_dir(&out);
    let left = summary_of_if_any(&dir).map(|s| s["status"].clone());
    let (ok, _, resumed) = tandem(&run_args(&m, &out).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{resumed}");
    let (expected, got) = (run_dir(&whole), run_dir(&out));
    assert!(
        std::fs::read(expected.join("model.bin")).unwrap() == std::fs::read(got.join("model.bin")).unwrap(),
        "{strategy}: the resumed run ends with other parameters ({resumed})"
    );
    assert_eq!(results_of(&got), results_of(&expected), "{strategy}");
    assert_eq!(summary_of(&got)["status"], "finished");
    assert!(!got.join("checkpoint.bin").exists());
    let stderr = String::from_utf8_lossy(&stopped.stderr).into_owned();
    let keep = tmp.keep();
    Some((
        stopped.status.code(),
        format!("{stderr}\nsummary left: {left:?}\n--- resumed:\n{resumed}"),
        keep.join("stopped"),
    ))
}

fn summary_of_if_any(dir: &Path) -> Option<serde_json::Value> {
    dir.join("summary.json").is_file().then(|| summary_of(dir))
}

fn kill(child: &mut Child) {
    child.kill().unwrap();
}

fn killed_and_resumed(strategy: &str, train_extra: &str) {
    if let Some((status, stderr, out)) = stopped_and_resumed(strategy, train_extra, "checkpoint.bin", kill) {
        assert_eq!(status, None, "killed by a signal: {stderr}");
        assert!(stderr.contains("summary left: None"), "SIGKILL leaves no summary: {stderr}");
        assert!(stderr.contains("resuming after"), "{stderr}");
        let _ = std::fs::remove_dir_all(out.parent().unwrap());
    }
}

#[test]
fn a_killed_sequential_run_resumes_to_identical_bytes() {
    killed_and_resumed(SEQUENTIAL, "");
}

#[test]
fn a_killed_data_parallel_run_resumes_to_identical_bytes() {
    killed_and_resumed(DATA_PARALLEL, "");
}

#[test]
fn a_killed_model_parallel_run_resumes_to_identical_bytes() {
    killed_and_resumed(MODEL_PARALLEL, "");
}

#[test]
fn a_killed_predictive_sync_run_resumes_to_identical_bytes() {
    killed_and_resumed(PREDICTIVE_SYNC, "");
}

#[test]
fn a_killed_local_learning_run_in_stream_mode_resumes_to_identical_bytes() {
    killed_and_resumed(LOCAL_LEARNING, STREAM);
}

#[test]
fn a_checkpoint_costs_what_changed_and_a_run_killed_after_patches_resumes_to_identical_bytes() {
    // Evaluated every 5 batches: between two points a few batches' AQ-SGD copies change (and
    // the first pass adds copies of samples not seen before), while the model, its optimizer
    // and the head change every step.
    let often = "stream = { eval_every = 5 }\n";
    let Some((status, stderr, out)) = stopped_and_resumed(LOCAL_LEARNING, often, "checkpoint.bin.patch-1", kill) else {
        return;
    };
    assert_eq!(status, None, "killed by a signal: {stderr}");
    let whole = summary_of(&run_dir(&out.parent().unwrap().join("whole")));
    let writes = &whole["checkpoints"];
    let (written, bases) = (writes["written"].as_u64().unwrap(), writes["whole"].as_u64().unwrap());
    let (bytes, if_whole) = (writes["bytes"].as_u64().unwrap(), writes["bytes_if_whole"].as_u64().unwrap());
    assert!(written >= 4 && bases < written / 2, "{writes}");
    assert!(bytes * 3 < if_whole * 2, "patches save at least a third: {writes}");
    let _ = std::fs::remove_dir_all(out.parent().unwrap());
}

fn signal(name: &'static str) -> impl Fn(&mut Child) {
    move |child: &mut Child| {
        let sent = Command::new("kill").args([name, &child.id().to_string()]).status().unwrap();
        assert!(sent.success());
    }
}

#[test]
fn sigint_and_sigterm_write_an_interrupted_summary_and_exit_130_and_143() {
    for (name, code) in [("-INT", 130), ("-TERM", 143)] {
        let Some((status, stderr, out)) = stopped_and_resumed(SEQUENTIAL, "", "checkpoint.bin", signal(name)) else {
            return;
        };
        assert_eq!(status, Some(code), "{stderr}");
        assert!(stderr.contains("summary left: Some(String(\"interrupted\"))"), "{stderr}");
        assert!(stderr.contains("interrupted") && stderr.contains("resumes it"), "{stderr}");
        assert!(stderr.contains("resuming after"), "{stderr}");
        let _ = std::fs::remove_dir_all(out.parent().unwrap());
    }
}

/// Sends SIGINT a moment after the first checkpoint, within the next epoch or point.
fn interrupt_within_a_point(child: &mut Child) {
    std::thread::sleep(Duration::from_millis(10));
    signal("-INT")(child);
}

#[test]
fn a_signal_stops_every_strategy_kind_after_its_current_step_and_it_resumes_to_identical_bytes() {
    let kinds = [(DATA_PARALLEL, ""), (MODEL_PARALLEL, ""), (PREDICTIVE_SYNC, ""), (LOCAL_LEARNING, STREAM)];
    for (strategy, train_extra) in kinds {
        // A signal that lands while the holdout set is evaluated stops the run between two
        // points instead (also resumed exactly): try again, to see one part-way through.
        for attempt in 1..=3 {
            let Some((status, stderr, out)) =
                stopped_and_resumed(strategy, train_extra, "checkpoint.bin", interrupt_within_a_point)
            else {
                return;
            };
            let _ = std::fs::remove_dir_all(out.parent().unwrap());
            assert_eq!(status, Some(130), "{stderr}");
            if stderr.contains("steps of the next; `tandem run") {
                assert!(stderr.contains("resuming after") && stderr.contains("steps of the next\n"), "{stderr}");
                break;
            }
            assert!(attempt < 3, "{strategy}: never stopped part-way through a point: {stderr}");
        }
    }
}

#[test]
fn data_parallel_runs_with_dropout_repeat_bit_for_bit_on_a_cpu() {
    let Some(data) = data_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let m = manifest(tmp.path(), &data, DATA_PARALLEL, 1, 256, "");
    let model = |out: &str| {
        let out = tmp.path().join(out);
        let (ok, _, stderr) = tandem(&run_args(&m, &out).iter().map(String::as_str).collect::<Vec<_>>());
        assert!(ok, "{stderr}");
        assert_eq!(summary_of(&run_dir(&out))["reproducibility"], serde_json::Value::Null);
        std::fs::read(run_dir(&out).join("model.bin")).unwrap()
    };
    assert!(model("first") == model("second"), "two identical data-parallel runs with dropout differ");
}

#[test]
fn runs_on_ndarray_repeat_bit_for_bit() {
    let Some(data) = data_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for strategy in [SEQUENTIAL, MODEL_PARALLEL] {
        let m = manifest(tmp.path(), &data, strategy, 1, 256, "");
        let model = |out: &str| {
            let out = tmp.path().join(out);
            let mut args = run_args(&m, &out);
            args.extend(["--backend".into(), "ndarray".into()]);
            let (ok, _, stderr) = tandem(&args.iter().map(String::as_str).collect::<Vec<_>>());
            assert!(ok, "{stderr}");
            std::fs::read(run_dir(&out).join("model.bin")).unwrap()
        };
        let label = strategy.len();
        assert!(model(&format!("a{label}")) == model(&format!("b{label}")), "{strategy}: two runs on ndarray differ");
    }
}
