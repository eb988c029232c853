//! Compressed boundary traffic: what crosses a stage boundary, quantised to 8, 4 or 2 bits per
//! value with one `f32` scale per row (a row is a feature vector: one token's, or one sample's),
//! and counted at its encoded size.
//!
//! Three schemes, all keyed by sample (each link end keeps its state per training sample):
//! - `plain`: each message is quantised as it is.
//! - `error-feedback`: the sender adds to a sample's values what quantisation lost the last
//!   time that sample crossed, and keeps the new loss (Seide et al. 2014; Karimireddy et al. 2019).
//! - `delta` (AQ-SGD: Wang et al., "Fine-tuning Language Models over Slow Networks using
//!   Activation Compression with Guarantees", NeurIPS 2022): activations travel as the quantised
//!   *change* against a copy of the sample's last activation that both ends keep; the first time
//!   a sample crosses, its copy is zero. Gradients travel `plain`.
//!
//! 32 bits is lossless: the values travel as they are (whatever the scheme), byte for byte what
//! an uncompressed link carries.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tandem_models::Invalid;
use tandem_train::bytes::{Reader, Writer};
use tandem_train::StateError;

/// `compression = { activation_bits = 4, gradient_bits = 8, scheme = "delta" }` on a
/// model-parallel run: how stage boundaries encode what they carry.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CompressionConfig {
    /// Bits per activation value sent forward: 32 (lossless), 8, 4 or 2.
    #[schemars(range(min = 2, max = 32))]
    pub activation_bits: u8,
    /// Bits per gradient value sent backward: 32 (lossless), 8, 4 or 2.
    #[schemars(range(min = 2, max = 32))]
    pub gradient_bits: u8,
    pub scheme: Scheme,
}

/// How quantisation error is treated across the messages of one sample.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// Each message quantised on its own.
    Plain,
    /// The sender carries each sample's quantisation error over to its next message.
    ErrorFeedback,
    /// Activations as quantised changes against a per-sample copy both ends keep (AQ-SGD);
    /// gradients plain.
    Delta,
}

impl Default for CompressionConfig {
    fn default() -> Self {
        Self { activation_bits: 32, gradient_bits: 32, scheme: Scheme::Plain }
    }
}

/// Bit widths a boundary can encode.
pub const BITS: [u8; 4] = [32, 8, 4, 2];

impl CompressionConfig {
    /// Checks values serde cannot; the message names the field.
    pub fn validate(&self) -> Result<(), Invalid> {
        for (name, bits) in [("activation_bits", self.activation_bits), ("gradient_bits", self.gradient_bits)] {
            if !BITS.contains(&bits) {
                let message = format!("`compression.{name}` must be one of 32, 8, 4 or 2, got {bits}");
                return Err(Invalid::at(&format!("compression.{name}"), message));
            }
        }
        Ok(())
    }

    /// Whether anything is compressed.
    pub fn is_lossless(&self) -> bool {
        self.activation_bits == 32 && self.gradient_bits == 32
    }

    /// For run names: empty when lossless, else e.g. `-a4g8-delta` (`-ef` for error feedback).
    pub fn label(&self) -> String {
        if self.is_lossless() {
            return String::new();
        }
        let scheme = match self.scheme {
            Scheme::Plain => "",
            Scheme::ErrorFeedback => "-ef",
            Scheme::Delta => "-delta",
        };
        format!("-a{}g{}{scheme}", self.activation_bits, self.gradient_bits)
    }

    /// The codec of one direction: `forward` (activations) or backward (gradients).
    pub fn codec(&self, forward: bool) -> Codec {
        let bits = if forward { self.activation_bits } else { self.gradient_bits };
        let scheme = match (self.scheme, forward) {
            (Scheme::Delta, false) => Scheme::Plain,
            (scheme, _) => scheme,
        };
        Codec { bits, scheme, memory: HashMap::new() }
    }
}

/// Bytes of `rows` rows of `cols` values encoded at `bits` bits: per row one `f32` scale and the
/// values packed `bits` to a value (32 bits: the `f32` values alone).
pub fn encoded_size(rows: usize, cols: usize, bits: u8) -> usize {
    match bits {
        32 => rows * cols * 4,
        _ => rows * (4 + (cols * bits as usize).div_ceil(8)),
    }
}

/// One end of one direction of a boundary: the bit width, the scheme, and its memory per sample
/// (error feedback: the sender's carried error; delta: the copy of the last activation).
#[derive(Clone, Debug, PartialEq)]
pub struct Codec {
    bits: u8,
    scheme: Scheme,
    memory: HashMap<usize, Vec<f32>>,
}

impl Codec {
    /// Whether values travel as they are (32 bits).
    pub fn is_lossless(&self) -> bool {
        self.bits == 32
    }

    /// Encodes `values`: `samples.len()` samples of equal size, rows of `cols` values.
    pub fn encode(&mut self, values: &[f32], cols: usize, samples: &[usize]) -> Vec<u8> {
        if self.is_lossless() {
            return values.iter().flat_map(|v| v.to_le_bytes()).collect();
        }
        let per_sample = values.len() / samples.len().max(1);
        let mut out = Vec::with_capacity(encoded_size(values.len() / cols.max(1), cols, self.bits));
        for (&sample, values) in samples.iter().zip(values.chunks(per_sample.max(1))) {
            let start = out.len();
            if self.scheme == Scheme::Plain {
                values.chunks(cols).for_each(|row| quantise_row(row, self.bits, &mut out));
                continue;
            }
            let memory = self.memory.entry(sample).or_insert_with(|| vec![0.0; values.len()]);
            let input: Vec<f32> = match self.scheme {
                Scheme::Delta => values.iter().zip(memory.iter()).map(|(v, c)| v - c).collect(),
                _ => values.iter().zip(memory.iter()).map(|(v, e)| v + e).collect(),
            };
            input.chunks(cols).for_each(|row| quantise_row(row, self.bits, &mut out));
            let sent = dequantise(&out[start..], cols, self.bits);
            match self.scheme {
                Scheme::Delta => memory.iter_mut().zip(&sent).for_each(|(c, s)| *c += s),
                _ => memory.iter_mut().zip(input.iter().zip(&sent)).for_each(|(e, (v, s))| *e = v - s),
            }
        }
        out
    }

    /// Decodes [`Codec::encode`]'s bytes of `samples` (rows of `cols` values) into the values the
    /// receiver trains on; `len` values are expected.
    pub(crate) fn decode(
        &mut self,
        bytes: &[u8],
        len: usize,
        cols: usize,
        samples: &[usize],
    ) -> Result<Vec<f32>, String> {
        let expected = encoded_size(len / cols.max(1), cols, self.bits);
        if bytes.len() != expected || !len.is_multiple_of(cols.max(1)) {
            return Err(format!(
                "{} bytes do not encode {len} values of rows of {cols} at {} bits ({expected} bytes)",
                bytes.len(),
                self.bits
            ));
        }
        if self.is_lossless() {
            return Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect());
        }
        let mut values = dequantise(bytes, cols, self.bits);
        if self.scheme == Scheme::Delta {
            let per_sample = len / samples.len().max(1);
            for (&sample, values) in samples.iter().zip(values.chunks_mut(per_sample.max(1))) {
                let copy = self.memory.entry(sample).or_insert_with(|| vec![0.0; values.len()]);
                copy.iter_mut().zip(values.iter_mut()).for_each(|(c, v)| {
                    *c += *v;
                    *v = *c;
                });
            }
        }
        Ok(values)
    }

    /// Bytes of the per-sample memory this end holds.
    pub fn held_bytes(&self) -> usize {
        self.memory.values().map(|v| v.len() * size_of::<f32>()).sum()
    }

    /// The per-sample memory, for checkpoints: `(sample, values)` in sample order.
    pub fn memory(&self) -> Vec<(usize, &[f32])> {
        let mut entries: Vec<(usize, &[f32])> = self.memory.iter().map(|(s, v)| (*s, v.as_slice())).collect();
        entries.sort_by_key(|(s, _)| *s);
        entries
    }

    /// The memory as bytes: the number of samples, then per sample its index and its values.
    pub fn memory_bytes(&self) -> Vec<u8> {
        let mut out = Writer::default();
        let memory = self.memory();
        out.count(memory.len());
        for (sample, values) in memory {
            out.count(sample).floats(values);
        }
        out.0
    }

    /// Replaces the memory with [`Codec::memory_bytes`]'s.
    pub fn restore_memory(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        let mut input = Reader(bytes);
        let memory =
            (0..input.count()?).map(|_| Ok((input.count()?, input.floats()?))).collect::<Result<_, StateError>>()?;
        input.end()?;
        self.memory = memory;
        Ok(())
    }
}

/// The largest quantised magnitude at `bits` bits (symmetric levels −L..=L).
fn levels(bits: u8) -> i32 {
    (1 << (bits - 1)) - 1
}

/// Appends one row: its scale (`max |x| / L`, little-endian `f32`) and each value rounded to
/// the nearest of −L..=L, stored offset by L in `bits` bits, low bits first.
fn quantise_row(row: &[f32], bits: u8, out: &mut Vec<u8>) {
    let l = levels(bits);
    let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = if max > 0.0 && max.is_finite() { max / l as f32 } else { 0.0 };
    out.extend(scale.to_le_bytes());
    let (mut acc, mut filled) = (0u32, 0u8);
    for &v in row {
        let q = if scale > 0.0 { (v / scale).round().clamp(-l as f32, l as f32) as i32 } else { 0 };
        acc |= ((q + l) as u32) << filled;
        filled += bits;
        while filled >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            filled -= 8;
        }
    }
    if filled > 0 {
        out.push(acc as u8);
    }
}

/// The values of quantised rows of `cols` values.
fn dequantise(bytes: &[u8], cols: usize, bits: u8) -> Vec<f32> {
    let l = levels(bits);
    let row_bytes = 4 + (cols * bits as usize).div_ceil(8);
    let mask = (1u32 << bits) - 1;
    let mut values = Vec::with_capacity(bytes.len() / row_bytes * cols);
    for row in bytes.chunks_exact(row_bytes) {
        let scale = f32::from_le_bytes(row[..4].try_into().expect("4 bytes"));
        let (mut acc, mut filled, mut packed) = (0u32, 0u8, row[4..].iter());
        for _ in 0..cols {
            while filled < bits {
                acc |= (*packed.next().expect("row_bytes holds every value") as u32) << filled;
                filled += 8;
            }
            values.push(((acc & mask) as i32 - l) as f32 * scale);
            acc >>= bits;
            filled -= bits;
        }
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0).collect()
    }

    #[test]
    fn thirty_two_bits_carry_the_values_exactly() {
        for scheme in [Scheme::Plain, Scheme::ErrorFeedback, Scheme::Delta] {
            let config = CompressionConfig { scheme, ..Default::default() };
            let (mut tx, mut rx) = (config.codec(true), config.codec(true));
            let x = values(6 * 8, 1);
            let bytes = tx.encode(&x, 8, &[3, 4]);
            assert_eq!(bytes.len(), x.len() * 4);
            assert_eq!(rx.decode(&bytes, x.len(), 8, &[3, 4]).unwrap(), x);
        }
    }

    #[test]
    fn each_width_stays_within_half_a_step_of_every_row_and_has_its_size() {
        for bits in [8, 4, 2] {
            let config = CompressionConfig { activation_bits: bits, ..Default::default() };
            let (mut tx, mut rx) = (config.codec(true), config.codec(true));
            let (rows, cols) = (12, 7);
            let x = values(rows * cols, 9);
            let bytes = tx.encode(&x, cols, &[0, 1, 2]);
            assert_eq!(bytes.len(), encoded_size(rows, cols, bits));
            let y = rx.decode(&bytes, x.len(), cols, &[0, 1, 2]).unwrap();
            for (row, back) in x.chunks(cols).zip(y.chunks(cols)) {
                let step = row.iter().fold(0f32, |m, v| m.max(v.abs())) / levels(bits) as f32;
                for (a, b) in row.iter().zip(back) {
                    assert!((a - b).abs() <= step / 2.0 + 1e-6, "{bits} bits: {a} → {b}, step {step}");
                }
            }
        }
    }

    #[test]
    fn delta_converges_on_a_sample_that_does_not_change_and_both_ends_agree() {
        let config = CompressionConfig { activation_bits: 2, scheme: Scheme::Delta, ..Default::default() };
        let (mut tx, mut rx) = (config.codec(true), config.codec(true));
        let x = values(4 * 16, 5);
        let mut errors = Vec::new();
        for _ in 0..12 {
            let y = rx.decode(&tx.encode(&x, 16, &[7]), x.len(), 16, &[7]).unwrap();
            errors.push(x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max));
        }
        assert!(errors[11] < errors[0] / 100.0, "{errors:?}");
        assert_eq!(tx.memory(), rx.memory());
    }

    #[test]
    fn error_feedback_carries_the_loss_so_the_mean_of_repeats_converges() {
        let config = CompressionConfig { gradient_bits: 2, scheme: Scheme::ErrorFeedback, ..Default::default() };
        let (mut tx, mut rx) = (config.codec(false), config.codec(false));
        let x = values(32, 3);
        let mut sum = vec![0f32; x.len()];
        let n = 200;
        for _ in 0..n {
            let y = rx.decode(&tx.encode(&x, 8, &[1]), x.len(), 8, &[1]).unwrap();
            sum.iter_mut().zip(&y).for_each(|(s, v)| *s += v);
        }
        let worst = x.iter().zip(&sum).map(|(a, s)| (a - s / n as f32).abs()).fold(0f32, f32::max);
        assert!(worst < 0.02, "{worst}");
    }

    #[test]
    fn memory_survives_a_checkpoint_and_bad_input_is_an_error() {
        let config = CompressionConfig { activation_bits: 4, scheme: Scheme::Delta, ..Default::default() };
        let mut tx = config.codec(true);
        tx.encode(&values(16, 2), 4, &[5, 9]);
        let mut back = config.codec(true);
        back.restore_memory(&tx.memory_bytes()).unwrap();
        assert_eq!(back, tx);
        assert!(back.restore_memory(&[1, 2, 3]).is_err());
        assert!(back.decode(&[0; 5], 16, 4, &[5]).unwrap_err().contains("do not encode"));
        assert!(CompressionConfig { activation_bits: 3, ..Default::default() }.validate().is_err());
        assert_eq!(
            CompressionConfig { activation_bits: 4, gradient_bits: 8, scheme: Scheme::Delta }.label(),
            "-a4g8-delta"
        );
        assert_eq!(CompressionConfig::default().label(), "");
    }
}
