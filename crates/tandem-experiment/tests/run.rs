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

#[test]
fn a_validation_split_is_evaluated_at_every_point_and_the_report_target_kept_beside_the_runs() {
    let Some(data) = data_dir() else { return };
    let out = tempfile::tempdir().unwrap();
    let text = manifest(&data, "ndarray", &["cpu"])
        .replace("max_len = 16", "max_len = 16\nvalidation_fraction = 0.25")
        .replace("[[strategies]]\nkind = \"data-parallel\"", "[report]\ntarget = { communication_reduction = 27, speedup = 5, points_lost = 3 }\n\n[[strategies]]\nkind = \"data-parallel\"");
    let m = Manifest::parse(&text, Path::new("tiny.toml")).unwrap();
    let options = RunOptions { out: out.path().to_path_buf(), progress: false, ..Default::default() };
    let summaries = run(&m, &options).unwrap();
    let experiment = out.path().join("tiny");
    for s in &summaries {
        let records: Vec<tandem_train::EpochRecord> =
            std::fs::read_to_string(experiment.join(&s.run_id).join("epochs.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        // A quarter of the 6,080 re-split training rows, before the 200-row limit on training.
        assert_eq!(s.validation_samples, 1520, "{}", s.run_id);
        let validation: Vec<usize> =
            records.iter().map(|r| r.validation.as_ref().unwrap().metrics.confusion.total() as usize).collect();
        assert_eq!(validation, [1520, 1520], "{}: validation at each point", s.run_id);
        assert_eq!(s.final_validation.as_ref(), Some(&records[1].validation.as_ref().unwrap().metrics));
        for r in &records {
            let wall = r.wall_seconds.unwrap();
            assert!(
                wall >= r.train_seconds + r.eval_seconds,
                "{}: the wall clock holds training and evaluation",
                s.run_id
            );
        }
        let wall: f64 = records.iter().map(|r| r.wall_seconds.unwrap()).sum();
        assert!((s.wall_seconds.unwrap() - wall).abs() < 1e-9, "{}", s.run_id);
        assert!(s.data.contains("25 % of training rows held out for validation"), "{}", s.data);
        let chosen = records.iter().max_by(|a, b| {
            let v = |r: &tandem_train::EpochRecord| r.validation.as_ref().unwrap().metrics.accuracy;
            v(a).total_cmp(&v(b))
        });
        assert_eq!(s.best_epoch, chosen.map(|r| r.epoch), "{}: the best epoch is chosen on validation", s.run_id);
        let resolved = std::fs::read_to_string(experiment.join(&s.run_id).join("manifest.toml")).unwrap();
        assert!(!resolved.contains("[report]"), "{resolved}");
    }
    let settings = std::fs::read_to_string(experiment.join(tandem_results::REPORT_FILE)).unwrap();
    assert!(settings.contains("communication_reduction = 27"), "{settings}");

    // The same runs without `[report]`: all skipped as finished, and the stale target removed.
    let plain = text.replace("[report]\ntarget = { communication_reduction = 27, speedup = 5, points_lost = 3 }\n", "");
    let m = Manifest::parse(&plain, Path::new("tiny.toml")).unwrap();
    run(&m, &options).unwrap();
    assert!(!experiment.join(tandem_results::REPORT_FILE).exists());
}

#[test]
fn data_parallelism_with_a_batch_per_replica_trains_as_sequential_training_on_the_global_batch() {
    let Some(data) = data_dir() else { return };
    let out = tempfile::tempdir().unwrap();
    let base = manifest(&data, "ndarray", &["cpu"]);
    let (strategies, models) = (base.find("[[strategies]]").unwrap(), base.find("[[models]]").unwrap());
    // Dropout off: replicas draw their masks from streams of their own.
    let gru = base[models..base.rfind("[[models]]").unwrap()].trim_end().to_string()
        + "\ndropout = 0.0\nembedding_dropout = 0.0\n";
    let with = |strategy: &str| format!("{}{strategy}\n\n{gru}", &base[..strategies]);
    let per_replica = with("[[strategies]]\nkind = \"data-parallel\"\nreplicas = 2\nbatch = \"per-replica\"");
    // The same rows in one batch of 2 × 32 on one device.
    let sequential = with("[[strategies]]\nkind = \"sequential\"").replace("batch_size = 32", "batch_size = 64");
    let options = RunOptions { out: out.path().to_path_buf(), progress: false, ..Default::default() };
    let mut summaries = Vec::new();
    for text in [per_replica, sequential] {
        let m = Manifest::parse(&text, Path::new("tiny.toml")).unwrap();
        summaries.extend(run(&m, &options).unwrap());
    }
    let (dp, seq) = (&summaries[0], &summaries[1]);
    assert_eq!(dp.run_id, "gru-data-parallel-2x-tree-per-replica-seed1");
    assert_eq!((dp.global_batch, seq.global_batch), (Some(64), Some(64)));
    let steps = |s: &tandem_experiment::RunSummary| {
        let text = std::fs::read_to_string(out.path().join("tiny").join(&s.run_id).join("epochs.jsonl")).unwrap();
        text.lines().map(|l| serde_json::from_str::<tandem_train::EpochRecord>(l).unwrap().steps).collect::<Vec<_>>()
    };
    // 200 rows in global batches of 64: 4 steps an epoch (batches of 32: 7).
    assert_eq!((steps(dp), steps(seq)), (vec![4, 4], vec![4, 4]));
    let (a, b) = (dp.final_holdout_loss.unwrap(), seq.final_holdout_loss.unwrap());
    assert!((a - b).abs() <= 1e-5 * b.abs(), "holdout loss {a} vs sequential's {b}");
}
