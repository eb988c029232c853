//! Helpers shared by the `tandem` binary's tests.
#![allow(dead_code)] // each test file uses a part

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `tandem args…`: (success, stdout, stderr).
pub fn tandem(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem")).args(args).output().expect("run tandem");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// `$TANDEM_DATA_DIR` (relative to the workspace root) or `../shared/datasets/ag_news`, if it holds the data.
pub fn data_dir() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = match std::env::var_os("TANDEM_DATA_DIR") {
        Some(d) if Path::new(&d).is_absolute() => d.into(),
        Some(d) => root.join(d),
        None => root.join("../shared/datasets/ag_news"),
    };
    dir.join("test.csv").exists().then_some(dir)
}
