//! The report of results folders written in format 1 (untyped strategy figures), read through
//! the typed figures, is the report the code of that format wrote, byte for byte.

use std::path::PathBuf;

/// The fixture's run folders, relative to this crate (tests run in its folder), as the expected
/// report was made: `tandem report ../tandem-results/tests/fixtures/format-1` in this folder.
const FIXTURE: &str = "../tandem-results/tests/fixtures/format-1";

#[test]
fn a_format_1_folder_gives_the_report_format_1_code_wrote() {
    let out = tempfile::tempdir().unwrap();
    let files = tandem_report::write_report(&[PathBuf::from(FIXTURE)], out.path()).unwrap();
    assert_eq!((files.finished, files.not_finished), (6, 0));
    let expected = std::fs::read_to_string("tests/fixtures/format-1-report.md").unwrap();
    let got = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(got == expected, "report.md differs from the expected one:\n{got}");
}
