//! The report of results folders written in format 1 (untyped strategy figures), read through
//! the typed figures, gives the figures the code of that format wrote: every line of that
//! report's tables and every one of its paragraphs is in the new report, which only adds sections.
//! The fixture's changes since: a single CPU device reads "Cpu, 1 thread", not "1 × Cpu, 1
//! thread each" (so the devices column, no longer all numbers, is aligned left); the protocols
//! table has a checkpoint column ("—" for these folders, which did not record it) and its
//! paragraph counts predictors' state and explains the column.

use std::path::PathBuf;

/// The fixture's run folders, relative to this crate (tests run in its folder), as the expected
/// report was made: `tandem report ../tandem-results/tests/fixtures/format-1` in this folder.
const FIXTURE: &str = "../tandem-results/tests/fixtures/format-1";

#[test]
fn a_format_1_folder_gives_the_figures_format_1_code_wrote() {
    let out = tempfile::tempdir().unwrap();
    let files = tandem_report::write_report(&[PathBuf::from(FIXTURE)], out.path()).unwrap();
    assert_eq!((files.finished, files.not_finished), (6, 0));
    let expected = std::fs::read_to_string("tests/fixtures/format-1-report.md").unwrap();
    let got = std::fs::read_to_string(&files.markdown).unwrap();
    let lines: Vec<&str> = expected.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.iter().filter(|l| l.starts_with("| ")).count() >= 15, "the fixture's tables are read");
    for line in lines {
        assert!(got.lines().any(|g| g == line), "report.md lacks the line {line:?}:\n{got}");
    }
    // Small floats of the settings table read as numbers, not as TOML writes them (0.00000001).
    assert!(got.contains("| train.epsilon | 1e-8 |"), "{got}");
}
