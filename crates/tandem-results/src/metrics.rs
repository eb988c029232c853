//! Classification metrics: confusion matrix, accuracy, per-class and macro precision / recall / F1.

use serde::{Deserialize, Serialize};

/// Counts of (true class, predicted class) pairs: `counts[truth][predicted]`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ConfusionMatrix {
    pub counts: Vec<Vec<u64>>,
}

impl ConfusionMatrix {
    /// An all-zero matrix for `classes` classes.
    pub fn new(classes: usize) -> Self {
        Self { counts: vec![vec![0; classes]; classes] }
    }

    /// Records predictions against the true labels (labels outside the matrix are a caller bug).
    pub fn add(&mut self, truth: &[usize], predicted: &[usize]) {
        for (&t, &p) in truth.iter().zip(predicted) {
            self.counts[t][p] += 1;
        }
    }

    /// Adds another matrix of the same size (e.g. from another evaluation shard).
    pub fn merge(&mut self, other: &ConfusionMatrix) {
        for (row, other_row) in self.counts.iter_mut().zip(&other.counts) {
            for (c, o) in row.iter_mut().zip(other_row) {
                *c += o;
            }
        }
    }

    /// Number of classes.
    pub fn classes(&self) -> usize {
        self.counts.len()
    }

    /// Number of recorded samples.
    pub fn total(&self) -> u64 {
        self.counts.iter().flatten().sum()
    }
}

/// Precision, recall, F1 and support of one class.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ClassMetrics {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// Number of samples whose true class is this one.
    pub support: u64,
}

/// Everything Tandem reports about a set of predictions.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ClassificationMetrics {
    pub accuracy: f64,
    pub macro_precision: f64,
    pub macro_recall: f64,
    pub macro_f1: f64,
    pub per_class: Vec<ClassMetrics>,
    pub confusion: ConfusionMatrix,
}

/// `num / den`, or 0 when the denominator is 0 (a class never predicted has precision 0, not NaN).
fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 {
        num / den
    } else {
        0.0
    }
}

impl ClassificationMetrics {
    /// Computes all metrics from a confusion matrix. Macro averages weigh every class equally.
    pub fn from_confusion(confusion: ConfusionMatrix) -> Self {
        let k = confusion.classes();
        let c = &confusion.counts;
        let per_class: Vec<ClassMetrics> = (0..k)
            .map(|i| {
                let tp = c[i][i] as f64;
                let predicted: u64 = (0..k).map(|t| c[t][i]).sum();
                let support: u64 = c[i].iter().sum();
                let precision = ratio(tp, predicted as f64);
                let recall = ratio(tp, support as f64);
                let f1 = ratio(2.0 * precision * recall, precision + recall);
                ClassMetrics { precision, recall, f1, support }
            })
            .collect();
        let mean = |f: fn(&ClassMetrics) -> f64| ratio(per_class.iter().map(f).sum(), k as f64);
        let correct: u64 = (0..k).map(|i| c[i][i]).sum();
        Self {
            accuracy: ratio(correct as f64, confusion.total() as f64),
            macro_precision: mean(|m| m.precision),
            macro_recall: mean(|m| m.recall),
            macro_f1: mean(|m| m.f1),
            per_class,
            confusion,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} != {b}");
    }

    #[test]
    fn hand_computed_three_class_case() {
        // truth:     0 0 0 1 1 2
        // predicted: 0 0 1 1 2 2
        let mut m = ConfusionMatrix::new(3);
        m.add(&[0, 0, 0, 1, 1, 2], &[0, 0, 1, 1, 2, 2]);
        assert_eq!(m.counts, vec![vec![2, 1, 0], vec![0, 1, 1], vec![0, 0, 1]]);
        let r = ClassificationMetrics::from_confusion(m);
        close(r.accuracy, 4.0 / 6.0);
        // class 0: P = 2/2, R = 2/3; class 1: P = 1/2, R = 1/2; class 2: P = 1/2, R = 1/1
        close(r.per_class[0].precision, 1.0);
        close(r.per_class[0].recall, 2.0 / 3.0);
        close(r.per_class[0].f1, 0.8);
        close(r.per_class[1].f1, 0.5);
        close(r.per_class[2].f1, 2.0 / 3.0);
        close(r.macro_precision, (1.0 + 0.5 + 0.5) / 3.0);
        close(r.macro_recall, (2.0 / 3.0 + 0.5 + 1.0) / 3.0);
        close(r.macro_f1, (0.8 + 0.5 + 2.0 / 3.0) / 3.0);
        assert_eq!(r.per_class.iter().map(|c| c.support).collect::<Vec<_>>(), vec![3, 2, 1]);
    }

    #[test]
    fn a_class_never_predicted_scores_zero_not_nan() {
        let mut m = ConfusionMatrix::new(4);
        m.add(&[0, 1, 2, 3], &[0, 1, 2, 2]); // class 3 is never predicted
        let r = ClassificationMetrics::from_confusion(m);
        assert_eq!(r.per_class[3].precision, 0.0);
        assert_eq!(r.per_class[3].recall, 0.0);
        assert_eq!(r.per_class[3].f1, 0.0);
        close(r.per_class[2].precision, 0.5);
        close(r.accuracy, 0.75);
        assert!(r.macro_f1.is_finite());
        close(r.macro_f1, (1.0 + 1.0 + 2.0 / 3.0 + 0.0) / 4.0);
    }

    #[test]
    fn an_empty_evaluation_is_all_zero() {
        let r = ClassificationMetrics::from_confusion(ConfusionMatrix::new(4));
        assert_eq!((r.accuracy, r.macro_f1), (0.0, 0.0));
    }

    #[test]
    fn merging_adds_counts() {
        let mut a = ConfusionMatrix::new(2);
        a.add(&[0, 1], &[0, 0]);
        let mut b = ConfusionMatrix::new(2);
        b.add(&[1], &[1]);
        a.merge(&b);
        assert_eq!(a.counts, vec![vec![1, 0], vec![1, 1]]);
    }
}
