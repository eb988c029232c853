//! Manifest parsing: defaults, overrides and errors that name the field and line.

use std::path::Path;

use tandem_experiment::{BackendKind, Manifest};
use tandem_models::ModelConfig;

const MINIMAL: &str = r#"
[experiment]
name = "demo"

[train]
epochs = 3
learning_rate = 0.002

[[models]]
name = "cnn"
architecture = "cnn"

[[models]]
name = "lstm"
architecture = "lstm"
hidden = 32
train = { learning_rate = 0.01 }
"#;

fn parse(text: &str) -> Result<Manifest, String> {
    Manifest::parse(text, Path::new("experiments/demo.toml")).map_err(|e| e.to_string())
}

#[test]
fn a_minimal_manifest_gets_defaults_and_per_model_overrides() {
    let m = parse(MINIMAL).unwrap();
    assert_eq!(m.experiment.seeds, vec![42]);
    assert_eq!(m.experiment.backend, BackendKind::Flex);
    assert_eq!(m.strategies[0].name(), "sequential");
    assert_eq!(m.models[0].train.learning_rate, 0.002);
    assert_eq!(m.models[1].train.learning_rate, 0.01);
    assert_eq!(m.models[1].train.epochs, 3, "overrides keep the other [train] values");
    assert!(matches!(&m.models[1].config, ModelConfig::Lstm(c) if c.hidden == 32));
    assert_eq!(m.models[0].train.stream, None, "epochs unless `stream` is set");
    let m = parse(&MINIMAL.replace("epochs = 3", "epochs = 3\nstream = { eval_every = 25 }")).unwrap();
    assert_eq!(
        m.models[1].train.stream,
        Some(tandem_train::StreamConfig { eval_every: 25 }),
        "per-model overrides keep the stream"
    );
}

#[test]
fn the_resolved_manifest_round_trips_through_toml() {
    let m = parse(MINIMAL).unwrap();
    let one = m.for_run(&m.models[1], &m.strategies[0], 7);
    let text = one.to_toml();
    let back = parse(&text).unwrap();
    assert_eq!(back.models, one.models);
    assert_eq!(back.experiment.seeds, vec![7]);
}

fn error_of(text: &str) -> String {
    parse(text).unwrap_err()
}

#[test]
fn unknown_keys_are_rejected_with_their_name_and_line() {
    let e = error_of(&MINIMAL.replace("epochs = 3", "epochs = 3\nepoch = 4"));
    assert!(e.contains("experiments/demo.toml") && e.contains("epoch") && e.contains("line 7"), "{e}");
    let e = error_of(&MINIMAL.replace("hidden = 32", "hiden = 32"));
    assert!(e.contains("models[1]") && e.contains("lstm") && e.contains("hiden"), "{e}");
    let e = error_of(&MINIMAL.replace("train = { learning_rate = 0.01 }", "train = { learning_rat = 0.01 }"));
    assert!(e.contains("models[1]") && e.contains("learning_rat"), "{e}");
    let e = error_of(&MINIMAL.replace("[experiment]", "[experiment]\ncolour = 1"));
    assert!(e.contains("colour"), "{e}");
    let e = error_of(&format!("{MINIMAL}\n[cluster]\nnodes = 2\n"));
    assert!(e.contains("nodes") && e.contains("line"), "{e}");
    let e = error_of(&format!("{MINIMAL}\n[cluster]\nranks = 0\n"));
    assert!(e.contains("[cluster] ranks"), "{e}");
}

#[test]
fn bad_values_name_their_field() {
    let cases = [
        (MINIMAL.replace("epochs = 3", "epochs = 0"), "epochs"),
        (MINIMAL.replace("epochs = 3", "epochs = -1"), "epochs"),
        (MINIMAL.replace("architecture = \"cnn\"", "architecture = \"rnn\""), "rnn"),
        (MINIMAL.replace("name = \"demo\"", "name = \"a b\""), "name"),
        (MINIMAL.replace("name = \"lstm\"", "name = \"cnn\""), "used twice"),
        (MINIMAL.replace("name = \"demo\"", "name = \"demo\"\nbackend = \"tpu\""), "tpu"),
        (MINIMAL.replace("name = \"demo\"", "name = \"demo\"\nbackend = \"flex\"\ndevices = [\"cuda:0\"]"), "cuda:0"),
        (format!("{MINIMAL}\n[data]\nholdout_fraction = 1.5\n"), "holdout_fraction"),
        (format!("{MINIMAL}\n[strategy]\nkind = \"pipeline\"\n"), "pipeline"),
        (MINIMAL.replace("hidden = 32", "hidden = 0"), "hidden"),
        (MINIMAL.replace("epochs = 3", "epochs = 3\nstream = { eval_every = 0 }"), "stream.eval_every"),
        (MINIMAL.replace("epochs = 3", "epochs = 3\nstream = { every = 5 }"), "every"),
    ];
    for (text, needle) in cases {
        let e = error_of(&text);
        assert!(e.contains(needle), "expected `{needle}` in: {e}");
    }
}

#[test]
fn a_missing_file_is_named() {
    let e = Manifest::load(Path::new("no/such/manifest.toml")).unwrap_err().to_string();
    assert!(e.contains("no/such/manifest.toml"), "{e}");
}

#[test]
fn the_shipped_manifests_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Manifest::load(&path).unwrap_or_else(|e| panic!("{e}"));
            count += 1;
        }
    }
    assert!(count >= 1);
}

#[test]
fn several_strategies_are_listed_and_checked() {
    let text = format!(
        "{MINIMAL}\n[[strategies]]\nkind = \"sequential\"\n\n[[strategies]]\nkind = \"data-parallel\"\nreplicas = 4\nall_reduce = \"ring\"\n"
    );
    let m = parse(&text).unwrap();
    let labels: Vec<String> = m.strategies.iter().map(|s| s.label()).collect();
    assert_eq!(labels, ["sequential", "data-parallel-4x-ring"]);
    assert_eq!(m.strategies[1].num_devices(), 4);

    let e = error_of(&text.replace("replicas = 4", "replicas = 0"));
    assert!(e.contains("strategies[1]") && e.contains("replicas"), "{e}");
    let e = error_of(&text.replace("all_reduce = \"ring\"", "all_reduce = \"butterfly\""));
    assert!(e.contains("butterfly") && e.contains("line"), "{e}");
    let e = error_of(&format!("{text}\n[strategy]\nkind = \"sequential\"\n"));
    assert!(e.contains("not both"), "{e}");
    let e = error_of(&text.replace("replicas = 4", "replicas = 4\nbucket_mb = -1"));
    assert!(e.contains("bucket_mb"), "{e}");
}

#[test]
fn model_parallel_settings_are_read_and_checked() {
    let text = format!(
        "{MINIMAL}\n[[strategies]]\nkind = \"model-parallel\"\nstages = 2\nschedule = \"1f1b\"\nmicro_batches = 4\ninterconnect = \"10gbe\"\n"
    );
    let m = parse(&text).unwrap();
    assert_eq!(m.strategies[0].label(), "model-parallel-2s-1f1b-4m-10gbe");
    assert_eq!(m.strategies[0].num_devices(), 2);
    let custom = text.replace("\"10gbe\"", "{ latency_us = 20, bandwidth_gb_s = 3 }");
    assert_eq!(parse(&custom).unwrap().strategies[0].label(), "model-parallel-2s-1f1b-4m-custom");

    let e = error_of(&text.replace("micro_batches = 4", "micro_batches = 0"));
    assert!(e.contains("strategies[0]") && e.contains("micro_batches"), "{e}");
    let e = error_of(&text.replace("stages = 2", "stages = 2\ncuts = [1, 2]"));
    assert!(e.contains("cuts"), "{e}");
    let e = error_of(&text.replace("\"1f1b\"", "\"zigzag\""));
    assert!(e.contains("zigzag") && e.contains("line"), "{e}");
    let e = error_of(&text.replace("\"10gbe\"", "\"carrier-pigeon\""));
    assert!(e.contains("interconnect"), "{e}");
}

#[test]
fn predictive_sync_settings_are_read_and_checked() {
    let text = format!(
        "{MINIMAL}\n[[strategies]]\nkind = \"predictive-sync\"\nmodel_parallel = {{ stages = 2, schedule = \"gpipe\", micro_batches = 4, interconnect = \"1gbe\" }}\npredictor = {{ kind = \"holt\", alpha = 0.4 }}\ntrigger = {{ kind = \"periodic\", every = 10 }}\n"
    );
    let m = parse(&text).unwrap();
    // A setting off its default is part of the name, so one predictor can run with several.
    assert_eq!(m.strategies[0].label(), "predictive-sync-holt-alpha0.4-periodic10-2s-gpipe-4m-1gbe");
    let two = parse(&format!("{text}\n{}", text[MINIMAL.len()..].replace("alpha = 0.4", "alpha = 0.5"))).unwrap();
    assert_eq!(two.strategies[1].label(), "predictive-sync-holt-periodic10-2s-gpipe-4m-1gbe");
    assert_eq!(m.strategies[0].num_devices(), 2);
    let e = error_of(&text.replace("every = 10", "every = 0"));
    assert!(e.contains("strategies[0]") && e.contains("every"), "{e}");
    let e = error_of(&text.replace("alpha = 0.4", "alpha = 2.0"));
    assert!(e.contains("alpha"), "{e}");
    let e = error_of(&text.replace("\"holt\"", "\"oracle\""));
    assert!(e.contains("oracle"), "{e}");
    let e = error_of(&text.replace("micro_batches = 4", "micro_batches = 0"));
    assert!(e.contains("model_parallel") && e.contains("micro_batches"), "{e}");
    let replay = parse(&format!("{text}replay_batches = 3\n")).unwrap();
    assert_eq!(replay.strategies[0].label(), "predictive-sync-holt-alpha0.4-periodic10-replay3-2s-gpipe-4m-1gbe");
    let e = error_of(&format!("{text}replay_batches = 5000\n"));
    assert!(e.contains("strategies[0]") && e.contains("replay_batches"), "{e}");
}
