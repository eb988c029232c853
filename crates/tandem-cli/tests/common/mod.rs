//! Helpers shared by the `tandem` binary's tests.
#![allow(dead_code)] // each test file uses a part

use std::path::PathBuf;
use std::process::Command;

/// Runs `tandem args…`: (success, stdout, stderr).
pub fn tandem(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem")).args(args).output().expect("run tandem");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// The AG News directory (see [`tandem_testing::ag_news_dir`]), naming the calling test.
#[track_caller]
pub fn data_dir() -> Option<PathBuf> {
    tandem_testing::ag_news_dir(&std::panic::Location::caller().to_string())
}
