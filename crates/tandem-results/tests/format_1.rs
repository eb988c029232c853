//! Results folders of format 1, whose strategy figures are untyped `extra` maps, as the code of
//! that format wrote them (`tests/fixtures/format-1.toml`), read into the typed figures: every
//! run, every record, every key and value.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tandem_results::{find_runs, legacy, PipelineFigures, Run, RunState, StrategyFigures};

const FIXTURE: &str = "tests/fixtures/format-1";

fn runs() -> Vec<Run> {
    find_runs(&[PathBuf::from(FIXTURE)]).unwrap()
}

/// The run whose id starts with `prefix`.
fn run<'a>(runs: &'a [Run], prefix: &str) -> &'a Run {
    runs.iter().find(|r| r.name().starts_with(prefix)).unwrap_or_else(|| panic!("no run {prefix}"))
}

/// A file's JSON objects as format 1 wrote them: one per line of `epochs.jsonl`, or the summary.
fn written(path: &Path) -> Vec<Map<String, Value>> {
    let text = std::fs::read_to_string(path).unwrap();
    match path.extension().and_then(|e| e.to_str()) {
        Some("jsonl") => text.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
        _ => vec![serde_json::from_str(&text).unwrap()],
    }
}

/// Typed figures as format 1's flat map: the pipeline's parts merged into its own keys.
fn flat(figures: &StrategyFigures) -> Value {
    Value::Object(match figures {
        StrategyFigures::Sequential => Map::new(),
        StrategyFigures::DataParallel(figures) => as_object(figures),
        StrategyFigures::Pipeline(figures) => {
            let mut map = as_object(&PipelineFigures { sync: None, across_ranks: None, ..figures.clone() });
            if let Some(sync) = &figures.sync {
                map.extend(as_object(sync));
            }
            if let Some(ranks) = &figures.across_ranks {
                map.extend(as_object(ranks));
            }
            map
        }
    })
}

/// `object` without the figures (`extra` in format 1, `figures` and `format_version` now).
fn rest(mut object: Map<String, Value>) -> Map<String, Value> {
    for key in ["extra", "figures", "format_version"] {
        object.remove(key);
    }
    object
}

fn as_object<T: serde::Serialize>(value: &T) -> Map<String, Value> {
    match serde_json::to_value(value).unwrap() {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

#[test]
fn every_run_and_record_of_format_1_loads() {
    let runs = runs();
    assert_eq!(runs.len(), 6);
    for run in &runs {
        assert_eq!(run.state, RunState::Finished, "{}", run.name());
        assert_eq!(run.summary.as_ref().unwrap().format_version, legacy::FORMAT);
        assert_eq!(run.epochs.len(), 4, "{}: 2 passes, 2 evaluation points each", run.name());
    }
    let kinds = |prefix: &str| run(&runs, prefix).epochs.iter().map(|e| e.figures.clone()).collect::<Vec<_>>();
    assert!(kinds("gru-sequential").iter().all(|f| *f == StrategyFigures::Sequential));
    assert!(kinds("gru-data-parallel").iter().all(|f| f.data_parallel().is_some()));
    assert!(kinds("gru-model-parallel").iter().all(|f| f.pipeline().is_some() && f.sync().is_none()));
    for predictor in ["static", "holt", "ema"] {
        let figures = kinds(&format!("gru-predictive-sync-{predictor}"));
        assert!(figures.iter().all(|f| f.sync().is_some_and(|s| s.predictor == predictor)), "{predictor}");
    }
}

#[test]
fn the_typed_figures_hold_every_key_and_value_format_1_wrote() {
    for run in runs() {
        let records = written(&run.dir.join("epochs.jsonl"));
        assert_eq!(records.len(), run.epochs.len());
        for (record, old) in run.epochs.iter().zip(records) {
            assert_eq!(flat(&record.figures), old["extra"], "{}: figures", run.name());
            assert_eq!(rest(as_object(record)), rest(old), "{}: the rest of the record", run.name());
        }
        let summary = run.summary.as_ref().unwrap();
        let old = written(&run.dir.join("summary.json")).remove(0);
        assert_eq!(flat(&summary.figures), old["extra"], "{}: summary figures", run.name());
        assert_eq!(summary.figures, run.epochs.last().unwrap().figures, "the last record's");
        assert_eq!(rest(as_object(summary)), rest(old), "{}: the rest of the summary", run.name());
    }
}

#[test]
fn figures_of_each_kind_read_as_recorded() {
    let runs = runs();
    let last = |prefix: &str| run(&runs, prefix).last_figures().unwrap().clone();

    let dp = last("gru-data-parallel");
    let dp = dp.data_parallel().unwrap();
    assert_eq!((dp.replicas, dp.all_reduce.as_str(), dp.ranks, dp.sparse_embedding), (2, "tree", 1, true));
    assert_eq!((dp.bytes_per_step, dp.replica_max_abs_difference), (12912.0, 0.0));
    assert_eq!(dp.communication_share, dp.all_reduce_share);
    let bytes = run(&runs, "gru-data-parallel").bytes_total().unwrap();
    assert_eq!(bytes, 4.0 * (12736.0 + 12912.0 + 12736.0 + 12912.0), "bytes per step × 4 steps, 4 records");

    let mp = last("gru-model-parallel");
    let mp = mp.pipeline().unwrap();
    assert_eq!((mp.stages, mp.cuts.as_slice(), mp.schedule.as_str(), mp.micro_batches), (2, &[2][..], "gpipe", 3));
    assert_eq!((mp.links_per_step.len(), mp.links_per_step[0].forward.messages), (1, 3.0));
    assert_eq!(mp.stage_seconds().len(), 2);
    assert_eq!((mp.sync.as_ref(), mp.across_ranks.as_ref()), (None, None));

    let ema = last("gru-predictive-sync-ema");
    let ema = ema.sync().unwrap();
    assert_eq!((ema.trigger.as_str(), ema.replayed_samples, ema.control_bytes_per_step), ("adaptive", 30, 12.0));
    assert_eq!(ema.horizons, [(1, 2)].into());
    assert_eq!(ema.predict_seconds.len(), 2, "one per stage");
    assert!(ema.relative_error_mean.is_some());
    let fixed = last("gru-predictive-sync-static");
    assert_eq!(fixed.sync().unwrap().relative_error_mean, None, "a static predictor makes no forecast");
    assert_eq!(run(&runs, "gru-predictive-sync-holt").sync_steps(), Some(6.0), "2 + 1 + 1 + 2 sync steps");
    assert_eq!(run(&runs, "gru-model-parallel").sync_steps(), None);
}
