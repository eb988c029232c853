//! Data-directory layout, published checksums and directory resolution.

use std::io::Read;
use std::path::{Path, PathBuf};

use md5::{Digest, Md5};

use crate::error::DataError;

/// File name of the training split.
pub const TRAIN_FILE: &str = "train.csv";
/// File name of the official test split.
pub const TEST_FILE: &str = "test.csv";
/// Published MD5 of the original `train.csv`.
pub const TRAIN_MD5: &str = "b1a00f826fdfbd249f79597b59e1dc12";
/// Published MD5 of the original `test.csv`.
pub const TEST_MD5: &str = "d52ea96a97a2d943681189a97654912d";
/// Rows in the original `train.csv` (30,000 per class).
pub const TRAIN_ROWS: usize = 120_000;
/// Rows in the original `test.csv` (1,900 per class).
pub const TEST_ROWS: usize = 7_600;

/// Environment variable naming the data directory.
pub const DATA_DIR_ENV: &str = "TANDEM_DATA_DIR";
/// Data directory used when neither the manifest nor the environment names one.
pub const DEFAULT_DATA_DIR: &str = "datasets/ag_news";

/// The data directory to use: the manifest's value if given, else `$TANDEM_DATA_DIR` if set and
/// non-empty, else `datasets/ag_news`. Relative paths are returned as they are.
pub fn resolve_data_dir(from_manifest: Option<&Path>) -> PathBuf {
    if let Some(dir) = from_manifest {
        return dir.to_path_buf();
    }
    match std::env::var_os(DATA_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(DEFAULT_DATA_DIR),
    }
}

/// Lowercase hex MD5 of a file, read in a streaming fashion.
pub fn md5_file(path: &Path) -> Result<String, DataError> {
    let mut file = std::fs::File::open(path).map_err(|e| DataError::io(path, "cannot open", e))?;
    let mut hasher = Md5::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).map_err(|e| DataError::io(path, "cannot read", e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// Checks `path` against an expected MD5, returning [`DataError::Checksum`] on mismatch.
pub fn verify_md5(path: &Path, expected: &str) -> Result<(), DataError> {
    let actual = md5_file(path)?;
    if actual.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        Err(DataError::Checksum { path: path.to_path_buf(), expected: expected.to_ascii_lowercase(), actual })
    }
}

/// The published MD5 for a file name of the dataset (`train.csv` or `test.csv`).
pub fn published_md5(file_name: &str) -> Option<&'static str> {
    match file_name {
        TRAIN_FILE => Some(TRAIN_MD5),
        TEST_FILE => Some(TEST_MD5),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_value_wins() {
        assert_eq!(resolve_data_dir(Some(Path::new("/x/y"))), PathBuf::from("/x/y"));
        // Without a manifest value the result is the env var or the default; never empty.
        assert!(!resolve_data_dir(None).as_os_str().is_empty());
    }

    #[test]
    fn md5_of_known_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.txt");
        std::fs::write(&path, "hello\n").unwrap();
        assert_eq!(md5_file(&path).unwrap(), "b1946ac92492d2347c6235b4d2611184");
        verify_md5(&path, "B1946AC92492D2347C6235B4D2611184").unwrap();
        let msg = verify_md5(&path, TEST_MD5).unwrap_err().to_string();
        assert!(msg.contains("f.txt") && msg.contains(TEST_MD5) && msg.contains("b1946ac9"), "{msg}");
        let msg = md5_file(&dir.path().join("nope.csv")).unwrap_err().to_string();
        assert!(msg.contains("nope.csv"), "{msg}");
    }
}
