//! What a strategy saves to continue a run exactly: named byte parts (models and optimizer
//! states as Burn binary records, full precision), and parameter ids that depend only on a
//! parameter's place in the model, so identical runs write identical bytes.
//!
//! Burn's recorders are used directly, not burn-train's `FileCheckpointer`: that checkpointer
//! saves one model and one optimizer per file and writes in place, while a Tandem strategy
//! holds several (replicas, stages, a predictor's history) and a checkpoint must appear whole
//! or not at all; so every part is recorded to bytes and the runner writes the lot atomically.

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder, RecorderError};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};
use tandem_models::Classifier;

/// Why a strategy's state could not be saved, or continued from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateError {
    /// The bytes are not what was written (cut short, changed, or with bytes appended); the
    /// message names the part.
    #[error("{0}")]
    Damaged(String),
    /// A part the strategy needs is absent: a state written by a strategy built otherwise.
    #[error("the checkpoint has no `{0}`")]
    Missing(String),
    /// Burn could not record a model or an optimizer, or read its record back.
    #[error("{0}")]
    Record(String),
    /// The state does not fit this strategy (other cut points, forecasts it does not make), or
    /// the strategy cannot give one now.
    #[error("{0}")]
    Mismatch(String),
}

/// A strategy's state: parts in the order they were put, each with a name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StateParts {
    parts: Vec<(String, Vec<u8>)>,
}

impl StateParts {
    /// Adds a part named `name`.
    pub fn put(&mut self, name: impl Into<String>, bytes: Vec<u8>) {
        self.parts.push((name.into(), bytes));
    }

    /// The part named `name`; the error names it when it is missing.
    pub fn get(&self, name: &str) -> Result<&[u8], StateError> {
        self.parts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_slice())
            .ok_or_else(|| StateError::Missing(name.to_string()))
    }

    /// One buffer: for each part its name's length, name, length and bytes (little endian).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, bytes) in &self.parts {
            for chunk in [name.as_bytes(), bytes.as_slice()] {
                out.extend_from_slice(&(chunk.len() as u64).to_le_bytes());
                out.extend_from_slice(chunk);
            }
        }
        out
    }

    /// Reads [`StateParts::to_bytes`]'s buffer back.
    pub fn from_bytes(mut bytes: &[u8]) -> Result<Self, StateError> {
        let take = |bytes: &mut &[u8]| -> Result<Vec<u8>, StateError> {
            // Without a checksum (a file written before them) the cause cannot be told apart.
            let overrun = || {
                StateError::Damaged(
                    "the checkpoint is damaged: a part runs past its end (cut short, changed, or with bytes appended)"
                        .to_string(),
                )
            };
            let len = u64::from_le_bytes(bytes.get(..8).ok_or_else(overrun)?.try_into().unwrap());
            let end = usize::try_from(len).ok().and_then(|len| len.checked_add(8)).ok_or_else(overrun)?;
            let chunk = bytes.get(8..end).ok_or_else(overrun)?.to_vec();
            *bytes = &bytes[end..];
            Ok(chunk)
        };
        let mut parts = Vec::new();
        while !bytes.is_empty() {
            let name = String::from_utf8(take(&mut bytes)?)
                .map_err(|_| StateError::Damaged("the checkpoint is damaged".to_string()))?;
            parts.push((name, take(&mut bytes)?));
        }
        Ok(Self { parts })
    }
}

fn recorder() -> BinBytesRecorder<FullPrecisionSettings> {
    BinBytesRecorder::default()
}

/// Reads the bytes of [`recorder`] back, with an error where burn-core 0.21's `BinBytesRecorder`
/// panics (bytes that are not a whole record: damaged, cut short or with bytes appended).
#[derive(Clone, Debug, Default)]
struct CheckedReader;

impl<B: Backend> Recorder<B> for CheckedReader {
    type Settings = FullPrecisionSettings;
    type RecordArgs = ();
    type RecordOutput = Vec<u8>;
    type LoadArgs = Vec<u8>;

    fn save_item<I: serde::Serialize>(&self, item: I, _: ()) -> Result<Vec<u8>, RecorderError> {
        bincode::serde::encode_to_vec(item, bincode::config::standard())
            .map_err(|e| RecorderError::Unknown(e.to_string()))
    }

    fn load_item<I: serde::de::DeserializeOwned>(&self, bytes: &mut Vec<u8>) -> Result<I, RecorderError> {
        let (item, read) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())
            .map_err(|e| RecorderError::Unknown(format!("not a whole record: {e}")))?;
        match read == bytes.len() {
            true => Ok(item),
            false => Err(RecorderError::Unknown(format!("{} bytes after the record", bytes.len() - read))),
        }
    }
}

/// `model`'s parameters as Burn's binary record, full precision (the bytes of `model.bin`).
pub fn model_bytes<B: Backend>(model: &Classifier<B>) -> Result<Vec<u8>, StateError> {
    Recorder::<B>::record(&recorder(), model.clone().into_record(), ()).map_err(record_error)
}

/// `model` with the parameters of [`model_bytes`]'s record, on `device`.
pub fn load_model_bytes<B: Backend>(
    model: Classifier<B>,
    bytes: &[u8],
    device: &B::Device,
) -> Result<Classifier<B>, StateError> {
    let record = Recorder::<B>::load(&CheckedReader, bytes.to_vec(), device).map_err(record_error)?;
    Ok(model.load_record(record))
}

/// Records `record` to bytes (optimizer states and other Burn records).
pub fn record_bytes<B: Backend, R: burn::record::Record<B>>(record: R) -> Result<Vec<u8>, StateError> {
    Recorder::<B>::record(&recorder(), record, ()).map_err(record_error)
}

/// Loads a record of [`record_bytes`] onto `device`.
pub fn load_record_bytes<B: Backend, R: burn::record::Record<B>>(
    bytes: &[u8],
    device: &B::Device,
) -> Result<R, StateError> {
    Recorder::<B>::load(&CheckedReader, bytes.to_vec(), device).map_err(record_error)
}

fn record_error(e: RecorderError) -> StateError {
    StateError::Record(e.to_string())
}

/// Gives every parameter of `model` the id of its place in the model (0, 1, 2… in visiting
/// order) instead of Burn's random one, so that the records of identical runs are identical.
pub fn number_parameters<B: Backend>(model: Classifier<B>) -> Classifier<B> {
    model.map(&mut Numbering(0))
}

struct Numbering(u64);

impl Numbering {
    fn next<T: burn::module::Parameter>(&mut self, mut param: Param<T>) -> Param<T> {
        param.id = ParamId::from(self.0);
        self.0 += 1;
        param
    }
}

impl<B: Backend> ModuleMapper<B> for Numbering {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        self.next(param)
    }
    fn map_int<const D: usize>(&mut self, param: Param<Tensor<B, D, Int>>) -> Param<Tensor<B, D, Int>> {
        self.next(param)
    }
    fn map_bool<const D: usize>(&mut self, param: Param<Tensor<B, D, Bool>>) -> Param<Tensor<B, D, Bool>> {
        self.next(param)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip_and_name_what_is_missing() {
        let mut parts = StateParts::default();
        parts.put("model", vec![1, 2, 3]);
        parts.put("empty", Vec::new());
        let back = StateParts::from_bytes(&parts.to_bytes()).unwrap();
        assert_eq!(back, parts);
        assert_eq!(back.get("model").unwrap(), &[1, 2, 3]);
        assert_eq!(back.get("optimizer").unwrap_err(), StateError::Missing("optimizer".into()));
        let bytes = parts.to_bytes();
        assert!(StateParts::from_bytes(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn damaged_model_bytes_are_an_error_not_a_panic() {
        type Nd = burn::backend::NdArray;
        let config = tandem_testing::toy_model(tandem_models::Architecture::Gru);
        let model: Classifier<Nd> = tandem_testing::initial_model(&config, 50);
        let bytes = model_bytes(&model).unwrap();
        let fresh = || tandem_testing::initial_model::<Nd>(&config, 50);
        let device = Default::default();
        let loaded = load_model_bytes(fresh(), &bytes, &device).unwrap();
        assert_eq!(model_bytes(&loaded).unwrap(), bytes);
        let cut = load_model_bytes(fresh(), &bytes[..bytes.len() / 2], &device).err().unwrap().to_string();
        assert!(cut.contains("not a whole record"), "{cut}");
        let longer = [bytes.as_slice(), &[0, 0, 0]].concat();
        let appended = load_model_bytes(fresh(), &longer, &device).err().unwrap().to_string();
        assert!(appended.contains("3 bytes after the record"), "{appended}");
    }
}
