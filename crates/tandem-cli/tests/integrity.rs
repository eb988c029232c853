//! The results files `tandem` reads back are checked: a flipped bit, cut or appended bytes in
//! `checkpoint.bin`, `model.bin` or `vocab.json`, and a `manifest.toml` other than the one trained
//! with, are refused with the file named; run folders
//! written before files carried checksums (the fixture `before-checksums`, written by Tandem
//! 0.1.0 with `fixtures/before-checksums.toml`: one folder killed after its first epoch, one
//! finished) still resume and predict; what a killed writer leaves behind is cleaned up.

mod common;

use std::path::{Path, PathBuf};

use common::{data_dir, tandem};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
const RUN_ID: &str = "gru-sequential-seed3";
const TEXT: &str = "Stocks rallied as the central bank held rates";

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The fixture's manifest reading AG News from `data`, written to `dir`.
fn manifest(dir: &Path, data: &Path) -> PathBuf {
    let text = std::fs::read_to_string(Path::new(FIXTURES).join("before-checksums.toml")).unwrap();
    let path = dir.join("before-checksums.toml");
    std::fs::write(&path, text.replace("[data]\n", &format!("[data]\ndir = \"{}\"\n", data.display()))).unwrap();
    path
}

/// A copy of fixture folder `which` as the run folder under `out`, its recorded manifest
/// reading AG News from `data` (the one line that names a machine's path).
fn legacy_folder(which: &str, out: &Path, data: &Path) -> PathBuf {
    let dir = out.join("before-checksums").join(RUN_ID);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(Path::new(FIXTURES).join("before-checksums").join(which)).unwrap() {
        let from = entry.unwrap().path();
        std::fs::copy(&from, dir.join(from.file_name().unwrap())).unwrap();
    }
    let recorded = dir.join("manifest.toml");
    let text = std::fs::read_to_string(&recorded).unwrap();
    let line = text.lines().find(|l| l.starts_with("dir = ")).unwrap();
    std::fs::write(&recorded, text.replace(line, &format!("dir = \"{}\"", data.display()))).unwrap();
    dir
}

fn run(manifest: &Path, out: &Path) -> (bool, String) {
    let (ok, _, stderr) = tandem(&["run", s(manifest), "--offline", "--out", s(out)]);
    (ok, stderr)
}

/// `tandem predict`'s probability of `class` for [`TEXT`] with the run in `dir`.
fn predicted(dir: &Path, class: &str) -> Result<f64, String> {
    let (ok, stdout, stderr) = tandem(&["predict", s(dir), TEXT, "--json", "--backend", "ndarray"]);
    if !ok {
        return Err(stderr);
    }
    let rows: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    Ok(rows[0]["probabilities"][class].as_f64().unwrap())
}

fn flip_bit(path: &Path, byte: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = byte.min(bytes.len() - 1);
    bytes[at] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_folder_written_before_checksums_resumes_and_predicts() {
    let Some(data) = data_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    // Predicted by Tandem 0.1.0 with the finished folder: the same parameters load.
    let finished = Path::new(FIXTURES).join("before-checksums/finished");
    let business = predicted(&finished, "Business").unwrap();
    assert!((business - 0.542_374_670_505_523_7).abs() < 1e-5, "{business}");

    let out = tmp.path().join("out");
    let dir = legacy_folder("unfinished", &out, &data);
    let first = std::fs::read_to_string(dir.join("epochs.jsonl")).unwrap();
    let (ok, stderr) = run(&manifest(tmp.path(), &data), &out);
    assert!(ok && stderr.contains("resuming after 1 recorded epoch (or evaluation points)"), "{stderr}");
    let epochs = std::fs::read_to_string(dir.join("epochs.jsonl")).unwrap();
    assert_eq!(epochs.lines().count(), 6);
    assert!(epochs.starts_with(&first), "the recorded epoch is kept");
    assert!(std::fs::read(dir.join("model.bin")).unwrap().starts_with(b"TANDEMS1"), "the new model.bin is sealed");
    predicted(&dir, "Business").unwrap();
}

#[test]
fn damaged_results_files_are_refused_naming_the_file() {
    let Some(data) = data_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let manifest = manifest(tmp.path(), &data);
    let (ok, stderr) = run(&manifest, &out);
    assert!(ok, "{stderr}");
    let run = out.join("before-checksums").join(RUN_ID);
    let copy = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for file in ["manifest.toml", "vocab.json", "model.bin"] {
            std::fs::copy(run.join(file), dir.join(file)).unwrap();
        }
        dir
    };
    let size = std::fs::metadata(run.join("model.bin")).unwrap().len() as usize;
    for (name, byte) in [("header", 3), ("length", 10), ("middle", size / 2), ("last", size)] {
        let dir = copy(name);
        flip_bit(&dir.join("model.bin"), byte);
        let err = predicted(&dir, "Business").unwrap_err();
        assert!(err.contains("model.bin") && err.contains("restore model.bin"), "{name}: {err}");
    }
    let dir = copy("cut");
    std::fs::write(dir.join("model.bin"), &std::fs::read(run.join("model.bin")).unwrap()[..size - 100]).unwrap();
    let err = predicted(&dir, "Business").unwrap_err();
    assert!(err.contains("model.bin: it is truncated"), "{err}");
    let dir = copy("appended");
    let mut longer = std::fs::read(run.join("model.bin")).unwrap();
    longer.extend([0; 10]);
    std::fs::write(dir.join("model.bin"), longer).unwrap();
    let err = predicted(&dir, "Business").unwrap_err();
    assert!(err.contains("model.bin: 10 bytes were appended"), "{err}");
    let dir = copy("manifest");
    std::fs::copy(run.join("summary.json"), dir.join("summary.json")).unwrap();
    predicted(&dir, "Business").unwrap();
    let manifest_text = std::fs::read_to_string(dir.join("manifest.toml")).unwrap();
    std::fs::write(dir.join("manifest.toml"), manifest_text.replace("max_len = 12", "max_len = 13")).unwrap();
    let err = predicted(&dir, "Business").unwrap_err();
    assert!(err.contains("manifest.toml") && err.contains("manifest_hash"), "{err}");
    let dir = copy("vocab");
    let vocab = std::fs::read_to_string(dir.join("vocab.json")).unwrap();
    let token = vocab.lines().find(|l| l.trim_start().starts_with("\"said")).expect("a common token");
    std::fs::write(dir.join("vocab.json"), vocab.replacen(token, &token.replacen("said", "saic", 1), 1)).unwrap();
    let err = predicted(&dir, "Business").unwrap_err();
    assert!(err.contains("vocab.json") && err.contains("checksum"), "{err}");

    // A checkpoint as this build writes it (the fixture's, sealed), damaged.
    let fixture = Path::new(FIXTURES).join("before-checksums/unfinished/checkpoint.bin");
    let sealed = tandem_results::sealed::seal(&std::fs::read(fixture).unwrap());
    let damaged: [(&str, Vec<u8>); 3] = [
        ("checksum mismatch", sealed.iter().enumerate().map(|(i, b)| if i == 500 { b ^ 1 } else { *b }).collect()),
        ("is truncated", sealed[..sealed.len() - 1].to_vec()),
        ("bytes were appended", [sealed.as_slice(), b"x"].concat()),
    ];
    for (problem, bytes) in damaged {
        let out = tmp.path().join(problem);
        let dir = legacy_folder("unfinished", &out, &data);
        std::fs::write(dir.join("checkpoint.bin"), bytes).unwrap();
        let (ok, stderr) = self::run(&manifest, &out);
        assert!(!ok && stderr.contains("checkpoint.bin") && stderr.contains(problem), "{stderr}");
        assert!(stderr.contains("--fresh"), "{stderr}");
    }
    let out = tmp.path().join("sealed");
    let dir = legacy_folder("unfinished", &out, &data);
    std::fs::write(dir.join("checkpoint.bin"), sealed).unwrap();
    let (ok, stderr) = self::run(&manifest, &out);
    assert!(ok && stderr.contains("resuming after 1 recorded"), "{stderr}");
}

#[test]
fn what_a_killed_writer_leaves_is_cleaned_up() {
    let Some(data) = data_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let manifest = manifest(tmp.path(), &data);
    // Killed while writing the run folder's first file: only its temporary file is there.
    let out = tmp.path().join("first-write");
    let dir = out.join("before-checksums").join(RUN_ID);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(".manifest.toml.tmp-4000000"), "[experiment]\nna").unwrap();
    let (ok, stderr) = run(&manifest, &out);
    assert!(ok, "{stderr}");
    // Killed while writing a checkpoint and the vocabulary: their temporary files go.
    let out = tmp.path().join("later");
    let dir = legacy_folder("unfinished", &out, &data);
    std::fs::write(dir.join(".checkpoint.bin.tmp-4000000"), "half").unwrap();
    std::fs::write(dir.join(".tandem-tmp-Ab12Cd"), "half").unwrap();
    let (ok, stderr) = run(&manifest, &out);
    assert!(ok, "{stderr}");
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
}

#[test]
fn damaged_records_and_manifests_are_named_and_readable_records_kept() {
    let Some(data) = data_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let manifest = manifest(tmp.path(), &data);
    // A damaged line after the records the checkpoint holds: resumed, the line named.
    let out = tmp.path().join("trailing");
    let dir = legacy_folder("unfinished", &out, &data);
    let epochs = dir.join("epochs.jsonl");
    let first = std::fs::read_to_string(&epochs).unwrap();
    std::fs::write(&epochs, format!("{first}{{\"epoch\": 2, \"train_lo")).unwrap();
    let (ok, stderr) = run(&manifest, &out);
    assert!(
        ok && stderr.contains("epochs.jsonl line 2") && stderr.contains("resuming after the 1 records"),
        "{stderr}"
    );
    assert!(std::fs::read_to_string(&epochs).unwrap().starts_with(&first));
    // A damaged record the checkpoint needs: refused, the line named.
    let out = tmp.path().join("needed");
    let dir = legacy_folder("unfinished", &out, &data);
    std::fs::write(dir.join("epochs.jsonl"), "{\"epoch\": 1, \"train_lo\n").unwrap();
    let (ok, stderr) = run(&manifest, &out);
    assert!(!ok && stderr.contains("epochs.jsonl line 1") && stderr.contains("holds 1 records"), "{stderr}");
    // A garbled manifest.toml is named as damaged, not as a file that cannot be written.
    let out = tmp.path().join("garbled");
    let dir = legacy_folder("unfinished", &out, &data);
    std::fs::write(dir.join("manifest.toml"), [0xff, 0xfe, b'[', b'x']).unwrap();
    let (ok, stderr) = run(&manifest, &out);
    assert!(
        !ok && stderr.contains("manifest.toml: damaged (not UTF-8") && !stderr.contains("cannot write"),
        "{stderr}"
    );
    std::fs::write(dir.join("manifest.toml"), "[experiment\nname = ").unwrap();
    let (ok, stderr) = run(&manifest, &out);
    assert!(!ok && stderr.contains("manifest.toml: damaged (not TOML"), "{stderr}");
}
