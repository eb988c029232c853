//! Reports from hand-made results folders: aggregation over seeds, speedups against the matching
//! sequential run, unfinished runs, the predictive-sync comparison, and valid SVG plots.

use std::path::{Path, PathBuf};

use tandem_report::aggregate::{pareto_front, summarize, Stat};
use tandem_results::{
    find_runs, write_epochs, write_json, CheckpointWrites, ClassificationMetrics, ConfusionMatrix, DataParallelFigures,
    EpochRecord, Evaluation, LinkFigures, PipelineFigures, Protocol, RunStart, RunState, RunStatus, RunSummary,
    StrategyFigures, SyncFigures, Target, TrafficPerStep,
};

/// Two balanced classes of 100 samples, `correct` of each right: accuracy, precision and recall
/// are all `correct / 100`.
fn metrics(correct: u64) -> ClassificationMetrics {
    ClassificationMetrics::from_confusion(ConfusionMatrix {
        counts: vec![vec![correct, 100 - correct], vec![100 - correct, correct]],
    })
}

/// `accuracies.len()` epochs of `seconds` each, 10 steps each, with `figures` as strategy figures.
fn epochs(seconds: f64, accuracies: &[u64], figures: &StrategyFigures) -> Vec<EpochRecord> {
    epochs_with_validation(seconds, accuracies, None, figures)
}

/// [`epochs`], each with the validation accuracy of `validation` where given.
fn epochs_with_validation(
    seconds: f64,
    accuracies: &[u64],
    validation: Option<&[u64]>,
    figures: &StrategyFigures,
) -> Vec<EpochRecord> {
    accuracies
        .iter()
        .enumerate()
        .map(|(i, &a)| EpochRecord {
            epoch: i + 1,
            stream: None,
            train_loss: 1.0,
            holdout_loss: 1.0,
            holdout: metrics(a),
            validation: validation.map(|v| Evaluation { loss: 1.0, metrics: metrics(v[i]) }),
            learning_rate: 1e-3,
            train_seconds: seconds,
            eval_seconds: 0.5,
            wall_seconds: Some(seconds + 0.5),
            train_samples_per_second: 640.0 / seconds,
            steps: 10,
            prequential_accuracy: None,
            prequential_samples: 0,
            figures: figures.clone(),
        })
        .collect()
}

struct RunSpec<'a> {
    model: &'a str,
    strategy: &'a str,
    seed: u64,
    machine: &'a str,
    epoch_seconds: f64,
    accuracies: &'a [u64],
    /// Validation accuracies, one per epoch (none: no validation split).
    validation: Option<&'a [u64]>,
    figures: StrategyFigures,
}

impl<'a> RunSpec<'a> {
    fn new(model: &'a str, strategy: &'a str, seed: u64, epoch_seconds: f64, accuracies: &'a [u64]) -> Self {
        Self {
            model,
            strategy,
            seed,
            machine: "test machine, 2 logical cores",
            epoch_seconds,
            accuracies,
            validation: None,
            figures: StrategyFigures::Sequential,
        }
    }
}

fn summary(spec: &RunSpec, records: &[EpochRecord]) -> RunSummary {
    let mut s = RunSummary::begun(RunStart {
        experiment: "exp".into(),
        run_id: format!("{}-{}-seed{}", spec.model, spec.strategy, spec.seed),
        model: spec.model.into(),
        architecture: spec.model.into(),
        strategy: spec.strategy.into(),
        backend: "ndarray".into(),
        machine: spec.machine.into(),
        threads_per_device: 1,
        seed: spec.seed,
        data: "toy data".into(),
        train_samples: 640,
        validation_samples: if spec.validation.is_some() { 200 } else { 0 },
        holdout_samples: 200,
        vocab_size: 100,
        max_len: 16,
        tandem_version: "0.1.0".into(),
        started_at: "2026-12-01T00:00:00Z".into(),
        manifest_hash: None,
        global_batch: None,
    });
    s.status = RunStatus::Finished;
    s.devices = vec!["cpu".into(), "cpu".into()];
    s.parameters = 1000;
    s.finished_at = "2026-12-01T00:01:00Z".into();
    s.set_epochs(records);
    // Runs that hold protocol state: 4 checkpoints of 2 MB, one whole, three patches of 2 MB ÷ 6.
    if spec.figures.pipeline().is_some_and(|p| p.state_bytes.is_some()) {
        let writes = CheckpointWrites { written: 4, whole: 1, bytes: 3_000_000, bytes_if_whole: 8_000_000 };
        s.checkpoints = Some(writes);
    }
    s
}

/// Writes a finished run to `<root>/exp/<run-id>/` and returns its folder.
fn write_run(root: &Path, spec: RunSpec) -> PathBuf {
    let records = epochs_with_validation(spec.epoch_seconds, spec.accuracies, spec.validation, &spec.figures);
    let s = summary(&spec, &records);
    let dir = root.join("exp").join(format!("{}-m{}", s.run_id, spec.machine.len()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("manifest.toml"), "").unwrap();
    write_epochs(&dir.join("epochs.jsonl"), &records).unwrap();
    write_json(&dir.join("summary.json"), &s).unwrap();
    dir
}

/// The target the protocol tests judge against: 27× less communication, 5× faster, 3 points.
const TARGET: Target = Target { communication_reduction: 27.0, speedup: 5.0, points_lost: 3.0 };

/// Writes [`TARGET`] as the experiment's `report.toml`.
fn write_target(root: &Path) {
    let text = "[target]\ncommunication_reduction = 27\nspeedup = 5\npoints_lost = 3\n";
    std::fs::write(root.join("exp").join(tandem_results::REPORT_FILE), text).unwrap();
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn stat_is_mean_and_sample_standard_deviation() {
    let s = Stat::of(&[1.0, 2.0, 3.0, 4.0]).unwrap();
    assert!(close(s.mean, 2.5) && close(s.std, (5.0f64 / 3.0).sqrt()) && s.n == 4);
    assert_eq!(Stat::of(&[7.0]).unwrap(), Stat { mean: 7.0, std: 0.0, n: 1 });
    assert!(Stat::of(&[]).is_none());
}

#[test]
fn groups_aggregate_over_seeds_and_speedups_pair_with_the_same_seed_and_setting() {
    let root = tempfile::tempdir().unwrap();
    // Sequential: 2 epochs of 50 / 60 s → 100 / 120 s; data parallel 50 / 80 s → speedups 2.0, 1.5.
    write_run(root.path(), RunSpec::new("cnn", "sequential", 1, 50.0, &[70, 80]));
    write_run(root.path(), RunSpec::new("cnn", "sequential", 2, 60.0, &[70, 82]));
    let dp = dp_figures(1000.0, 0.25, 500.0);
    write_run(
        root.path(),
        RunSpec { figures: dp.clone(), ..RunSpec::new("cnn", "data-parallel-2x-tree", 1, 25.0, &[70, 81]) },
    );
    write_run(root.path(), RunSpec { figures: dp, ..RunSpec::new("cnn", "data-parallel-2x-tree", 2, 40.0, &[70, 79]) });
    // Same model and seed on another machine: a setting of its own, never paired with the above.
    write_run(root.path(), RunSpec { machine: "other machine", ..RunSpec::new("cnn", "sequential", 1, 1.0, &[60]) });

    let runs = find_runs(&[root.path().to_path_buf()]).unwrap();
    assert_eq!(runs.len(), 5);
    let tables = summarize(&runs);
    assert_eq!(tables.len(), 2, "two machines are two settings");
    let table = tables.iter().find(|t| t.setting.machine.starts_with("test")).unwrap();
    assert_eq!(table.strategies(), vec!["sequential", "data-parallel-2x-tree"]);

    let seq = table.group("cnn", "sequential").unwrap();
    assert_eq!(seq.runs.len(), 2);
    assert!(close(seq.train_seconds.mean, 110.0));
    assert!(close(seq.accuracy.mean, 0.81) && close(seq.accuracy.std, 0.02f64.powi(2).sqrt() / 2f64.sqrt()));
    assert!(close(seq.speedup.unwrap().mean, 1.0));

    let dp = table.group("cnn", "data-parallel-2x-tree").unwrap();
    let speedup = dp.speedup.unwrap();
    assert_eq!(speedup.n, 2);
    assert!(close(speedup.mean, 1.75) && close(speedup.std, (2.0 * 0.25f64.powi(2)).sqrt()));
    // 1000 bytes per step × 10 steps × 2 epochs.
    assert!(close(dp.bytes.unwrap().mean, 20_000.0));
    assert!(close(dp.communication_share.unwrap().mean, 0.25));
    assert!(seq.bytes.is_none(), "sequential runs do not communicate");

    let other = tables.iter().find(|t| t.setting.machine == "other machine").unwrap();
    assert_eq!(other.groups.len(), 1);
    assert_eq!(other.groups[0].runs.len(), 1);
}

#[test]
fn failed_interrupted_and_unreadable_runs_are_listed_and_not_averaged() {
    let root = tempfile::tempdir().unwrap();
    write_run(root.path(), RunSpec::new("gru", "sequential", 1, 10.0, &[80]));
    let failed = write_run(root.path(), RunSpec::new("gru", "sequential", 2, 10.0, &[30]));
    let mut s: RunSummary =
        serde_json::from_str(&std::fs::read_to_string(failed.join("summary.json")).unwrap()).unwrap();
    s.status = RunStatus::Failed;
    s.error = Some("stage 1 failed at step 3 of epoch 1: boom".into());
    write_json(&failed.join("summary.json"), &s).unwrap();
    // Interrupted: the runner wrote the manifest and one epoch, then the process died.
    let interrupted = root.path().join("exp/gru-sequential-seed3");
    std::fs::create_dir_all(&interrupted).unwrap();
    std::fs::write(interrupted.join("manifest.toml"), "").unwrap();
    write_epochs(&interrupted.join("epochs.jsonl"), &epochs(10.0, &[75], &StrategyFigures::Sequential)).unwrap();
    // Interrupted by a signal: its summary says so.
    let stopped = write_run(root.path(), RunSpec::new("gru", "sequential", 5, 10.0, &[70, 72]));
    let mut s: RunSummary =
        serde_json::from_str(&std::fs::read_to_string(stopped.join("summary.json")).unwrap()).unwrap();
    s.status = RunStatus::Interrupted;
    write_json(&stopped.join("summary.json"), &s).unwrap();
    // Unreadable: a damaged second line.
    let damaged = root.path().join("exp/gru-sequential-seed4");
    std::fs::create_dir_all(&damaged).unwrap();
    let good = serde_json::to_string(&epochs(10.0, &[75], &StrategyFigures::Sequential)[0]).unwrap();
    std::fs::write(damaged.join("epochs.jsonl"), format!("{good}\n{{\"epoch\": 2, \n")).unwrap();

    let runs = find_runs(&[root.path().join("exp")]).unwrap();
    let states: Vec<&RunState> = runs.iter().map(|r| &r.state).collect();
    assert_eq!(states.iter().filter(|s| ***s == RunState::Finished).count(), 1);
    assert!(states.iter().any(|s| matches!(s, RunState::Failed(e) if e.contains("boom"))));
    assert!(states.iter().any(|s| **s == RunState::Unfinished));
    assert!(states.iter().any(|s| matches!(s, RunState::Unreadable(e) if e.contains("epochs.jsonl line 2"))));

    let tables = summarize(&runs);
    assert_eq!(tables[0].groups[0].runs.len(), 1, "only the finished run is averaged");
    let out = root.path().join("report");
    let files = tandem_report::write_report(&[root.path().join("exp")], &out).unwrap();
    assert_eq!((files.finished, files.not_finished), (1, 4));
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(md.contains("Runs that did not finish") && md.contains("From 5 run folders"));
    assert!(md.contains("gru-sequential-seed3 — still running, or killed: 1 epoch recorded, no summary.json"), "{md}");
    assert!(md.contains("-seed5-m"), "{md}");
    assert!(
        md.contains("— interrupted after 2 epochs (stopped by a signal; the same tandem run command resumes it)"),
        "{md}"
    );
    assert!(md.contains("boom"));
    assert!(md.contains("line 2"));
}

#[test]
fn a_missing_input_or_a_folder_without_runs_is_a_clear_error() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("nope");
    let e = find_runs(std::slice::from_ref(&missing)).unwrap_err().to_string();
    assert!(e.contains(&missing.display().to_string()) && e.contains("no such directory"), "{e}");
    let e = find_runs(&[root.path().to_path_buf()]).unwrap_err().to_string();
    assert!(e.contains("no runs under"), "{e}");
}

/// Data-parallel figures with these bytes per step, communication share and bytes per replica.
fn dp_figures(bytes_per_step: f64, communication_share: f64, per_replica: f64) -> StrategyFigures {
    StrategyFigures::DataParallel(DataParallelFigures {
        bytes_per_step,
        communication_share,
        bytes_sent_per_replica_per_step: per_replica,
        ..Default::default()
    })
}

fn mp_figures() -> StrategyFigures {
    let direction = TrafficPerStep { messages: 4.0, bytes: 2000.0 };
    StrategyFigures::Pipeline(PipelineFigures {
        bytes_per_step: 4000.0,
        communication_share: 0.05,
        links_per_step: vec![LinkFigures { forward: direction, backward: direction }],
        compute_seconds: vec![3.0, 6.0],
        transfer_seconds: vec![0.2, 0.3],
        idle_seconds: vec![4.0, 1.0],
        ..Default::default()
    })
}

/// The text of every `<text>` element of an SVG, after checking it parses as XML with an `svg` root.
fn svg_texts(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let doc =
        roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{} is not well-formed XML: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg", "{}", path.display());
    doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).map(str::to_string).collect()
}

#[test]
fn every_plot_is_valid_svg_with_the_expected_series() {
    let root = tempfile::tempdir().unwrap();
    for (seed, slow) in [(1, 0.0), (2, 2.0)] {
        for model in ["cnn", "lstm"] {
            write_run(root.path(), RunSpec::new(model, "sequential", seed, 20.0 + slow, &[60, 70, 75]));
            let dp = dp_figures(1e6, 0.2, 5e5);
            write_run(
                root.path(),
                RunSpec {
                    figures: dp,
                    ..RunSpec::new(model, "data-parallel-2x-tree", seed, 12.0 + slow, &[61, 71, 74])
                },
            );
            write_run(
                root.path(),
                RunSpec {
                    figures: mp_figures(),
                    ..RunSpec::new(model, "model-parallel-2s-gpipe-4m", seed, 15.0, &[59, 69, 76])
                },
            );
        }
    }
    let out = root.path().join("report");
    let files = tandem_report::write_report(&[root.path().to_path_buf()], &out).unwrap();
    let names: Vec<String> =
        files.plots.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    let (confusion, plots): (Vec<&String>, Vec<&String>) = names.iter().partition(|n| n.starts_with("confusion-"));
    assert_eq!(
        plots,
        [
            "speedup.svg",
            "accuracy-time.svg",
            "accuracy-bytes.svg",
            "train-loss.svg",
            "holdout-loss.svg",
            "communication-accuracy.svg",
            "stage-time.svg"
        ]
    );
    assert_eq!(confusion.len(), 6, "one heat map per model × strategy");
    let has = |texts: &[String], s: &str| texts.iter().any(|t| t.contains(s));

    let speedup = svg_texts(&out.join("speedup.svg"));
    for s in ["data-parallel-2x-tree", "model-parallel-2s-gpipe-4m", "cnn", "lstm"] {
        assert!(has(&speedup, s), "speedup plot lacks {s}: {speedup:?}");
    }
    assert!(!speedup.iter().any(|t| t == "sequential"), "the baseline is the 1× line, not a bar");
    let accuracy = svg_texts(&out.join("accuracy-time.svg"));
    for s in ["sequential", "data-parallel-2x-tree", "model-parallel-2s-gpipe-4m", "cnn", "lstm", "training time (s)"] {
        assert!(has(&accuracy, s), "accuracy plot lacks {s}");
    }
    for plot in ["train-loss.svg", "holdout-loss.svg"] {
        let texts = svg_texts(&out.join(plot));
        let epochs: Vec<&str> = texts.iter().map(|t| t.trim()).filter(|t| t.parse::<u32>().is_ok()).collect();
        let mut distinct = epochs.clone();
        distinct.dedup();
        assert!(!epochs.is_empty() && distinct == epochs, "{plot}: every epoch labelled once: {texts:?}");
    }
    let comm = svg_texts(&out.join("communication-accuracy.svg"));
    assert!(has(&comm, "data-parallel-2x-tree") && has(&comm, "model-parallel-2s-gpipe-4m"));
    assert!(!comm.iter().any(|t| t == "sequential"), "only strategies that communicate are plotted");
    let stages = svg_texts(&out.join("stage-time.svg"));
    for s in [
        "compute",
        "transfer",
        "idle",
        "cnn model-parallel-2s-gpipe-4m · stage 0",
        "lstm model-parallel-2s-gpipe-4m · stage 1",
    ] {
        assert!(has(&stages, s), "stage plot lacks {s}: {stages:?}");
    }

    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(md.contains("Machine: test machine, 2 logical cores"));
    assert!(md.contains("| cnn | data-parallel-2x-tree | 2 × cpu, 1 thread each | 2 |"));
    assert!(md.contains("![speedup](speedup.svg)\n\n*Speedup over sequential"));
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert_eq!(html.matches("<svg").count(), 7 + 6, "the HTML page inlines every plot");
    for (plot, axis) in [("train-loss.svg", "training loss"), ("holdout-loss.svg", "holdout loss")] {
        let texts = svg_texts(&out.join(plot));
        for s in [axis, "epoch", "sequential", "model-parallel-2s-gpipe-4m", "cnn", "lstm"] {
            assert!(has(&texts, s), "{plot} lacks {s}: {texts:?}");
        }
    }
    assert!(!html.contains("<?xml"));
}

#[test]
fn the_pareto_front_keeps_only_undominated_points() {
    // (bytes, accuracy): the second point is dominated by the first (more bytes, lower accuracy).
    let points = [(10.0, 0.8), (20.0, 0.7), (5.0, 0.6), (30.0, 0.9), (10.0, 0.8)];
    assert_eq!(pareto_front(&points), vec![2, 0, 4, 3]);
}

#[test]
fn predictive_sync_is_compared_with_vanilla_model_parallel_and_with_static_at_equal_syncs() {
    let root = tempfile::tempdir().unwrap();
    for seed in [1, 2] {
        let figures = mp_figures();
        write_run(
            root.path(),
            RunSpec { figures, ..RunSpec::new("gru", "model-parallel-2s-gpipe-4m", seed, 50.0, &[80]) },
        );
    }
    let sync = |bytes_per_step: f64, predictor: &str, sync_steps: u64| {
        let trigger = "periodic".into();
        let sync = SyncFigures { predictor: predictor.into(), trigger, sync_steps, ..Default::default() };
        StrategyFigures::Pipeline(PipelineFigures { bytes_per_step, sync: Some(sync), ..Default::default() })
    };
    write_run(
        root.path(),
        RunSpec {
            figures: sync(400.0, "holt", 1),
            ..RunSpec::new("gru", "predictive-sync-holt-periodic10", 1, 10.0, &[78])
        },
    );
    write_run(
        root.path(),
        RunSpec {
            figures: sync(400.0, "static", 1),
            ..RunSpec::new("gru", "predictive-sync-static-periodic10", 1, 9.0, &[75])
        },
    );
    write_run(
        root.path(),
        RunSpec {
            figures: sync(400.0, "ema", 5),
            ..RunSpec::new("gru", "predictive-sync-ema-adaptive", 1, 20.0, &[79])
        },
    );
    // 40× less communication, 5.6× faster, 2 points lost, on both seeds: meets the target.
    for seed in [1, 2] {
        write_run(
            root.path(),
            RunSpec {
                figures: sync(100.0, "velocity", 1),
                ..RunSpec::new("gru", "predictive-sync-velocity-periodic27", seed, 9.0, &[78])
            },
        );
    }
    write_target(root.path());

    let runs = find_runs(&[root.path().to_path_buf()]).unwrap();
    let tables = summarize(&runs);
    let comparisons = tandem_report::sync::compare(&tables[0]);
    assert_eq!(comparisons.len(), 4);
    let holt = comparisons.iter().find(|c| c.predictor == "holt").unwrap();
    assert_eq!(holt.reference, "model-parallel-2s-gpipe-4m");
    assert!(close(holt.communication_reduction.unwrap(), 10.0));
    assert!(close(holt.speedup, 5.0));
    assert!((holt.accuracy_change - -2.0).abs() < 1e-9);
    let (versus, gain) = holt.versus_static.clone().unwrap();
    assert_eq!(versus, "predictive-sync-static-periodic10");
    assert!((gain - 3.0).abs() < 1e-9);
    assert!(
        comparisons.iter().find(|c| c.predictor == "ema").unwrap().versus_static.is_none(),
        "no static run with 5 syncs"
    );

    let files = tandem_report::write_report(&[root.path().to_path_buf()], &root.path().join("r")).unwrap();
    let md = std::fs::read_to_string(files.markdown).unwrap();
    assert!(md.contains("Protocols against their matched baselines"));
    assert!(md.contains("| gru | predictive-sync-holt-periodic10 | predictive | holt | periodic | model-parallel-2s-gpipe-4m | — | 1 | 10.0× | — | 10.0× | 5.00× | — | 4.81× | — |"), "{md}");
    assert!(
        md.contains("| gru | predictive-sync-holt-periodic10 | 1 | — | -2.0 | — | — | — | +3.0 | never | — |"),
        "{md}"
    );
    assert!(!holt.meets(&TARGET), "10× less communication is short of 27×");
    let velocity = comparisons.iter().find(|c| c.predictor == "velocity").unwrap();
    assert_eq!(velocity.intervals.speedup.map(|i| i.n), Some(2));
    assert!(
        md.contains("gru: met by predictive-sync-velocity-periodic27; chosen on holdout (no validation split): predictive-sync-velocity-periodic27"),
        "{md}"
    );
    assert!(md.contains("no static run at this sync count"));
}

#[test]
fn local_learning_and_compressed_boundaries_are_compared_with_the_vanilla_run_of_their_pipeline() {
    let root = tempfile::tempdir().unwrap();
    let pipeline = |bytes_per_step: f64, cuts: Vec<usize>, compression: Option<&str>, sync: Option<SyncFigures>| {
        StrategyFigures::Pipeline(PipelineFigures {
            bytes_per_step,
            cuts,
            compression: compression.map(String::from),
            sync,
            ..Default::default()
        })
    };
    // Two vanilla runs of one model, cut differently: the slower is the reference of its shape only.
    for (strategy, cuts, seconds) in
        [("model-parallel-2s-gpipe-4m", vec![2], 40.0), ("model-parallel-2s-cuts1-gpipe-4m", vec![1], 60.0)]
    {
        for seed in [1, 2] {
            let figures = pipeline(4000.0, cuts.clone(), None, None);
            write_run(root.path(), RunSpec { figures, ..RunSpec::new("tf", strategy, seed, seconds, &[80]) });
        }
    }
    let local = SyncFigures {
        protocol: Protocol::Local,
        predictor: "static".into(),
        trigger: "periodic".into(),
        sync_steps: 1,
        local_steps: 27,
        ..Default::default()
    };
    let runs = [
        // Same cut as the slower vanilla run: compared with it.
        ("local-a", vec![1], Some("a4g8-delta"), Some(local.clone()), 100.0, 10.0, 81),
        // A cut no vanilla run has: compared with the fastest.
        ("local-b", vec![3], Some("a4g8-delta"), Some(local), 100.0, 10.0, 75),
        ("model-parallel-2s-gpipe-4m-a8g8", vec![2], Some("a8g8"), None, 1000.0, 44.0, 80),
    ];
    for (strategy, cuts, compression, sync, bytes, seconds, accuracy) in runs {
        for seed in [1, 2] {
            let figures = pipeline(bytes, cuts.clone(), compression, sync.clone());
            write_run(root.path(), RunSpec { figures, ..RunSpec::new("tf", strategy, seed, seconds, &[accuracy]) });
        }
    }
    let runs = find_runs(&[root.path().to_path_buf()]).unwrap();
    let tables = summarize(&runs);
    let comparisons = tandem_report::sync::compare(&tables[0]);
    let of = |strategy: &str| comparisons.iter().find(|c| c.strategy == strategy).unwrap();
    assert_eq!(comparisons.len(), 3, "the vanilla runs are references, not protocols");
    assert_eq!(
        (of("local-a").protocol.name(), of("local-a").reference.as_str()),
        ("local", "model-parallel-2s-cuts1-gpipe-4m")
    );
    assert!(close(of("local-a").speedup, 6.0) && close(of("local-a").communication_reduction.unwrap(), 40.0));
    assert!(of("local-a").meets(&TARGET) && of("local-a").shortfall(&TARGET) == 0.0);
    assert_eq!(of("local-b").reference, "model-parallel-2s-gpipe-4m", "the fastest vanilla run");
    assert!(!of("local-b").meets(&TARGET), "4× faster and 5 points lost");
    let compressed = of("model-parallel-2s-gpipe-4m-a8g8");
    assert_eq!((compressed.protocol.name(), compressed.trigger.as_str()), ("compressed", "every step"));
    assert!(close(compressed.communication_reduction.unwrap(), 4.0));
    assert_eq!(
        tandem_report::sync::verdict("tf", &comparisons, &TARGET),
        "tf: met by local-a; chosen on holdout (no validation split): local-a (40.0× [40.0, 40.0] less communication, 6.00× [6.00, 6.00] faster, +1.0 [+1.0, +1.0] holdout points)"
    );
    let far = [compressed.clone()];
    assert_eq!(
        tandem_report::sync::verdict("tf", &far, &TARGET),
        "tf: not met; closest on holdout (no validation split): model-parallel-2s-gpipe-4m-a8g8 (4.0× [4.0, 4.0] less communication, 0.91× [0.91, 0.91] faster, +0.0 [+0.0, +0.0] holdout points)"
    );

    let files = tandem_report::write_report(&[root.path().to_path_buf()], &root.path().join("r")).unwrap();
    let texts = svg_texts(&root.path().join("r").join("protocols.svg"));
    // Each point is labelled with its protocol's number in the legend and its speedup.
    let label = texts.iter().find(|t| t.trim().ends_with(": 6.0×")).expect("local-a's point labelled with its speedup");
    let number = label.trim().trim_end_matches(": 6.0×");
    assert!(texts.iter().any(|t| t.trim() == format!("{number} local-a")), "{texts:?}");
    let md = std::fs::read_to_string(files.markdown).unwrap();
    assert!(md.contains("| tf | local-a | local | static | periodic | model-parallel-2s-cuts1-gpipe-4m |"), "{md}");
}

/// One model's runs over five seeds: sequential; vanilla; vanilla with 2-bit boundaries; the
/// auxiliary objective with a real step every step; two local-learning protocols with 2-bit
/// boundaries whose holdout accuracies are `holdout` (their validation accuracies fixed).
fn matched_baseline_runs(root: &Path, holdout: [u64; 2]) {
    let local = |local_steps: u64| SyncFigures {
        protocol: Protocol::Local,
        predictor: "static".into(),
        trigger: "periodic".into(),
        sync_steps: 1,
        local_steps,
        aux_parameters: vec![10],
        ..Default::default()
    };
    let pipeline = |bytes_per_step: f64, compression: Option<&str>, sync: Option<SyncFigures>| {
        let compression = compression.map(String::from);
        // The protocols' state: 2.5 MB of AQ-SGD copies.
        let state_bytes = sync.as_ref().filter(|s| s.local_steps > 0).map(|_| 2.5e6);
        StrategyFigures::Pipeline(PipelineFigures {
            bytes_per_step,
            cuts: vec![1],
            compression,
            sync,
            state_bytes,
            ..Default::default()
        })
    };
    let runs: [(&str, f64, f64, u64, u64, StrategyFigures); 6] = [
        ("sequential", 20.0, 0.0, 80, 80, StrategyFigures::Sequential),
        ("vanilla", 50.0, 4000.0, 80, 80, pipeline(4000.0, None, None)),
        ("vanilla-a2", 50.0, 500.0, 79, 79, pipeline(500.0, Some("a2g8-delta"), None)),
        ("objective", 50.0, 4100.0, 83, 83, pipeline(4100.0, None, Some(local(0)))),
        ("local-p", 8.0, 20.0, holdout[0], 79, pipeline(20.0, Some("a2g8-delta"), Some(local(27)))),
        ("local-q", 8.0, 20.0, holdout[1], 82, pipeline(20.0, Some("a2g8-delta"), Some(local(27)))),
    ];
    for seed in 1..=5u64 {
        for (strategy, seconds, _, holdout, validation, figures) in &runs {
            // Accuracies move together by seed, so the paired differences are exact.
            let (h, v) = ([holdout + seed % 2], [validation + seed % 2]);
            let spec = RunSpec {
                figures: figures.clone(),
                validation: Some(&v),
                ..RunSpec::new("cnn", strategy, seed, *seconds, &h)
            };
            write_run(root, spec);
        }
    }
    write_target(root);
}

#[test]
fn protocols_are_compared_with_their_matched_baselines_and_the_choice_reads_validation_only() {
    let root = tempfile::tempdir().unwrap();
    matched_baseline_runs(root.path(), [81, 78]);
    let runs = find_runs(&[root.path().to_path_buf()]).unwrap();
    let tables = summarize(&runs);
    let comparisons = tandem_report::sync::compare(&tables[0]);
    let of = |strategy: &str| comparisons.iter().find(|c| c.strategy == strategy).unwrap();
    let names: Vec<&str> = comparisons.iter().map(|c| c.strategy.as_str()).collect();
    assert_eq!(names, ["local-p", "local-q", "vanilla-a2"], "the objective-matched baseline is no protocol");
    let p = of("local-p");
    assert_eq!(p.compression_matched.as_deref(), Some("vanilla-a2"));
    assert_eq!(p.objective_matched.as_deref(), Some("objective"));
    assert_eq!(of("vanilla-a2").compression_matched, None, "compressed vanilla is not its own baseline");
    let i = &p.intervals;
    let mean = |i: Option<tandem_report::interval::Interval>| i.unwrap().mean;
    assert!(close(mean(i.reduction), 200.0), "4,000 ÷ 20 bytes");
    assert!(close(mean(i.from_compression), 8.0) && close(mean(i.from_protocol), 25.0), "200× = 8× × 25×");
    assert!(close(mean(i.speedup), 6.25) && close(mean(i.speedup_vs_sequential), 2.5));
    assert!(close(mean(i.holdout_change), 0.01) && close(mean(i.validation_change), -0.01));
    assert!(close(mean(i.versus_objective), -0.02) && close(mean(i.versus_compression), 0.02));
    assert_eq!(i.reduction.unwrap().n, 5);
    // Each hand-made record's wall clock is its training time and half a second: 50.5 ÷ 8.5.
    // p never reached vanilla's 80 % on validation (79 %), q did at its first point (82 %, after 8 s).
    assert!(close(mean(i.end_to_end_speedup), 50.5 / 8.5));
    assert_eq!((i.time_to_vanilla, i.reached_vanilla), (None, (0, 5)));
    let q = &of("local-q").intervals;
    assert_eq!((q.time_to_vanilla.map(|t| t.mean), q.reached_vanilla), (Some(8.0), (5, 5)));

    // Both protocols meet the target on validation; q is chosen for its +2 validation points,
    // though its holdout accuracy is the lower.
    let choice = tandem_report::sync::choose("cnn", &comparisons, &TARGET);
    let met: Vec<&str> = choice.met.iter().map(|c| c.strategy.as_str()).collect();
    assert!(choice.on_validation);
    assert_eq!((met.as_slice(), choice.chosen.unwrap().strategy.as_str()), (&["local-p", "local-q"][..], "local-q"));

    // Holdout figures changed every way: the selection does not move.
    for holdout in [[90, 70], [60, 60], [70, 90]] {
        let other = tempfile::tempdir().unwrap();
        matched_baseline_runs(other.path(), holdout);
        let runs = find_runs(&[other.path().to_path_buf()]).unwrap();
        let tables = summarize(&runs);
        let comparisons = tandem_report::sync::compare(&tables[0]);
        let again = tandem_report::sync::choose("cnn", &comparisons, &TARGET);
        let met_again: Vec<&str> = again.met.iter().map(|c| c.strategy.as_str()).collect();
        assert_eq!((met_again, again.chosen.unwrap().strategy.as_str()), (met.clone(), "local-q"), "{holdout:?}");
    }

    let files = tandem_report::write_report(&[root.path().to_path_buf()], &root.path().join("r")).unwrap();
    let md = std::fs::read_to_string(files.markdown).unwrap();
    // Markdown escapes the intervals' brackets.
    let row = "| cnn | local-p | local | static | periodic | vanilla | vanilla-a2 | 1 ± 0 | 200.0× [200.0, 200.0] | 8.0× [8.0, 8.0] | 25.0× [25.0, 25.0] | 6.25× [6.25, 6.25] | 2.50× [2.50, 2.50] | 5.94× [5.94, 5.94] | 2.5 | 0.8 (38 %) |";
    assert!(md.contains(&row.replace('[', "\\[").replace(']', "\\]")), "{md}");
    let row = "| cnn | local-p | 5 | -1.0 [-1.0, -1.0] | +1.0 [+1.0, +1.0] | +2.0 [+2.0, +2.0] | objective | -2.0 [-2.0, -2.0] | — | never | — |";
    assert!(md.contains(&row.replace('[', "\\[").replace(']', "\\]")), "{md}");
    assert!(md.contains("cnn: met by local-p, local-q; chosen on validation: local-q"), "{md}");
    for plot in ["validation-time.svg", "accuracy-bytes.svg"] {
        let texts = svg_texts(&root.path().join("r").join(plot));
        assert!(
            texts.iter().any(|t| t.trim() == "local-q") && texts.iter().any(|t| t.trim() == "vanilla"),
            "{plot}: {texts:?}"
        );
    }
}

#[test]
fn without_a_target_there_is_no_verdict_and_a_bad_report_toml_is_named() {
    let root = tempfile::tempdir().unwrap();
    matched_baseline_runs(root.path(), [81, 78]);
    let settings = root.path().join("exp").join(tandem_results::REPORT_FILE);
    std::fs::remove_file(&settings).unwrap();
    let files = tandem_report::write_report(&[root.path().to_path_buf()], &root.path().join("r")).unwrap();
    let md = std::fs::read_to_string(files.markdown).unwrap();
    assert!(md.contains("No target set") && !md.contains("met by"), "{md}");

    std::fs::write(&settings, "[target]\ncommunication_reduction = 27\nspeedup = 5\npoints_lost = -1\n").unwrap();
    let message =
        tandem_report::write_report(&[root.path().to_path_buf()], &root.path().join("r")).unwrap_err().to_string();
    assert!(message.contains("report.toml") && message.contains("target.points_lost"), "{message}");
    // Two folders of one setting that disagree on the target.
    let elsewhere = root.path().join("copy");
    write_run(&elsewhere, RunSpec::new("cnn", "sequential", 9, 20.0, &[80]));
    std::fs::write(
        elsewhere.join("exp").join(tandem_results::REPORT_FILE),
        "[target]\ncommunication_reduction = 2\nspeedup = 1\npoints_lost = 1\n",
    )
    .unwrap();
    write_target(root.path());
    let message =
        tandem_report::write_report(&[root.path().to_path_buf()], &root.path().join("r")).unwrap_err().to_string();
    assert!(message.contains("differs from") && message.contains("report.toml"), "{message}");
    std::fs::remove_dir_all(&elsewhere).unwrap();
    std::fs::write(&settings, "[target]\nspeed = 5\n").unwrap();
    let message =
        tandem_report::write_report(&[root.path().to_path_buf()], &root.path().join("r")).unwrap_err().to_string();
    assert!(message.contains("report.toml") && message.contains("line 2") && message.contains("speed"), "{message}");
}

#[test]
fn identical_run_folders_are_counted_once_and_the_report_says_so() {
    let root = tempfile::tempdir().unwrap();
    let first = write_run(root.path(), RunSpec::new("cnn", "sequential", 1, 10.0, &[70]));
    std::fs::write(first.join("manifest.toml"), "[experiment]\nname = \"exp\"\n").unwrap();
    // A rerun into the same results folder: the same run, manifest and all, finished later.
    let rerun = first.with_file_name(format!("{}-2", first.file_name().unwrap().to_string_lossy()));
    std::fs::create_dir_all(&rerun).unwrap();
    for file in ["manifest.toml", "epochs.jsonl"] {
        std::fs::copy(first.join(file), rerun.join(file)).unwrap();
    }
    let mut s: RunSummary =
        serde_json::from_str(&std::fs::read_to_string(first.join("summary.json")).unwrap()).unwrap();
    s.finished_at = "2026-12-01T00:02:00Z".into();
    s.train_seconds = 30.0;
    write_json(&rerun.join("summary.json"), &s).unwrap();
    // The same seed under another manifest is another run, not a duplicate.
    let other = write_run(root.path(), RunSpec::new("cnn", "sequential", 2, 10.0, &[70]));
    std::fs::write(other.join("manifest.toml"), "[experiment]\nname = \"exp\"\n# changed\n").unwrap();

    let runs = find_runs(&[root.path().to_path_buf()]).unwrap();
    assert_eq!(runs.len(), 3);
    let tables = summarize(&runs);
    let group = tables[0].group("cnn", "sequential").unwrap();
    assert_eq!(group.runs.len(), 2, "n is the number of distinct seeds");
    assert_eq!(group.seeds().len(), 2);
    let kept = group.runs.iter().find(|r| r.summary.as_ref().unwrap().seed == 1).unwrap();
    assert_eq!(kept.dir, std::fs::canonicalize(&rerun).unwrap(), "the run that finished last is kept");

    let files = tandem_report::write_report(&[root.path().to_path_buf()], &root.path().join("r")).unwrap();
    let md = std::fs::read_to_string(files.markdown).unwrap();
    assert!(md.contains("| cnn | sequential | 2 × cpu, 1 thread each | 2 |"), "{md}");
    assert!(md.contains("1 finished run folder was ignored"), "{md}");
}

#[test]
fn two_identical_run_folders_give_n_1() {
    let root = tempfile::tempdir().unwrap();
    let first = write_run(root.path(), RunSpec::new("gru", "sequential", 7, 10.0, &[70]));
    let copy = root.path().join("exp/copy");
    std::fs::create_dir_all(&copy).unwrap();
    for file in ["manifest.toml", "epochs.jsonl", "summary.json"] {
        std::fs::copy(first.join(file), copy.join(file)).unwrap();
    }
    let runs = find_runs(&[root.path().to_path_buf()]).unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(summarize(&runs)[0].groups[0].runs.len(), 1);
}

#[test]
fn per_class_tables_name_the_classes_and_each_group_gets_a_confusion_heat_map() {
    let root = tempfile::tempdir().unwrap();
    let four = |correct: u64| {
        let counts =
            (0..4).map(|t| (0..4).map(|p| if t == p { correct } else { (50 - correct) / 3 }).collect()).collect();
        ClassificationMetrics::from_confusion(ConfusionMatrix { counts })
    };
    for seed in [1, 2] {
        let dir = write_run(root.path(), RunSpec::new("cnn", "sequential", seed, 10.0, &[70]));
        let mut s: RunSummary =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
        s.final_metrics = Some(four(if seed == 1 { 41 } else { 44 }));
        write_json(&dir.join("summary.json"), &s).unwrap();
    }
    let out = root.path().join("r");
    let files = tandem_report::write_report(&[root.path().to_path_buf()], &out).unwrap();
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(
        md.contains(
            "| strategy | n | World P / R / F1 | Sports P / R / F1 | Business P / R / F1 | Sci/Tech P / R / F1 |"
        ),
        "{md}"
    );
    // Recall per class: 41/50 and 44/50, mean 85 %.
    assert!(md.contains("| sequential | 2 | 85.0 / 85.0 / 85.0 |"), "{md}");
    assert!(md.contains("- [cnn · sequential](confusion-cnn-sequential.svg)"), "{md}");
    let texts = svg_texts(&out.join("confusion-cnn-sequential.svg"));
    // Summed over the two seeds: 85 of 100 on the diagonal, 85 % of each row.
    for s in ["World", "Sci/Tech", "85%", "85", "summed over 2 seeds"] {
        assert!(texts.iter().any(|t| t.contains(s)), "heat map lacks {s}: {texts:?}");
    }
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("<div class=\"gallery\">"));
}

#[test]
fn strategies_of_different_global_batches_are_named_with_their_batch() {
    let root = tempfile::tempdir().unwrap();
    for (strategy, batch) in [("sequential", 32), ("data-parallel-2x-tree-per-replica", 64)] {
        let dir = write_run(root.path(), RunSpec::new("gru", strategy, 1, 10.0, &[70]));
        let mut s: RunSummary =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
        s.global_batch = Some(batch);
        write_json(&dir.join("summary.json"), &s).unwrap();
    }
    let out = root.path().join("r");
    let md = std::fs::read_to_string(tandem_report::write_report(&[root.path().to_path_buf()], &out).unwrap().markdown)
        .unwrap();
    assert!(md.contains("Global batches differ") && md.contains("data-parallel-2x-tree-per-replica 64"), "{md}");
    assert!(md.contains("sequential 32"), "{md}");
}

#[test]
fn a_report_written_over_an_earlier_one_leaves_none_of_its_plots() {
    let root = tempfile::tempdir().unwrap();
    let mut dirs = Vec::new();
    for model in ["cnn", "gru"] {
        let dir = write_run(root.path(), RunSpec::new(model, "sequential", 1, 10.0, &[70]));
        let mut s: RunSummary =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
        s.final_metrics = Some(metrics(70));
        write_json(&dir.join("summary.json"), &s).unwrap();
        dirs.push(dir);
    }
    let out = root.path().join("r");
    let both = tandem_report::write_report(&[root.path().join("exp")], &out).unwrap();
    let gru_map = out.join("confusion-gru-sequential.svg");
    assert!(both.plots.contains(&gru_map) && gru_map.is_file());
    std::fs::write(out.join("mine.svg"), "<svg/>").unwrap();

    let cnn = tandem_report::write_report(&dirs[..1], &out).unwrap();
    assert!(!gru_map.exists(), "the earlier report's plot of the GRU is gone");
    for plot in &cnn.plots {
        assert!(plot.is_file(), "{plot:?}");
    }
    assert!(out.join("mine.svg").is_file(), "a file the report did not link is kept");
}

#[test]
fn the_hyper_parameter_table_reads_each_runs_manifest_and_marks_what_differs() {
    let root = tempfile::tempdir().unwrap();
    let manifest = |lr: &str, hidden: u32| {
        format!(
            "[data]\ndir = \"/somewhere\"\nmax_len = 32\n\n[[models]]\nname = \"gru\"\narchitecture = \"gru\"\nhidden = {hidden}\n\n[models.train]\nlearning_rate = {lr}\nbatch_size = 64\n"
        )
    };
    for (seed, lr) in [(1, "0.003"), (2, "0.001")] {
        let dir = write_run(root.path(), RunSpec::new("gru", "sequential", seed, 10.0, &[70]));
        std::fs::write(dir.join("manifest.toml"), manifest(lr, 32)).unwrap();
    }
    let dir = write_run(root.path(), RunSpec::new("lstm", "sequential", 1, 10.0, &[70]));
    std::fs::write(dir.join("manifest.toml"), manifest("0.003", 64).replace("\"gru\"", "\"lstm\"")).unwrap();
    let files = tandem_report::write_report(&[root.path().to_path_buf()], &root.path().join("r")).unwrap();
    let md = std::fs::read_to_string(files.markdown).unwrap();
    assert!(md.contains("| key | gru | lstm | differs |"), "{md}");
    assert!(md.contains("| data.max\\_len | 32 | 32 |  |"), "{md}");
    assert!(md.contains("| model.hidden | 32 | 64 | between models |"), "{md}");
    assert!(md.contains("| train.learning\\_rate | 0.001 / 0.003 | 0.003 | between runs |"), "{md}");
    assert!(md.contains("| train.batch\\_size | 64 | 64 |  |"), "{md}");
    assert!(!md.contains("/somewhere"), "the data folder is a path, not a hyper-parameter");
}

#[test]
fn a_time_axis_spanning_more_than_ten_times_is_logarithmic() {
    let root = tempfile::tempdir().unwrap();
    write_run(root.path(), RunSpec::new("cnn", "sequential", 1, 1.0, &[60, 70]));
    write_run(root.path(), RunSpec::new("cnn", "data-parallel-2x-tree", 1, 50.0, &[60, 70]));
    let out = root.path().join("r");
    tandem_report::write_report(&[root.path().to_path_buf()], &out).unwrap();
    let texts = svg_texts(&out.join("accuracy-time.svg"));
    assert!(texts.iter().any(|t| t.trim() == "training time (s), log scale"), "{texts:?}");
    // 1 s to 100 s: labels at round values of each decade.
    for tick in ["1", "10", "100"] {
        assert!(texts.iter().any(|t| t.trim() == tick), "no tick {tick}: {texts:?}");
    }
}
