//! Tests on the real AG News test split. They skip (with a message) when it is absent.
//!
//! The data directory is `$TANDEM_DATA_DIR` (relative paths are taken from the workspace root),
//! or `<workspace>/datasets/ag_news`; without the data they say they are skipped, and fail when `CI` is set.

use std::path::PathBuf;

use tandem_data::{
    check_dir, load_splits, load_splits_with, md5_file, read_csv, Encoded, SplitConfig, Vocab, VocabConfig,
    NUM_CLASSES, TEST_FILE, TEST_MD5, TEST_ROWS,
};

#[path = "../../tandem-testing/src/data_dir.rs"]
mod data_dir;

/// The data directory if it holds test.csv; says that `test` is skipped otherwise (fails on CI).
fn real_dir(test: &str) -> Option<PathBuf> {
    data_dir::ag_news_dir(test)
}

fn counts(samples: &[tandem_data::Sample]) -> [usize; NUM_CLASSES] {
    let mut c = [0; NUM_CLASSES];
    for s in samples {
        c[s.label] += 1;
    }
    c
}

#[test]
fn real_test_csv_reads_and_verifies() {
    let Some(dir) = real_dir("real_test_csv_reads_and_verifies") else {
        return;
    };
    let path = dir.join(TEST_FILE);
    assert_eq!(md5_file(&path).unwrap(), TEST_MD5);
    let samples = read_csv(&path).unwrap();
    assert_eq!(samples.len(), TEST_ROWS);
    assert_eq!(counts(&samples), [1900; NUM_CLASSES]);
    // First record, with its " #36;"-free text; second, with "\" line breaks and " #36;".
    assert_eq!(samples[0].label, 2);
    assert_eq!(samples[0].title, "Fears for T N pension after talks");
    assert!(samples[1]
        .description
        .contains("A second team of rocketeers competing for the $10 million Ansari X Prize"));
    // No entity residue of the forms the cleaner handles.
    for s in &samples {
        let text = s.text();
        for residue in [" #39;", " quot;", "&lt;", "&amp;", " #36;"] {
            assert!(!text.contains(residue), "{residue:?} left in {text:?}");
        }
    }
}

#[test]
fn real_resplit_80_20() {
    let Some(dir) = real_dir("real_resplit_80_20") else {
        return;
    };
    if dir.join("train.csv").is_file() {
        println!("skipping real_resplit_80_20: {} has train.csv", dir.display());
        return;
    }
    let splits = load_splits(&dir, 0.2, 42, true).unwrap();
    assert_eq!(splits.train.len(), 6080);
    assert_eq!(splits.holdout.len(), 1520);
    assert_eq!(counts(&splits.holdout), [380; NUM_CLASSES]);
    assert_eq!(counts(&splits.train), [1520; NUM_CLASSES]);
    assert_eq!(splits.description, "AG News test split, 80/20 re-split (seed 42)");
    let again = load_splits(&dir, 0.2, 42, false).unwrap();
    assert_eq!(again.holdout, splits.holdout);

    let small =
        load_splits_with(&dir, &SplitConfig { max_train: Some(400), max_holdout: Some(100), ..SplitConfig::default() })
            .unwrap();
    assert_eq!(counts(&small.train), [100; NUM_CLASSES]);
    assert_eq!(counts(&small.holdout), [25; NUM_CLASSES]);

    // Vocabulary from the training part only, then encoding.
    let vocab = Vocab::build(splits.train.iter().map(|s| s.text()), &VocabConfig::default());
    assert!(vocab.len() > 5000 && vocab.len() <= 20_000, "{}", vocab.len());
    let enc = Encoded::new(&splits.holdout, &vocab, 64);
    assert_eq!(enc.len(), 1520);
    assert!(enc.lengths.iter().all(|&l| (1..=64).contains(&l)));
}

#[test]
fn real_check_dir() {
    let Some(dir) = real_dir("real_check_dir") else {
        return;
    };
    let report = check_dir(&dir).unwrap();
    let test = report.files.iter().find(|f| f.file == TEST_FILE).unwrap();
    assert!(test.md5_ok);
    assert_eq!(test.rows, TEST_ROWS);
    assert_eq!(test.per_class, [1900; NUM_CLASSES]);
    println!("{report}");
}
