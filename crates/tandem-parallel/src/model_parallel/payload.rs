//! What a link carries — a boundary's values as they are, or packed by a compressing
//! [`Codec`] — and the codecs each stage keeps for its boundaries across epochs.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::TensorData;
use tandem_models::Activation;
use tandem_train::StateError;

use super::wire::{wire_bytes, Wire};
use crate::compression::{Codec, CompressionConfig};

/// A message's values on a link.
#[derive(Debug)]
pub enum Payload<B: AutodiffBackend> {
    /// Uncompressed: counted at 4 bytes per value.
    Values(Wire<B>),
    /// Encoded by a codec: counted at the encoding's length.
    Packed(Packed),
}

/// An encoded activation or gradient: its shape (`[batch, seq, features]` or `[batch, features]`)
/// and its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Packed {
    pub dims: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl<B: AutodiffBackend> Payload<B> {
    /// Bytes the payload occupies on a link.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Values(value) => wire_bytes::<B>(value),
            Self::Packed(packed) => packed.bytes.len(),
        }
    }
}

/// The codecs of one stage's link ends: activations to the next stage and from the previous
/// one, gradients to the previous stage and from the next one. Each keeps its memory per sample
/// (error feedback, AQ-SGD copies) from epoch to epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct StageCodecs {
    pub to_next: Codec,
    pub from_previous: Codec,
    pub to_previous: Codec,
    pub from_next: Codec,
}

impl StageCodecs {
    pub fn new(config: &CompressionConfig) -> Self {
        Self {
            to_next: config.codec(true),
            from_previous: config.codec(true),
            to_previous: config.codec(false),
            from_next: config.codec(false),
        }
    }

    fn all(&self) -> [&Codec; 4] {
        [&self.to_next, &self.from_previous, &self.to_previous, &self.from_next]
    }

    /// Bytes the four codecs' memories hold.
    pub fn held_bytes(&self) -> usize {
        self.all().iter().map(|c| c.held_bytes()).sum()
    }

    /// The four codecs' memories, for a checkpoint.
    pub fn state(&self) -> Vec<Vec<u8>> {
        self.all().iter().map(|c| c.memory_bytes()).collect()
    }

    /// Continues from [`StageCodecs::state`].
    pub fn restore(&mut self, parts: &[&[u8]]) -> Result<(), StateError> {
        let codecs = [&mut self.to_next, &mut self.from_previous, &mut self.to_previous, &mut self.from_next];
        if parts.len() != codecs.len() {
            return Err(StateError::Damaged("the checkpoint's compression state has the wrong number of parts".into()));
        }
        codecs.into_iter().zip(parts).try_for_each(|(codec, bytes)| codec.restore_memory(bytes))
    }
}

/// `value` as `codec` sends it: as it is when lossless, else packed (rows are feature vectors).
pub fn pack<B: AutodiffBackend>(codec: &mut Codec, value: Wire<B>, samples: &[usize]) -> Payload<B> {
    if codec.is_lossless() {
        return Payload::Values(value);
    }
    let (dims, data) = match value {
        Activation::Sequence(t) => (t.dims().to_vec(), t.into_data()),
        Activation::Features(t) => (t.dims().to_vec(), t.into_data()),
        tokens @ Activation::Tokens(_) => return Payload::Values(tokens),
    };
    let values = data.convert::<f32>().to_vec::<f32>().expect("f32 values");
    let cols = *dims.last().expect("a tensor has dimensions");
    Payload::Packed(Packed { bytes: codec.encode(&values, cols, samples), dims })
}

/// The values a payload carries, decoded by `codec`, on `device`.
pub fn unpack<B: AutodiffBackend>(
    codec: &mut Codec,
    payload: Payload<B>,
    samples: &[usize],
    device: &B::Device,
) -> Result<Wire<B>, String> {
    let packed = match payload {
        Payload::Values(value) => return Ok(value),
        Payload::Packed(packed) => packed,
    };
    let len = packed.dims.iter().product();
    let cols = *packed.dims.last().ok_or("a packed value without a shape")?;
    let values = codec.decode(&packed.bytes, len, cols, samples)?;
    Activation::from_data(TensorData::new(values, packed.dims), device).map_err(|e| e.to_string())
}
