//! Where tests find the real AG News data, and what they do without it.
//!
//! Depends on the standard library only, so that tandem-data's own tests can include this file
//! (`#[path]`) without depending on this crate.

use std::path::{Path, PathBuf};

/// The AG News folder for a test that needs the real data: `$TANDEM_DATA_DIR` (a relative path
/// is taken from the workspace root), else `datasets/ag_news` in the workspace (where
/// `tandem data fetch` puts it). Without a `test.csv` there, prints that `test` is skipped and
/// returns `None`; when the `CI` environment variable is set (CI requires the data) it panics.
pub fn ag_news_dir(test: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().unwrap_or(root);
    let dir = match std::env::var_os("TANDEM_DATA_DIR") {
        Some(d) if !d.is_empty() => root.join(d),
        _ => root.join("datasets/ag_news"),
    };
    if dir.join("test.csv").is_file() {
        return Some(dir);
    }
    let message = format!("no AG News data at {} (set TANDEM_DATA_DIR)", dir.display());
    if std::env::var_os("CI").is_some() {
        panic!("{test}: {message}; CI requires the data");
    }
    // Straight to stderr: the test harness captures `eprintln!` of passing tests.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{test} skipped: {message}\n").as_bytes());
    None
}
