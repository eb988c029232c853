//! Train/validation/holdout splits: the official train/test split of the full dataset, or a
//! stratified re-split of the official test split, as the caller's [`SplitMode`] asks; the
//! validation set, where asked for, is a stratified share of the training rows.

use std::collections::BTreeMap;
use std::path::Path;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::csv::{read_csv, Sample};
use crate::dir::{verify_md5, TEST_FILE, TEST_MD5, TRAIN_FILE, TRAIN_MD5};
use crate::error::DataError;

/// A training set, a validation set, a holdout set, and a one-line description of where they
/// came from, to be quoted in every report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Splits {
    /// Training samples.
    pub train: Vec<Sample>,
    /// Validation samples, carved from the training rows (empty without a validation share):
    /// what choices made by looking at results read, so the holdout set is reported once.
    pub validation: Vec<Sample>,
    /// Holdout (evaluation) samples.
    pub holdout: Vec<Sample>,
    /// E.g. "AG News test split, 80/20 re-split (seed 42)".
    pub description: String,
}

/// Which train/holdout split to use.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SplitMode {
    /// `train.csv` for training, `test.csv` as holdout; an error without `train.csv`.
    Official,
    /// A stratified, seeded re-split of `test.csv`, even where `train.csv` exists.
    Resplit,
    /// `official` where `train.csv` exists, else `resplit`.
    #[default]
    Auto,
}

impl SplitMode {
    /// The mode a data directory resolves this one to (`auto` looks for `train.csv`).
    pub fn resolve(self, dir: &Path) -> SplitMode {
        match self {
            SplitMode::Auto if dir.join(TRAIN_FILE).is_file() => SplitMode::Official,
            SplitMode::Auto => SplitMode::Resplit,
            other => other,
        }
    }
}

/// How [`load_splits_with`] builds the splits.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default)]
pub struct SplitConfig {
    /// The official split, a re-split of the test split, or whichever the directory has.
    pub mode: SplitMode,
    /// Fraction of each class of `test.csv` put in the holdout set when `train.csv` is absent.
    pub holdout_fraction: f64,
    /// Fraction of each class of the training rows put in the validation set (0: none).
    pub validation_fraction: f64,
    /// Seed of the re-split and of the row limits.
    pub seed: u64,
    /// Check the files against the published MD5s before reading them.
    pub verify_md5: bool,
    /// Keep at most this many training rows (a stratified, seeded subset).
    pub max_train: Option<usize>,
    /// Keep at most this many holdout rows (a stratified, seeded subset).
    pub max_holdout: Option<usize>,
}

impl Default for SplitConfig {
    fn default() -> Self {
        Self {
            mode: SplitMode::Auto,
            holdout_fraction: 0.2,
            validation_fraction: 0.0,
            seed: 42,
            verify_md5: true,
            max_train: None,
            max_holdout: None,
        }
    }
}

/// RNG stream offset used by [`stratified_subset`], so it never shares a stream with
/// [`stratified_split`] for the same seed and class.
const SUBSET_STREAM: u64 = 1 << 32;

/// RNG stream offset of the validation carve, apart from the holdout split's and the subsets'.
const VALIDATION_STREAM: u64 = 2 << 32;

/// Indices of `samples`, grouped by label (ascending).
fn by_class(samples: &[Sample]) -> BTreeMap<usize, Vec<usize>> {
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, s) in samples.iter().enumerate() {
        groups.entry(s.label).or_default().push(i);
    }
    groups
}

/// Shuffles `indices` with the seeded RNG stream for one class.
fn shuffle_class(indices: &mut [usize], seed: u64, stream: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    indices.shuffle(&mut rng);
}

/// Splits samples into (train, holdout), class by class.
///
/// Each class's samples are shuffled with an RNG seeded from `seed` (one stream per class) and
/// the first `round(holdout_fraction * n_class)` go to the holdout set. `holdout_fraction` is
/// clamped to `[0, 1]` (NaN counts as 0). Both outputs keep the input order; together they hold
/// every input sample exactly once. The result depends only on the samples and the seed.
pub fn stratified_split(samples: Vec<Sample>, holdout_fraction: f64, seed: u64) -> (Vec<Sample>, Vec<Sample>) {
    split_by_class(samples, holdout_fraction, seed, 0)
}

/// [`stratified_split`] with the class streams offset by `streams`.
fn split_by_class(samples: Vec<Sample>, fraction: f64, seed: u64, streams: u64) -> (Vec<Sample>, Vec<Sample>) {
    let fraction = sanitize_fraction(fraction);
    let mut in_holdout = vec![false; samples.len()];
    for (label, mut indices) in by_class(&samples) {
        shuffle_class(&mut indices, seed, streams + label as u64);
        let n = indices.len();
        let k = ((fraction * n as f64).round() as usize).min(n);
        for &i in &indices[..k] {
            in_holdout[i] = true;
        }
    }
    let mut train = Vec::with_capacity(samples.len());
    let mut holdout = Vec::new();
    for (sample, hold) in samples.into_iter().zip(in_holdout) {
        if hold {
            holdout.push(sample);
        } else {
            train.push(sample);
        }
    }
    (train, holdout)
}

/// A stratified, seeded subset of at most `max` samples, in input order.
///
/// Each class gets a share proportional to its size (largest-remainder rounding, so the total
/// is exactly `max` when there are more samples than that); the samples within a class are
/// chosen by a seeded shuffle.
pub fn stratified_subset(samples: Vec<Sample>, max: usize, seed: u64) -> Vec<Sample> {
    let n = samples.len();
    if n <= max {
        return samples;
    }
    let groups = by_class(&samples);
    // Floor of each class's proportional share, plus the remainder for tie-breaking.
    let mut quotas: Vec<(usize, usize, u128)> = groups
        .iter()
        .map(|(&label, idx)| {
            let exact = max as u128 * idx.len() as u128;
            (label, (exact / n as u128) as usize, exact % n as u128)
        })
        .collect();
    let assigned: usize = quotas.iter().map(|q| q.1).sum();
    let mut order: Vec<usize> = (0..quotas.len()).collect();
    order.sort_by(|&a, &b| quotas[b].2.cmp(&quotas[a].2).then(quotas[a].0.cmp(&quotas[b].0)));
    for &q in order.iter().take(max - assigned) {
        quotas[q].1 += 1;
    }

    let mut keep = vec![false; n];
    for ((label, mut indices), (_, quota, _)) in groups.into_iter().zip(quotas) {
        shuffle_class(&mut indices, seed, SUBSET_STREAM + label as u64);
        for &i in &indices[..quota.min(indices.len())] {
            keep[i] = true;
        }
    }
    samples.into_iter().zip(keep).filter_map(|(s, k)| k.then_some(s)).collect()
}

fn sanitize_fraction(f: f64) -> f64 {
    if f.is_nan() {
        0.0
    } else {
        f.clamp(0.0, 1.0)
    }
}

/// Loads train/holdout splits from `dir`; see [`load_splits_with`].
pub fn load_splits(dir: &Path, holdout_fraction: f64, seed: u64, verify_md5: bool) -> Result<Splits, DataError> {
    load_splits_with(dir, &SplitConfig { holdout_fraction, seed, verify_md5, ..SplitConfig::default() })
}

/// Loads train/holdout splits from `dir`.
///
/// - [`SplitMode::Official`]: the full dataset as published, `train.csv` for training and
///   `test.csv` as holdout ("AG News full dataset (120,000 train / 7,600 test)");
///   [`DataError::NoOfficialSplit`] without `train.csv`.
/// - [`SplitMode::Resplit`]: a [`stratified_split`] of `test.csv` ("AG News test split, 80/20
///   re-split (seed 42)").
/// - [`SplitMode::Auto`]: official with `dir/train.csv`, else the re-split.
/// - [`DataError::NoData`] when `test.csv` is missing too.
///
/// With `verify_md5`, the files used are first checked against the published MD5s. A validation
/// share, if any, is then carved from the training rows, class by class (its own RNG streams,
/// so the holdout set does not depend on it). The row limits, if any, are applied last with
/// [`stratified_subset`]; both are noted in the description.
pub fn load_splits_with(dir: &Path, config: &SplitConfig) -> Result<Splits, DataError> {
    let train_path = dir.join(TRAIN_FILE);
    let test_path = dir.join(TEST_FILE);
    let fraction = sanitize_fraction(config.holdout_fraction);

    let official = match config.mode.resolve(dir) {
        SplitMode::Official if !train_path.is_file() => {
            return Err(if test_path.is_file() {
                DataError::NoOfficialSplit { dir: dir.to_path_buf() }
            } else {
                DataError::NoData { dir: dir.to_path_buf() }
            })
        }
        mode => mode == SplitMode::Official,
    };
    let (mut train, mut holdout, mut description) = if official {
        if config.verify_md5 {
            verify_md5(&train_path, TRAIN_MD5)?;
            verify_md5(&test_path, TEST_MD5)?;
        }
        let train = read_csv(&train_path)?;
        let holdout = read_csv(&test_path)?;
        let description =
            format!("AG News full dataset ({} train / {} test)", thousands(train.len()), thousands(holdout.len()));
        (train, holdout, description)
    } else if test_path.is_file() {
        if config.verify_md5 {
            verify_md5(&test_path, TEST_MD5)?;
        }
        let (train, holdout) = stratified_split(read_csv(&test_path)?, fraction, config.seed);
        let description = format!(
            "AG News test split, {}/{} re-split (seed {})",
            percent(1.0 - fraction),
            percent(fraction),
            config.seed
        );
        (train, holdout, description)
    } else {
        return Err(DataError::NoData { dir: dir.to_path_buf() });
    };

    let mut validation = Vec::new();
    if config.validation_fraction > 0.0 {
        (train, validation) = split_by_class(train, config.validation_fraction, config.seed, VALIDATION_STREAM);
        description
            .push_str(&format!(", {} % of training rows held out for validation", percent(config.validation_fraction)));
    }
    let mut limited = false;
    if let Some(max) = config.max_train.filter(|&m| m < train.len()) {
        train = stratified_subset(train, max, config.seed);
        limited = true;
    }
    if let Some(max) = config.max_holdout.filter(|&m| m < holdout.len()) {
        holdout = stratified_subset(holdout, max, config.seed);
        limited = true;
    }
    if limited {
        description.push_str(&format!(
            ", limited to {} train / {} holdout rows",
            thousands(train.len()),
            thousands(holdout.len())
        ));
    }
    Ok(Splits { train, validation, holdout, description })
}

/// `0.8` → `"80"`, `0.875` → `"87.5"`.
fn percent(fraction: f64) -> String {
    let tenths = (fraction * 1000.0).round() / 10.0;
    if tenths.fract() == 0.0 {
        format!("{tenths:.0}")
    } else {
        format!("{tenths:.1}")
    }
}

/// `120000` → `"120,000"`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csv::NUM_CLASSES;

    /// `per_class[c]` samples of class c, interleaved, each with a unique title.
    fn synthetic(per_class: [usize; NUM_CLASSES]) -> Vec<Sample> {
        let mut out = Vec::new();
        let max = per_class.iter().copied().max().unwrap_or(0);
        for i in 0..max {
            for (label, &n) in per_class.iter().enumerate() {
                if i < n {
                    out.push(Sample { label, title: format!("c{label} s{i}"), description: String::new() });
                }
            }
        }
        out
    }

    fn counts(samples: &[Sample]) -> [usize; NUM_CLASSES] {
        let mut c = [0; NUM_CLASSES];
        for s in samples {
            c[s.label] += 1;
        }
        c
    }

    fn sorted_titles(samples: &[Sample]) -> Vec<String> {
        let mut t: Vec<_> = samples.iter().map(|s| s.title.clone()).collect();
        t.sort();
        t
    }

    #[test]
    fn stratified_counts() {
        let (train, holdout) = stratified_split(synthetic([100, 50, 10, 3]), 0.2, 42);
        assert_eq!(counts(&holdout), [20, 10, 2, 1]);
        assert_eq!(counts(&train), [80, 40, 8, 2]);
    }

    #[test]
    fn disjoint_and_complete() {
        let all = synthetic([40, 40, 40, 40]);
        let (train, holdout) = stratified_split(all.clone(), 0.25, 7);
        let mut joined = train.clone();
        joined.extend(holdout.iter().cloned());
        assert_eq!(sorted_titles(&joined), sorted_titles(&all));
        let train_titles: std::collections::HashSet<_> = train.iter().map(|s| &s.title).collect();
        assert!(holdout.iter().all(|s| !train_titles.contains(&s.title)));
        // Input order is kept.
        let pos = |t: &String| all.iter().position(|s| &s.title == t).unwrap();
        assert!(train.windows(2).all(|w| pos(&w[0].title) < pos(&w[1].title)));
    }

    #[test]
    fn deterministic_and_seed_dependent() {
        let all = synthetic([50, 50, 50, 50]);
        let a = stratified_split(all.clone(), 0.2, 42);
        let b = stratified_split(all.clone(), 0.2, 42);
        assert_eq!(a, b);
        let c = stratified_split(all, 0.2, 43);
        assert_ne!(a.1, c.1);
        assert_eq!(counts(&a.1), counts(&c.1));
    }

    #[test]
    fn fraction_edge_cases() {
        let all = synthetic([5, 5, 5, 5]);
        assert_eq!(stratified_split(all.clone(), 0.0, 1).1.len(), 0);
        assert_eq!(stratified_split(all.clone(), 1.0, 1).0.len(), 0);
        assert_eq!(stratified_split(all.clone(), 7.0, 1).0.len(), 0);
        assert_eq!(stratified_split(all.clone(), f64::NAN, 1).1.len(), 0);
        assert_eq!(stratified_split(Vec::new(), 0.2, 1), (vec![], vec![]));
    }

    #[test]
    fn subset_is_stratified_exact_and_deterministic() {
        let all = synthetic([100, 50, 30, 20]);
        let sub = stratified_subset(all.clone(), 20, 3);
        assert_eq!(sub.len(), 20);
        assert_eq!(counts(&sub), [10, 5, 3, 2]);
        assert_eq!(sub, stratified_subset(all.clone(), 20, 3));
        assert_ne!(sub, stratified_subset(all.clone(), 20, 4));
        let sub = stratified_subset(all.clone(), 7, 3);
        assert_eq!(sub.len(), 7);
        assert_eq!(stratified_subset(all.clone(), 1000, 3), all);
        assert!(stratified_subset(all, 0, 3).is_empty());
    }

    #[test]
    fn formatting_helpers() {
        assert_eq!(percent(0.2), "20");
        assert_eq!(percent(0.8), "80");
        assert_eq!(percent(0.125), "12.5");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(7600), "7,600");
        assert_eq!(thousands(120_000), "120,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    fn write_csv(path: &Path, samples: &[Sample]) {
        let body: String =
            samples.iter().map(|s| format!("\"{}\",\"{}\",\"{}\"\n", s.label + 1, s.title, s.description)).collect();
        std::fs::write(path, body).unwrap();
    }

    #[test]
    fn load_from_test_only_dir() {
        let dir = tempfile::tempdir().unwrap();
        write_csv(&dir.path().join(TEST_FILE), &synthetic([10, 10, 10, 10]));
        let s = load_splits(dir.path(), 0.2, 42, false).unwrap();
        assert_eq!((s.train.len(), s.holdout.len()), (32, 8));
        assert_eq!(s.description, "AG News test split, 80/20 re-split (seed 42)");

        // The synthetic file is not the published one.
        let msg = load_splits(dir.path(), 0.2, 42, true).unwrap_err().to_string();
        assert!(msg.contains("test.csv") && msg.contains(TEST_MD5), "{msg}");

        let cfg = SplitConfig {
            mode: SplitMode::Auto,
            holdout_fraction: 0.25,
            validation_fraction: 0.0,
            seed: 1,
            verify_md5: false,
            max_train: Some(8),
            max_holdout: Some(4),
        };
        let s = load_splits_with(dir.path(), &cfg).unwrap();
        assert_eq!((s.train.len(), s.holdout.len()), (8, 4));
        assert_eq!(counts(&s.train), [2, 2, 2, 2]);
        assert_eq!(s.description, "AG News test split, 75/25 re-split (seed 1), limited to 8 train / 4 holdout rows");
    }

    #[test]
    fn validation_is_a_stratified_share_of_training_rows_and_leaves_holdout_alone() {
        let dir = tempfile::tempdir().unwrap();
        write_csv(&dir.path().join(TEST_FILE), &synthetic([20, 20, 20, 20]));
        let with = |validation_fraction| {
            let cfg = SplitConfig { validation_fraction, verify_md5: false, ..SplitConfig::default() };
            load_splits_with(dir.path(), &cfg).unwrap()
        };
        let (plain, carved) = (with(0.0), with(0.25));
        assert!(plain.validation.is_empty());
        assert_eq!(carved.holdout, plain.holdout);
        assert_eq!(counts(&carved.validation), [4, 4, 4, 4]);
        assert_eq!(counts(&carved.train), [12, 12, 12, 12]);
        let mut joined = carved.train.clone();
        joined.extend(carved.validation.iter().cloned());
        assert_eq!(sorted_titles(&joined), sorted_titles(&plain.train));
        assert_eq!(
            carved.description,
            "AG News test split, 80/20 re-split (seed 42), 25 % of training rows held out for validation"
        );
    }

    #[test]
    fn load_from_full_dir() {
        let dir = tempfile::tempdir().unwrap();
        write_csv(&dir.path().join(TRAIN_FILE), &synthetic([6, 6, 6, 6]));
        write_csv(&dir.path().join(TEST_FILE), &synthetic([2, 2, 2, 2]));
        let s = load_splits(dir.path(), 0.2, 42, false).unwrap();
        assert_eq!((s.train.len(), s.holdout.len()), (24, 8));
        assert_eq!(s.description, "AG News full dataset (24 train / 8 test)");
        let msg = load_splits(dir.path(), 0.2, 42, true).unwrap_err().to_string();
        assert!(msg.contains("train.csv") && msg.contains(TRAIN_MD5), "{msg}");
    }

    #[test]
    fn the_split_mode_decides_and_official_never_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        write_csv(&dir.path().join(TEST_FILE), &synthetic([10, 10, 10, 10]));
        let with = |mode| load_splits_with(dir.path(), &SplitConfig { mode, verify_md5: false, ..Default::default() });
        let msg = with(SplitMode::Official).unwrap_err().to_string();
        assert!(msg.contains("no train.csv") && msg.contains("split = \"resplit\""), "{msg}");
        assert_eq!(with(SplitMode::Auto).unwrap(), with(SplitMode::Resplit).unwrap());

        write_csv(&dir.path().join(TRAIN_FILE), &synthetic([6, 6, 6, 6]));
        assert_eq!(with(SplitMode::Official).unwrap().train.len(), 24);
        assert_eq!(with(SplitMode::Auto).unwrap(), with(SplitMode::Official).unwrap());
        // A re-split ignores train.csv: 80 % of test.csv's 40 rows.
        let resplit = with(SplitMode::Resplit).unwrap();
        assert_eq!((resplit.train.len(), resplit.holdout.len()), (32, 8));
        assert!(resplit.description.contains("re-split"), "{}", resplit.description);
    }

    #[test]
    fn load_from_empty_dir() {
        let dir = tempfile::tempdir().unwrap();
        let msg = load_splits(dir.path(), 0.2, 42, false).unwrap_err().to_string();
        assert!(msg.contains("no AG News data found"), "{msg}");
        assert!(msg.contains(&format!("tandem data fetch --dir {}", dir.path().display())), "{msg}");
    }
}
