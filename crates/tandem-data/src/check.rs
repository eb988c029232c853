//! Checking a data directory: row counts, class balance and checksums.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::csv::{read_csv, CLASS_NAMES, NUM_CLASSES};
use crate::dir::{md5_file, published_md5, TEST_FILE, TRAIN_FILE};
use crate::error::DataError;
use crate::split::thousands;

/// The check of one CSV file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileCheck {
    /// File name (`train.csv` or `test.csv`).
    pub file: String,
    /// Full path.
    pub path: PathBuf,
    /// Number of records.
    pub rows: usize,
    /// Records per 0-based class label.
    pub per_class: [usize; NUM_CLASSES],
    /// MD5 of the file (lowercase hex).
    pub md5: String,
    /// Published MD5 of the original file.
    pub expected_md5: String,
    /// Whether `md5` equals `expected_md5`.
    pub md5_ok: bool,
}

/// The result of [`check_dir`]; `Display` prints a short table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// The directory checked.
    pub dir: PathBuf,
    /// One entry per CSV found (`train.csv` first).
    pub files: Vec<FileCheck>,
}

impl CheckReport {
    /// True when every file found matches its published MD5.
    pub fn all_ok(&self) -> bool {
        self.files.iter().all(|f| f.md5_ok)
    }

    /// True when `train.csv` is present (the full dataset, rather than a re-split of test.csv).
    pub fn has_train(&self) -> bool {
        self.files.iter().any(|f| f.file == TRAIN_FILE)
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "AG News data in {}", self.dir.display())?;
        write!(f, "{:<10} {:>8}", "file", "rows")?;
        for name in CLASS_NAMES {
            write!(f, " {name:>8}")?;
        }
        writeln!(f, "  md5")?;
        for file in &self.files {
            write!(f, "{:<10} {:>8}", file.file, thousands(file.rows))?;
            for n in file.per_class {
                write!(f, " {:>8}", thousands(n))?;
            }
            if file.md5_ok {
                writeln!(f, "  {} ok", file.md5)?;
            } else {
                writeln!(f, "  {} MISMATCH (published: {})", file.md5, file.expected_md5)?;
            }
        }
        if self.has_train() {
            write!(f, "mode: full dataset (train.csv for training, test.csv as holdout)")
        } else {
            write!(f, "mode: test split only (train/holdout are re-split from test.csv)")
        }
    }
}

/// Reads whichever of `train.csv` and `test.csv` exist in `dir` and reports rows, per-class
/// counts and checksums. Errors if neither exists or a file is malformed.
pub fn check_dir(dir: &Path) -> Result<CheckReport, DataError> {
    let mut files = Vec::new();
    for name in [TRAIN_FILE, TEST_FILE] {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        let md5 = md5_file(&path)?;
        let samples = read_csv(&path)?;
        let mut per_class = [0; NUM_CLASSES];
        for s in &samples {
            per_class[s.label] += 1;
        }
        let expected_md5 = published_md5(name).unwrap_or_default().to_string();
        files.push(FileCheck {
            file: name.to_string(),
            md5_ok: md5 == expected_md5,
            path,
            rows: samples.len(),
            per_class,
            md5,
            expected_md5,
        });
    }
    if files.is_empty() {
        return Err(DataError::NoData { dir: dir.to_path_buf() });
    }
    Ok(CheckReport { dir: dir.to_path_buf(), files })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_counts_and_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(TEST_FILE), "1,a,b\n1,c,d\n4,e,f\n").unwrap();
        let report = check_dir(dir.path()).unwrap();
        assert_eq!(report.files.len(), 1);
        let f = &report.files[0];
        assert_eq!((f.rows, f.per_class), (3, [2, 0, 0, 1]));
        assert!(!f.md5_ok && !report.all_ok() && !report.has_train());
        let text = report.to_string();
        assert!(text.contains("test.csv") && text.contains("MISMATCH"), "{text}");
        assert!(text.contains("Sci/Tech") && text.contains("test split only"), "{text}");
    }

    #[test]
    fn errors() {
        let dir = tempfile::tempdir().unwrap();
        let msg = check_dir(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("no AG News data found"), "{msg}");
        std::fs::write(dir.path().join(TRAIN_FILE), "1,a,b\n9,c,d\n").unwrap();
        let msg = check_dir(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("train.csv") && msg.contains("line 2"), "{msg}");
    }
}
