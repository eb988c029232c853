//! AG News data for Tandem: CSV reading, tokenization and vocabulary, seeded stratified splits,
//! Burn batches, data-directory checks and (feature `fetch`) downloading.
//!
//! The data directory holds `test.csv` (the official test split) and optionally `train.csv`.
//! With both, the published train/test split is used; with only `test.csv`, a stratified,
//! seeded train/holdout split is carved out of it, and [`Splits::description`] says so.

pub mod batch;
pub mod check;
pub mod csv;
pub mod dir;
pub mod error;
#[cfg(feature = "fetch")]
pub mod fetch;
pub mod split;
pub mod text;
pub mod vocab;

pub use batch::{batches, epoch_order, Batch, Encoded};
pub use check::{check_dir, CheckReport, FileCheck};
pub use csv::{clean_text, parse_csv, read_csv, Sample, CLASS_NAMES, NUM_CLASSES};
pub use dir::{
    md5_file, resolve_data_dir, verify_md5, DATA_DIR_ENV, DEFAULT_DATA_DIR, TEST_FILE, TEST_MD5, TEST_ROWS, TRAIN_FILE,
    TRAIN_MD5, TRAIN_ROWS,
};
pub use error::DataError;
#[cfg(feature = "fetch")]
pub use fetch::{fetch, fetch_with, FetchOptions, FetchReport, DEFAULT_ARCHIVE_URL};
pub use split::{
    load_splits, load_splits_with, stratified_split, stratified_subset, thousands, SplitConfig, SplitMode, Splits,
};
pub use text::tokenize;
pub use vocab::{Vocab, VocabConfig};
