//! Manifest parsing: defaults, overrides and errors that name the field and line.

use std::path::Path;

use tandem_experiment::runner::RunError;
use tandem_experiment::{BackendKind, Manifest, Override};
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
    let text = format!("{MINIMAL}\n[cluster]\nranks = 0\n");
    assert_names(&text, "cluster.ranks", "ranks = 0");
    let text = format!("{MINIMAL}\n[cluster]\nlaunch = \"local\"\n");
    assert_names(&text, "cluster.launch", "launch = ");
    let e = error_of(&format!("{MINIMAL}\n[cluster]\nranks = 2\nlaunch = \"ssh\"\n"));
    assert!(e.contains("ssh") && e.contains("local"), "{e}");
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
fn every_strategy_kind_names_itself_as_its_manifest_does() {
    for (kind, _) in tandem_experiment::manifest::reference::strategy_kinds() {
        let m = parse(&format!("{MINIMAL}\n[strategy]\nkind = \"{kind}\"\n")).unwrap();
        let strategy = &m.strategies[0];
        assert_eq!(strategy.name(), kind, "the kind's name is its `kind = …`");
        assert_eq!(strategy.kind().devices(), strategy.num_devices());
        let stages = strategy.kind().model_parallel().map(|(mp, _)| mp.stages);
        assert_eq!(stages, strategy.stages(), "{kind}");
        assert_eq!(strategy.kind().spans_ranks(), kind != "sequential", "{kind}");
        strategy.kind().validate().unwrap();
    }
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

/// The 1-based line of `text` that contains `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("`{needle}` not in the text")) + 1
}

/// `text` is refused with an error naming the file, `field` and the line that contains `at`.
fn assert_names(text: &str, field: &str, at: &str) -> String {
    assert_names_line(text, field, line_of(text, at))
}

/// `text` is refused with an error naming the file, `field` and `line`.
fn assert_names_line(text: &str, field: &str, line: usize) -> String {
    let e = error_of(text);
    let line = format!("line {line}");
    assert!(e.contains("experiments/demo.toml") && e.contains(field) && e.contains(&line), "`{field}`, {line}: {e}");
    e
}

const MODEL_PARALLEL: &str = "\n[[strategies]]\nkind = \"model-parallel\"\nstages = 2\nmicro_batches = 4\n";

#[test]
fn unknown_keys_inside_inline_tables_are_rejected() {
    assert_names(&format!("{MINIMAL}\n[data]\nvocab = {{ max_size = 100, bogus = 1 }}\n"), "bogus", "bogus");
    let custom = "interconnect = { latency_us = 5, bandwidth_gb_s = 1, bogus = 2 }";
    assert_names(&format!("{MINIMAL}{MODEL_PARALLEL}{custom}\n"), "interconnect", "bogus");
    let sync = "\n[[strategies]]\nkind = \"predictive-sync\"\n";
    for table in [
        "predictor = { kind = \"static\", bogus = 1 }",
        "predictor = { kind = \"holt\", alpha = 0.4, bogus = 1 }",
        "trigger = { kind = \"periodic\", every = 4, bogus = 1 }",
        "model_parallel = { stages = 2, bogus = 1 }",
    ] {
        assert_names(&format!("{MINIMAL}{sync}{table}\n"), "bogus", "bogus");
    }
    assert_names(
        &MINIMAL.replace("epochs = 3", "epochs = 3\nstream = { eval_every = 5, bogus = 1 }"),
        "bogus",
        "bogus",
    );
    assert_names(&MINIMAL.replace("hidden = 32", "hidden = 32\nbogus = 1"), "models[1].bogus", "bogus");
}

#[test]
fn micro_batches_above_the_batch_size_are_refused_with_both_values() {
    let text = format!("{MINIMAL}{MODEL_PARALLEL}").replace("micro_batches = 4", "micro_batches = 100");
    let e = assert_names(&text, "strategies[0].micro_batches", "micro_batches = 100");
    assert!(e.contains("100") && e.contains("batch size 64"), "{e}");
    let one_model = MINIMAL.replace("train = { learning_rate = 0.01 }", "train = { batch_size = 2 }");
    let e = assert_names(&format!("{one_model}{MODEL_PARALLEL}"), "strategies[0].micro_batches", "micro_batches = 4");
    assert!(e.contains("batch size 2") && e.contains("`lstm`"), "{e}");
    let naive = text.replace("micro_batches = 100", "micro_batches = 100\nschedule = \"naive\"");
    parse(&naive).expect("the naive schedule runs one micro-batch");
    let single =
        format!("{MINIMAL}\n[strategy]\nkind = \"predictive-sync\"\nmodel_parallel = {{ micro_batches = 65 }}\n");
    assert_names(&single, "strategy.model_parallel.micro_batches", "micro_batches = 65");
}

#[test]
fn stages_and_cuts_must_fit_every_models_blocks() {
    let text = format!("{MINIMAL}{MODEL_PARALLEL}");
    let e = assert_names(&text.replace("stages = 2", "stages = 4"), "strategies[0].stages", "stages = 4");
    assert!(e.contains("`cnn`") && e.contains("3 blocks"), "{e}");
    let three = text.replace("stages = 2", "stages = 3");
    parse(&three).expect("3 stages fit CNN and a one-layer LSTM");
    let e = assert_names(&text.replace("stages = 2", "stages = 2\ncuts = [3]"), "strategies[0].cuts[0]", "cuts");
    assert!(e.contains("cut 3"), "{e}");
    assert_names(&text.replace("stages = 2", "stages = 2\ncuts = [0]"), "strategies[0].cuts[0]", "cuts");
    let e = assert_names(&three.replace("stages = 3", "stages = 3\ncuts = [2, 1]"), "strategies[0].cuts[1]", "cuts");
    assert!(e.contains("strictly increasing"), "{e}");
    assert_names(&three.replace("stages = 3", "stages = 3\ncuts = [1, 1]"), "strategies[0].cuts[1]", "cuts");
    let deep = MINIMAL
        .replace("hidden = 32", "hidden = 32\nlayers = 3")
        .replace("name = \"cnn\"\narchitecture = \"cnn\"", "name = \"gru\"\narchitecture = \"gru\"\nlayers = 3");
    parse(&format!("{deep}{MODEL_PARALLEL}").replace("stages = 2", "stages = 5\ncuts = [1, 2, 3, 4]")).unwrap();
}

#[test]
fn duplicate_seeds_are_refused() {
    let text = MINIMAL.replace("name = \"demo\"", "name = \"demo\"\nseeds = [1, 2, 1]");
    let e = assert_names(&text, "experiment.seeds[2]", "seeds");
    assert!(e.contains("seed 1"), "{e}");
}

#[test]
fn zero_row_limits_are_refused() {
    for field in ["max_train_rows", "max_holdout_rows"] {
        assert_names(&format!("{MINIMAL}\n[data]\n{field} = 0\n"), &format!("data.{field}"), field);
    }
}

#[test]
fn non_finite_numbers_are_refused_wherever_they_are() {
    let cases = [
        (MINIMAL.replace("epochs = 3", "epochs = 3\nweight_decay = nan"), "train.weight_decay", "weight_decay"),
        (MINIMAL.replace("learning_rate = 0.002", "learning_rate = inf"), "train.learning_rate", "learning_rate"),
        (MINIMAL.replace("hidden = 32", "hidden = 32\ndropout = -inf"), "models[1].dropout", "dropout"),
        (MINIMAL.replace("0.01 }", "nan }"), "models[1].train.learning_rate", "nan }"),
        (format!("{MINIMAL}\n[data]\nholdout_fraction = nan\n"), "data.holdout_fraction", "holdout_fraction"),
        (
            format!("{MINIMAL}{MODEL_PARALLEL}interconnect = {{ latency_us = nan, bandwidth_gb_s = 1 }}\n"),
            "strategies[0].interconnect.latency_us",
            "latency_us",
        ),
        (
            format!("{MINIMAL}\n[[strategies]]\nkind = \"predictive-sync\"\npredictor = {{ kind = \"ema\", alpha = nan }}\n"),
            "strategies[0].predictor.alpha",
            "alpha",
        ),
        (
            format!("{MINIMAL}\n[[strategies]]\nkind = \"predictive-sync\"\n\n[strategies.trigger]\nkind = \"budget\"\nfraction = inf\n"),
            "strategies[0].trigger.fraction",
            "fraction",
        ),
    ];
    for (text, field, at) in cases {
        let e = assert_names(&text, field, at);
        assert!(e.contains("finite"), "{e}");
    }
}

#[test]
fn a_data_directory_the_manifest_names_must_exist() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.toml");
    let text = format!("{MINIMAL}\n[data]\ndir = \"nothing-here\"\n");
    std::fs::write(&path, &text).unwrap();
    Manifest::load(&path).expect("`tandem run` fetches the data into the named directory");
    let e = Manifest::load_and_check_paths(&path).unwrap_err().to_string();
    let line = format!("line {}", line_of(&text, "nothing-here"));
    let resolved = std::path::absolute(dir.path().join("nothing-here")).unwrap();
    assert!(e.contains("m.toml") && e.contains("data.dir") && e.contains(&line), "{e}");
    assert!(e.contains(&resolved.display().to_string()), "{e}");

    std::fs::create_dir(dir.path().join("nothing-here")).unwrap();
    Manifest::load_and_check_paths(&path).unwrap();
    std::fs::write(&path, MINIMAL).unwrap();
    Manifest::load_and_check_paths(&path).expect("the default directory may be fetched by `tandem run`");
}

#[test]
fn the_official_split_without_train_csv_is_refused_before_any_run() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("ag_news");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("test.csv"), "\"1\",\"t\",\"d\"\n").unwrap();
    let path = dir.path().join("m.toml");
    let text = format!("{MINIMAL}\n[data]\ndir = \"ag_news\"\nsplit = \"official\"\n");
    std::fs::write(&path, &text).unwrap();
    let e = Manifest::load_and_check_paths(&path).unwrap_err().to_string();
    let line = format!("line {}", line_of(&text, "split = "));
    assert!(e.contains("m.toml") && e.contains("data.split") && e.contains(&line), "{e}");
    assert!(e.contains("no train.csv") && e.contains("tandem data fetch"), "{e}");

    for split in ["resplit", "auto"] {
        std::fs::write(&path, text.replace("\"official\"", &format!("\"{split}\""))).unwrap();
        Manifest::load_and_check_paths(&path).unwrap();
    }
    std::fs::write(&path, text.replace("\"official\"", "\"full\"")).unwrap();
    let e = Manifest::load(&path).unwrap_err().to_string();
    assert!(e.contains("official") && e.contains("resplit"), "{e}");
}

#[test]
fn models_too_large_to_train_are_refused_with_the_estimate() {
    // Reported at the entry's `[[models]]` header, the line above its name.
    let cases = [
        (
            MINIMAL.replace("architecture = \"cnn\"", "architecture = \"cnn\"\nembedding_dim = 1000000000"),
            "models[0]",
            "name = \"cnn\"",
        ),
        (MINIMAL.replace("hidden = 32", "hidden = 1000000"), "models[1]", "name = \"lstm\""),
        (format!("{MINIMAL}\n[data]\nvocab = {{ max_size = 1000000000000 }}\n"), "models[0]", "name = \"cnn\""),
    ];
    for (text, field, name) in cases {
        let e = assert_names_line(&text, field, line_of(&text, name) - 1);
        assert!(e.contains("parameters") && e.contains("GiB") && e.contains("64.0 GiB"), "{e}");
    }
    let transformer = "\n[[models]]\nname = \"t\"\narchitecture = \"transformer\"\nd_model = 4000000\nheads = 1\n";
    let text = format!("{MINIMAL}{transformer}");
    assert_names_line(&text, "models[2]", line_of(&text, "name = \"t\"") - 1);
    let replicas = "\n[[strategies]]\nkind = \"data-parallel\"\nreplicas = 64\n";
    let big = MINIMAL.replace("architecture = \"cnn\"", "architecture = \"cnn\"\nembedding_dim = 10000");
    parse(&big).expect("one copy fits");
    let e = assert_names_line(&format!("{big}{replicas}"), "models[0]", line_of(&big, "name = \"cnn\"") - 1);
    assert!(e.contains("64 replicas"), "{e}");
}

#[test]
fn range_errors_name_the_field_and_its_line() {
    let mp = format!("{MINIMAL}\n[[strategies]]\nkind = \"data-parallel\"\nreplicas = 0\n");
    assert_names(&mp, "strategies[0].replicas", "replicas = 0");
    assert_names(&MINIMAL.replace("epochs = 3", "epochs = 0"), "train.epochs", "epochs = 0");
    assert_names(&MINIMAL.replace("hidden = 32", "hidden = 0"), "models[1].hidden", "hidden = 0");
    let e = assert_names(&MINIMAL.replace("0.01 }", "-1.0 }"), "models[1].train.learning_rate", "-1.0 }");
    assert!(e.contains("`lstm`"), "{e}");
    assert_names(&format!("{MINIMAL}\n[data]\nholdout_fraction = 1.5\n"), "data.holdout_fraction", "1.5");
    assert_names(&MINIMAL.replace("name = \"lstm\"", "name = \"cnn\" "), "models[1].name", "name = \"cnn\" ");
    let sync = format!(
        "{MINIMAL}\n[[strategies]]\nkind = \"predictive-sync\"\ntrigger = {{ kind = \"periodic\", every = 0 }}\n"
    );
    assert_names(&sync, "strategies[0].trigger.every", "every = 0");
    let timeout = format!("{MINIMAL}{MODEL_PARALLEL}timeout_seconds = -1\n");
    assert_names(&timeout, "strategies[0].timeout_seconds", "timeout_seconds");
    let devices = MINIMAL.replace("name = \"demo\"", "name = \"demo\"\ndevices = [\"cpu\", \"tpu:0\"]");
    assert_names(&devices, "experiment.devices[1]", "devices");
}

#[test]
fn local_learning_and_compression_settings_are_read_and_checked() {
    let text = format!(
        "{MINIMAL}\n[[strategies]]\nkind = \"local-learning\"\nmodel_parallel = {{ stages = 2, cuts = [1], micro_batches = 4, interconnect = \"1gbe\", compression = {{ activation_bits = 4, gradient_bits = 8, scheme = \"delta\" }} }}\ntrigger = {{ kind = \"periodic\", every = 56 }}\ntransfer_every = 8\nlater_stages = {{ kind = \"predict\", predictor = {{ kind = \"static\" }} }}\n"
    );
    let m = parse(&text).unwrap();
    assert_eq!(m.strategies[0].label(), "local-linear-static-periodic56-t8-2s-cuts1-gpipe-4m-1gbe-a4g8-delta");
    assert_eq!(m.strategies[0].name(), "local-learning");
    // Bits that no codec encodes, a trigger that reads what local learning lacks, an unknown key.
    let e = error_of(&text.replace("activation_bits = 4", "activation_bits = 3"));
    assert!(e.contains("activation_bits") && e.contains("line"), "{e}");
    let e = error_of(&text.replace("kind = \"periodic\", every = 56", "kind = \"safe-zone\""));
    assert!(e.contains("safe-zone") && e.contains("trigger"), "{e}");
    let replaying = text.replace("kind = \"predict\", predictor = { kind = \"static\" }", "kind = \"replay\"");
    let e = error_of(&replaying.replace("kind = \"periodic\", every = 56", "kind = \"adaptive\""));
    assert!(e.contains("adaptive") && e.contains("predict"), "{e}");
    assert_names(&text.replace("transfer_every = 8", "transfer_every = 8\naux_hed = 1"), "aux_hed", "aux_hed = 1");
    let e = error_of(&text.replace("stages = 2, cuts = [1]", "stages = 1"));
    assert!(e.contains("at least 2 stages"), "{e}");
    // The local-loss trigger belongs to local learning.
    let sync =
        format!("{MINIMAL}\n[[strategies]]\nkind = \"predictive-sync\"\ntrigger = {{ kind = \"local-loss\" }}\n");
    assert!(error_of(&sync).contains("local-loss"));
}

/// `tandem validate FILE --set …`'s reading of `text` written to a file, as the error message.
fn error_with_sets(text: &str, sets: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.toml");
    std::fs::write(&path, text).unwrap();
    let sets: Vec<Override> = sets.iter().map(|s| s.parse().unwrap()).collect();
    let e = Manifest::load_with(&path, &sets).unwrap_err().to_string();
    assert!(e.contains("demo.toml"), "{e}");
    e
}

#[test]
fn epochs_and_sequence_lengths_past_their_limits_are_refused() {
    let e = assert_names(&MINIMAL.replace("epochs = 3", "epochs = 1000000000000"), "train.epochs", "epochs = ");
    assert!(e.contains("at most 100000") && e.contains("epochs.jsonl"), "{e}");
    let e = assert_names(&MINIMAL.replace("0.01 }", "0.01, epochs = 100001 }"), "models[1].train.epochs", "100001");
    assert!(e.contains("`lstm`"), "{e}");
    parse(&MINIMAL.replace("epochs = 3", "epochs = 100000")).expect("the limit itself is allowed");
    for epochs in ["1000000000000", "1000000000000000000"] {
        let e = error_with_sets(MINIMAL, &[&format!("train.epochs={epochs}")]);
        assert!(e.contains(&format!("--set train.epochs={epochs}: train.epochs: `epochs` must be at most")), "{e}");
    }

    let e = assert_names(&format!("{MINIMAL}\n[data]\nmax_len = 4097\n"), "data.max_len", "max_len");
    assert!(e.contains("at most 4096") && e.contains("4097"), "{e}");
    parse(&format!("{MINIMAL}\n[data]\nmax_len = 4096\n")).expect("the limit itself is allowed");
    let e = error_with_sets(MINIMAL, &["data.max_len=100000000"]);
    assert!(e.contains("--set data.max_len=100000000: data.max_len: must be at most 4096"), "{e}");
}

#[test]
fn more_data_parallel_replicas_than_batch_rows_are_refused() {
    let dp = |replicas: usize| format!("\n[[strategies]]\nkind = \"data-parallel\"\nreplicas = {replicas}\n");
    let small = MINIMAL.replace("train = { learning_rate = 0.01 }", "train = { batch_size = 32 }");
    let text = format!("{small}{}", dp(33));
    let e = assert_names(&text, "strategies[0].replicas", "replicas = 33");
    assert!(e.contains("33 replicas exceed the batch size 32 of model `lstm`"), "{e}");
    parse(&format!("{small}{}", dp(32))).expect("one sample a replica");
    // In a job, every rank's replicas take a shard.
    let e = assert_names(&format!("{small}{}\n[cluster]\nranks = 9\n", dp(4)), "strategies[0].replicas", "replicas");
    assert!(e.contains("4 replicas × 9 ranks = 36 shards"), "{e}");
    let e = error_with_sets(&format!("{MINIMAL}{}", dp(4)), &["models.lstm.train.batch_size=2"]);
    assert!(
        e.contains("--set models.lstm.train.batch_size=2") && e.contains("4 replicas exceed the batch size 2"),
        "{e}"
    );
}

#[test]
fn an_error_from_a_set_names_the_set_not_a_line() {
    // At the field the override sets: no line of the file, which does not hold the value.
    let cases = [
        ("train.epochs=0", "train.epochs: `epochs` must be at least 1"),
        ("data.max_len=-1", "data.max_len: invalid value: integer `-1`"),
        ("train.epocs=3", "train.epocs: unknown field `epocs`"),
        ("train.learning_rate=nan", "train.learning_rate: must be a finite number"),
        ("models.lstm.hidden=2.5", "models[1].hidden: model `lstm`: invalid type: floating point `2.5`"),
        ("models.0.train.batch_size=0", "models[0].train.batch_size: model `cnn`: `batch_size` must be at least 1"),
        ("strategy.kind=pipeline", "strategy.kind"),
    ];
    for (set, expected) in cases {
        let e = error_with_sets(MINIMAL, &["data.split_seed=7", set]);
        assert!(e.contains(&format!("--set {set}: {expected}")), "`{set}`: {e}");
        assert!(!e.contains("(line") && !e.contains("split_seed"), "`{set}`: {e}");
    }
    // Elsewhere, the line of the file, and which override made it fail.
    let e = error_with_sets(MINIMAL, &["data.vocab.max_size=1000000000000"]);
    let line = line_of(MINIMAL, "name = \"cnn\"") - 1;
    assert!(e.contains(&format!("--set data.vocab.max_size=1000000000000: models[0] (line {line}): ")), "{e}");
    // `tandem validate`'s check of the data directory, set from the command line.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.toml");
    std::fs::write(&path, format!("{MINIMAL}\n[data]\nsplit_seed = 3\n")).unwrap();
    let set: Override = "data.dir=nothing-here".parse().unwrap();
    let e = Manifest::load_with(&path, &[set]).unwrap().check_paths().unwrap_err().to_string();
    assert!(e.contains("--set data.dir=nothing-here: data.dir: the directory") && !e.contains("(line"), "{e}");
    // The file's own error keeps its line.
    let broken = MINIMAL.replace("hidden = 32", "hidden = 0");
    let e = error_with_sets(&broken, &["train.epochs=2"]);
    let line = line_of(&broken, "hidden = 0");
    assert!(e.contains(&format!("models[1].hidden (line {line})")) && !e.contains("--set"), "{e}");
}

#[test]
fn a_value_of_the_wrong_type_names_its_field_and_line() {
    let cases = [
        (
            MINIMAL.replace("architecture = \"cnn\"", "architecture = \"cnn\"\nembedding_dim = 16.5"),
            "models[0].embedding_dim",
        ),
        (MINIMAL.replace("hidden = 32", "hidden = \"wide\""), "models[1].hidden"),
        (MINIMAL.replace("0.01 }", "0.01, epochs = 1.5 }"), "models[1].train.epochs"),
        (format!("{MINIMAL}\n[strategy]\nkind = \"data-parallel\"\nreplicas = 2.5\n"), "strategy.replicas"),
        (
            format!("{MINIMAL}{MODEL_PARALLEL}").replace("micro_batches = 4", "micro_batches = \"fast\""),
            "strategies[0].micro_batches",
        ),
    ];
    for (text, field) in cases {
        let at = text.lines().find(|l| ["16.5", "wide", "1.5", "2.5", "fast"].iter().any(|v| l.contains(v))).unwrap();
        let e = assert_names(&text, field, at);
        assert!(e.contains("invalid type"), "{e}");
    }
}

#[test]
fn failed_runs_are_counted_in_words_that_fit() {
    let message = |failed, total| RunError::RunsFailed { failed, total }.to_string();
    assert_eq!(message(1, 1), "1 of 1 run failed (see its summary.json)");
    assert_eq!(message(3, 3), "3 of 3 runs failed (see their summary.json)");
    assert_eq!(message(1, 2), "1 of 2 runs failed (see its summary.json); the other one finished");
    assert_eq!(message(2, 5), "2 of 5 runs failed (see their summary.json); the others finished");
}

#[test]
fn a_validation_share_and_a_report_target_are_checked_and_named() {
    for bad in ["0", "1", "1.5", "-0.1"] {
        let text = format!("{MINIMAL}\n[data]\nvalidation_fraction = {bad}\n");
        assert_names(&text, "data.validation_fraction", "validation_fraction");
    }
    let text = format!("{MINIMAL}\n[data]\nvalidation_fraction = 0.1\n");
    let m = Manifest::parse(&text, Path::new("experiments/demo.toml")).unwrap();
    assert_eq!(m.data.validation_fraction, Some(0.1));

    let target = |points: &str| {
        format!(
            "{MINIMAL}\n[report]\ntarget = {{ communication_reduction = 27, speedup = 5, points_lost = {points} }}\n"
        )
    };
    assert_names(&target("-1"), "report.target.points_lost", "points_lost");
    assert_names(&format!("{MINIMAL}\n[report]\ntarget = {{ speedup = 5 }}\n"), "communication_reduction", "target");
    let m = Manifest::parse(&target("3"), Path::new("experiments/demo.toml")).unwrap();
    assert_eq!(m.report.target.map(|t| t.points_lost), Some(3.0));
    // A run's own manifest leaves `[report]` out: a changed target re-judges runs, it does not rerun them.
    let run = m.for_run(&m.models[0], &m.strategies[0], 1).to_toml();
    assert!(!run.contains("[report]") && !run.contains("points_lost"), "{run}");
}
