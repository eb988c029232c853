//! An optimizer's state as bytes, to checkpoint and restore it: Burn's adaptor record (moments
//! per parameter id) and, for a lazy embedding table, its row moments and step count.

use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};

use super::{AnyOptimizer, Whole};
use crate::checkpoint::{load_record_bytes, record_bytes, StateError, StateParts};

impl<M: AutodiffModule<B>, B: AutodiffBackend> AnyOptimizer<M, B> {
    /// The optimizer's state as named parts.
    pub fn state(&self) -> Result<StateParts, StateError> {
        let mut parts = StateParts::default();
        let whole = match &self.whole {
            Whole::Adam(o) => record_bytes::<B, _>(o.to_record()),
            Whole::AdamW(o) => record_bytes::<B, _>(o.to_record()),
        }?;
        parts.put("whole", whole);
        if let Some(lazy) = &self.lazy {
            parts.put("lazy.time", (lazy.time as u64).to_le_bytes().to_vec());
            if let Some((m, v)) = &lazy.moments {
                parts.put("lazy.moments", tensor_bytes(&[m, v]));
            }
        }
        Ok(parts)
    }

    /// Restores [`AnyOptimizer::state`]'s parts; tensors go to `device`.
    pub fn restore(&mut self, parts: &StateParts, device: &B::Device) -> Result<(), StateError> {
        let whole = parts.get("whole")?;
        self.whole = match self.whole.clone() {
            Whole::Adam(o) => Whole::Adam(o.load_record(load_record_bytes::<B, _>(whole, device)?)),
            Whole::AdamW(o) => Whole::AdamW(o.load_record(load_record_bytes::<B, _>(whole, device)?)),
        };
        if let Some(lazy) = &mut self.lazy {
            let time = parts.get("lazy.time")?;
            lazy.time =
                u64::from_le_bytes(time.try_into().map_err(|_| StateError::Damaged("`lazy.time` is damaged".into()))?)
                    as usize;
            lazy.moments = match parts.get("lazy.moments") {
                Ok(bytes) => {
                    let mut tensors = tensors_from_bytes::<B::InnerBackend>(bytes, device)?;
                    let v = tensors.pop().ok_or_else(moments_damaged)?;
                    let m = tensors.pop().ok_or_else(moments_damaged)?;
                    Some((m, v))
                }
                Err(_) => None,
            };
        }
        Ok(())
    }
}

/// 2-d f32 tensors as bytes: for each, its two dimensions and its values (little endian).
fn tensor_bytes<B: burn::tensor::backend::Backend>(tensors: &[&Tensor<B, 2>]) -> Vec<u8> {
    let mut out = Vec::new();
    for t in tensors {
        let [rows, cols] = t.dims();
        out.extend_from_slice(&(rows as u64).to_le_bytes());
        out.extend_from_slice(&(cols as u64).to_le_bytes());
        let values: Vec<f32> = t.to_data().convert::<f32>().to_vec().expect("f32 values");
        out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    }
    out
}

fn tensors_from_bytes<B: burn::tensor::backend::Backend>(
    mut bytes: &[u8],
    device: &B::Device,
) -> Result<Vec<Tensor<B, 2>>, StateError> {
    let mut tensors = Vec::new();
    while !bytes.is_empty() {
        let dim = |b: &[u8], at: usize| -> Result<usize, StateError> {
            Ok(u64::from_le_bytes(b.get(at..at + 8).ok_or_else(moments_damaged)?.try_into().unwrap()) as usize)
        };
        let (rows, cols) = (dim(bytes, 0)?, dim(bytes, 8)?);
        let len = rows * cols * 4;
        let values: Vec<f32> = bytes
            .get(16..16 + len)
            .ok_or_else(moments_damaged)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        tensors.push(Tensor::from_data(TensorData::new(values, [rows, cols]), device));
        bytes = &bytes[16 + len..];
    }
    Ok(tensors)
}

fn moments_damaged() -> StateError {
    StateError::Damaged("`lazy.moments` is damaged".into())
}
