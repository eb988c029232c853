//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while reading, checking or fetching AG News data.
///
/// Every variant that concerns a file names that file in its `Display` text, and parse errors
/// also give the 1-based line number.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file could not be opened, read or written.
    #[error("{}: {action}: {source}", path.display())]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// What was being done ("cannot read", "cannot write", ...).
        action: &'static str,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A CSV file holds no records at all.
    #[error("{}: file is empty (expected AG News CSV rows)", path.display())]
    Empty {
        /// The file concerned.
        path: PathBuf,
    },

    /// A CSV file is malformed at a given line.
    #[error("{}, line {line}: {message}", path.display())]
    Parse {
        /// The file concerned.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },

    /// A file's MD5 digest differs from the published one.
    #[error(
        "{}: md5 mismatch: expected {expected}, got {actual} (the file is corrupt, truncated or not the original)",
        path.display()
    )]
    Checksum {
        /// The file concerned.
        path: PathBuf,
        /// The published digest (lowercase hex).
        expected: String,
        /// The digest of the file on disk (lowercase hex).
        actual: String,
    },

    /// Neither `train.csv` nor `test.csv` exists in the data directory.
    #[error(
        "no AG News data found in {dir} (expected test.csv, and optionally train.csv); \
         run `tandem data fetch --dir {dir}` or point TANDEM_DATA_DIR / the manifest's `data.dir` at a directory holding them",
        dir = dir.display()
    )]
    NoData {
        /// The directory that was searched.
        dir: PathBuf,
    },

    /// The official split was asked for, and `train.csv` is missing.
    #[error(
        "`split = \"official\"` needs the full dataset, and {dir} has no train.csv (only the test split); \
         run `tandem data fetch --dir {dir}` to get it, or set `split = \"resplit\"` to carve a split from test.csv",
        dir = dir.display()
    )]
    NoOfficialSplit {
        /// The directory that was searched.
        dir: PathBuf,
    },

    /// A vocabulary file is not a valid Tandem vocabulary.
    #[error("{}: invalid vocabulary file: {message}", path.display())]
    Vocab {
        /// The file concerned.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// Downloading or unpacking the dataset archive failed.
    #[error("fetching {url} failed: {message}; nothing was written")]
    Fetch {
        /// The archive URL.
        url: String,
        /// What failed.
        message: String,
    },
}

impl DataError {
    /// Builds an [`DataError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, action: &'static str, source: std::io::Error) -> Self {
        DataError::Io { path: path.into(), action, source }
    }
}
