//! Encoded datasets, tensor batches and seeded epoch orders.

use burn::prelude::{Backend, Bool, Int, Tensor, TensorData};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::csv::Sample;
use crate::vocab::Vocab;

/// Samples turned into fixed-length id rows, ready for batching.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    /// Row length (every row is padded or truncated to it).
    pub max_len: usize,
    /// Token ids, row-major: `len() * max_len` values.
    pub tokens: Vec<u32>,
    /// Number of non-pad positions of each row (at least 1).
    pub lengths: Vec<usize>,
    /// 0-based class label of each row.
    pub labels: Vec<usize>,
}

/// One batch as Burn tensors.
#[derive(Clone, Debug)]
pub struct Batch<B: Backend> {
    /// Token ids, `[batch, max_len]`.
    pub tokens: Tensor<B, 2, Int>,
    /// `true` at padding positions, `[batch, max_len]` (Burn's `mask_pad` convention, e.g. for
    /// `TransformerEncoderInput::mask_pad`).
    pub mask_pad: Tensor<B, 2, Bool>,
    /// Number of non-pad positions of each row, `[batch]`.
    pub lengths: Tensor<B, 1, Int>,
    /// 0-based class labels, `[batch]`.
    pub labels: Tensor<B, 1, Int>,
}

impl Encoded {
    /// Encodes `samples` (their [`Sample::text`]) with `vocab` into rows of `max_len` ids
    /// (`max_len` is raised to 1 if 0).
    pub fn new(samples: &[Sample], vocab: &Vocab, max_len: usize) -> Self {
        let max_len = max_len.max(1);
        let mut tokens = Vec::with_capacity(samples.len() * max_len);
        let mut lengths = Vec::with_capacity(samples.len());
        let mut labels = Vec::with_capacity(samples.len());
        for sample in samples {
            let (ids, length) = vocab.encode(&sample.text(), max_len);
            tokens.extend_from_slice(&ids);
            lengths.push(length);
            labels.push(sample.label);
        }
        Self { max_len, tokens, lengths, labels }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The ids of row `i`, or `None` if out of range.
    pub fn row(&self, i: usize) -> Option<&[u32]> {
        let start = i.checked_mul(self.max_len)?;
        self.tokens.get(start..start.checked_add(self.max_len)?)
    }

    /// Builds the batch of rows `indices` (in that order) on `device`.
    ///
    /// # Panics
    /// If an index is out of range (a caller bug: indices come from [`epoch_order`] or
    /// `0..len()`).
    pub fn batch<B: Backend>(&self, indices: &[usize], device: &B::Device) -> Batch<B> {
        let n = indices.len();
        let mut tokens = Vec::with_capacity(n * self.max_len);
        let mut mask = Vec::with_capacity(n * self.max_len);
        let mut lengths = Vec::with_capacity(n);
        let mut labels = Vec::with_capacity(n);
        for &i in indices {
            let row = &self.tokens[i * self.max_len..(i + 1) * self.max_len];
            tokens.extend(row.iter().map(|&id| i64::from(id)));
            let length = self.lengths[i];
            mask.extend((0..self.max_len).map(|pos| pos >= length));
            lengths.push(length as i64);
            labels.push(self.labels[i] as i64);
        }
        let shape = [n, self.max_len];
        Batch {
            tokens: Tensor::from_data(TensorData::new(tokens, shape), device),
            mask_pad: Tensor::from_data(TensorData::new(mask, shape), device),
            lengths: Tensor::from_data(TensorData::new(lengths, [n]), device),
            labels: Tensor::from_data(TensorData::new(labels, [n]), device),
        }
    }
}

/// A permutation of `0..n` for one epoch: deterministic for `(seed, epoch)`, and different from
/// epoch to epoch (each epoch uses its own stream of a ChaCha8 RNG seeded with `seed`).
pub fn epoch_order(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(epoch as u64);
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rng);
    order
}

/// Splits `order` into consecutive batches of `batch_size` indices (at least 1); the last batch
/// may be shorter, nothing is dropped.
pub fn batches(order: &[usize], batch_size: usize) -> impl Iterator<Item = &[usize]> {
    order.chunks(batch_size.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::VocabConfig;
    use burn::backend::NdArray;

    type B = NdArray;

    fn samples() -> Vec<Sample> {
        let s = |label: usize, title: &str, description: &str| Sample {
            label,
            title: title.into(),
            description: description.into(),
        };
        vec![
            s(0, "world news", "today in the world"),
            s(1, "sports", ""),
            s(2, "", ""),
            s(3, "tech tech tech tech tech tech tech", "more tech"),
        ]
    }

    #[test]
    fn encoded_rows() {
        let data = samples();
        let vocab = Vocab::build(data.iter().map(Sample::text), &VocabConfig { max_size: 100, min_freq: 1 });
        let enc = Encoded::new(&data, &vocab, 6);
        assert_eq!(enc.len(), 4);
        assert_eq!(enc.tokens.len(), 24);
        assert_eq!(enc.lengths, [6, 1, 1, 6]);
        assert_eq!(enc.labels, [0, 1, 2, 3]);
        assert_eq!(enc.row(2), Some(&[Vocab::UNK, 0, 0, 0, 0, 0][..]));
        assert_eq!(enc.row(4), None);
    }

    #[test]
    fn batch_shapes_mask_and_labels() {
        let data = samples();
        let vocab = Vocab::build(data.iter().map(Sample::text), &VocabConfig { max_size: 100, min_freq: 1 });
        let enc = Encoded::new(&data, &vocab, 5);
        let device = Default::default();
        let batch = enc.batch::<B>(&[3, 1, 2], &device);
        assert_eq!(batch.tokens.dims(), [3, 5]);
        assert_eq!(batch.mask_pad.dims(), [3, 5]);
        assert_eq!(batch.lengths.dims(), [3]);
        assert_eq!(batch.labels.dims(), [3]);

        let tokens: Vec<i64> = batch.tokens.into_data().convert::<i64>().to_vec().unwrap();
        let expected: Vec<i64> =
            [3usize, 1, 2].iter().flat_map(|&i| enc.row(i).unwrap().iter().map(|&t| i64::from(t))).collect();
        assert_eq!(tokens, expected);

        let mask: Vec<bool> = batch.mask_pad.into_data().to_vec().unwrap();
        let lengths: Vec<i64> = batch.lengths.into_data().convert::<i64>().to_vec().unwrap();
        assert_eq!(lengths, [5, 1, 1]);
        for (row, &len) in lengths.iter().enumerate() {
            for pos in 0..5 {
                assert_eq!(mask[row * 5 + pos], pos as i64 >= len, "row {row} pos {pos}");
                // Padding positions hold PAD, the others do not.
                assert_eq!(tokens[row * 5 + pos] == i64::from(Vocab::PAD), pos as i64 >= len);
            }
        }
        let labels: Vec<i64> = batch.labels.into_data().convert::<i64>().to_vec().unwrap();
        assert_eq!(labels, [3, 1, 2]);
    }

    #[test]
    fn epoch_order_is_a_fresh_permutation() {
        let a = epoch_order(100, 42, 0);
        let b = epoch_order(100, 42, 1);
        assert_ne!(a, b);
        assert_eq!(a, epoch_order(100, 42, 0));
        assert_ne!(a, epoch_order(100, 43, 0));
        for order in [&a, &b] {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        }
        assert!(epoch_order(0, 1, 0).is_empty());
    }

    #[test]
    fn batches_keep_everything() {
        let order: Vec<usize> = (0..10).collect();
        let sizes: Vec<usize> = batches(&order, 4).map(<[usize]>::len).collect();
        assert_eq!(sizes, [4, 4, 2]);
        let flat: Vec<usize> = batches(&order, 4).flatten().copied().collect();
        assert_eq!(flat, order);
        assert_eq!(batches(&order, 0).count(), 10);
        assert_eq!(batches(&[], 4).count(), 0);
    }
}
