//! The current format: a run folder written with the typed figures reads back unchanged, and a
//! format newer than this build is refused with a clear message.

use std::path::{Path, PathBuf};

use tandem_results::{
    find_runs, read_run, write_epochs, write_json, PipelineRanks, Run, RunState, StrategyFigures, FORMAT_VERSION,
};

/// The format-1 fixture's runs, as typed values (the figures of every kind).
fn fixture_runs() -> Vec<Run> {
    find_runs(&[PathBuf::from("tests/fixtures/format-1")]).unwrap()
}

/// Writes `run` to `<root>/<its name>` in the current format.
fn write(root: &Path, run: &Run) -> PathBuf {
    let dir = root.join(run.name());
    std::fs::create_dir_all(&dir).unwrap();
    let summary = tandem_results::RunSummary { format_version: FORMAT_VERSION, ..run.summary.clone().unwrap() };
    write_epochs(&dir.join("epochs.jsonl"), &run.epochs).unwrap();
    write_json(&dir.join("summary.json"), &summary).unwrap();
    dir
}

#[test]
fn a_run_folder_written_in_the_current_format_reads_back_unchanged() {
    let root = tempfile::tempdir().unwrap();
    let mut runs = fixture_runs();
    // The multi-process parts too: a data-parallel run over 2 ranks, a pipeline whose stages
    // sync predictively over 2 ranks.
    for run in &mut runs {
        for record in &mut run.epochs {
            match &mut record.figures {
                StrategyFigures::DataParallel(figures) => (figures.ranks, figures.cross_rank_seconds) = (2, 0.25),
                StrategyFigures::Pipeline(figures) if figures.sync.is_some() => {
                    figures.across_ranks = Some(PipelineRanks {
                        ranks: 2,
                        stages_per_rank: 1,
                        cross_rank_bytes_per_step: 4096.0,
                        cross_rank_seconds: 0.5,
                    })
                }
                _ => {}
            }
        }
    }
    for run in &runs {
        let dir = write(root.path(), run);
        let read = read_run(&dir);
        assert_eq!(read.state, RunState::Finished);
        assert_eq!(read.epochs, run.epochs, "{}", run.name());
        let summary = read.summary.unwrap();
        assert_eq!(summary.format_version, FORMAT_VERSION);
        assert_eq!(summary.figures, run.summary.as_ref().unwrap().figures);
        let text = std::fs::read_to_string(dir.join("summary.json")).unwrap();
        assert!(text.contains("\"figures\": ") && !text.contains("\"extra\""), "{text}");
    }
}

#[test]
fn figures_are_tagged_by_kind_in_json() {
    let runs = fixture_runs();
    let json = |prefix: &str| {
        let run = runs.iter().find(|r| r.name().starts_with(prefix)).unwrap();
        serde_json::to_value(&run.epochs[0].figures).unwrap()
    };
    assert_eq!(json("gru-sequential"), serde_json::json!("sequential"));
    assert_eq!(json("gru-data-parallel")["data-parallel"]["replicas"], 2);
    assert_eq!(json("gru-model-parallel")["pipeline"]["stages"], 2);
    assert!(json("gru-model-parallel")["pipeline"]["sync"].is_null(), "no sync part without predictive sync");
    assert_eq!(json("gru-predictive-sync-holt")["pipeline"]["sync"]["predictor"], "holt");
}

#[test]
fn a_newer_format_is_unreadable_and_says_so() {
    let root = tempfile::tempdir().unwrap();
    let run = fixture_runs().remove(0);
    let dir = write(root.path(), &run);
    let newer = tandem_results::RunSummary { format_version: FORMAT_VERSION + 1, ..run.summary.clone().unwrap() };
    write_json(&dir.join("summary.json"), &newer).unwrap();
    match read_run(&dir).state {
        RunState::Unreadable(message) => assert!(message.contains("is newer than this build reads"), "{message}"),
        other => panic!("a newer format must be unreadable, got {other:?}"),
    }
}
