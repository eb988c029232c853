//! The byte layout of checkpointed state that is not a Burn record — a protocol's history, a
//! replay buffer, a codec's memory, cut points: little-endian counts (u64), `f32` values and
//! `f64` scalars, each list preceded by its length; tensors as their dimensions and values.
//! A [`Reader`] never panics on damaged bytes: it returns an error.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::checkpoint::StateError;

/// Appends values to a buffer.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    pub fn count(&mut self, n: usize) -> &mut Self {
        self.0.extend((n as u64).to_le_bytes());
        self
    }

    pub fn counts(&mut self, values: &[usize]) -> &mut Self {
        self.count(values.len());
        values.iter().for_each(|&v| {
            self.count(v);
        });
        self
    }

    pub fn floats(&mut self, values: &[f32]) -> &mut Self {
        self.count(values.len());
        values.iter().for_each(|v| self.0.extend(v.to_le_bytes()));
        self
    }

    pub fn scalars(&mut self, values: &[f64]) -> &mut Self {
        self.count(values.len());
        values.iter().for_each(|v| self.0.extend(v.to_le_bytes()));
        self
    }

    /// A tensor: its dimensions, then its values as `f32`.
    pub fn tensor<B: Backend, const D: usize>(&mut self, tensor: &Tensor<B, D>) -> &mut Self {
        self.counts(&tensor.dims());
        self.floats(&tensor.to_data().convert::<f32>().to_vec::<f32>().expect("f32 values"))
    }

    /// A value as JSON (e.g. a trigger's state), preceded by its length.
    pub fn json(&mut self, value: &impl serde::Serialize) -> &mut Self {
        let bytes = serde_json::to_vec(value).expect("a value of plain fields serialises");
        self.count(bytes.len());
        self.0.extend(bytes);
        self
    }
}

/// Reads a [`Writer`]'s values back, in the same order.
pub struct Reader<'a>(pub &'a [u8]);

fn damaged() -> StateError {
    StateError::Damaged("a part of the checkpoint is damaged".to_string())
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StateError> {
        let chunk = self.0.get(..n).ok_or_else(damaged)?;
        self.0 = &self.0[n..];
        Ok(chunk)
    }

    /// `n` items of `size` bytes, checked against what is left before anything is allocated.
    fn take_items(&mut self, n: usize, size: usize) -> Result<&[u8], StateError> {
        let bytes = n.checked_mul(size).ok_or_else(damaged)?;
        self.take(bytes)
    }

    pub fn count(&mut self) -> Result<usize, StateError> {
        let n = u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes"));
        usize::try_from(n).map_err(|_| damaged())
    }

    pub fn counts(&mut self) -> Result<Vec<usize>, StateError> {
        let n = self.count()?;
        let raw = self.take_items(n, 8)?;
        raw.chunks_exact(8)
            .map(|c| usize::try_from(u64::from_le_bytes(c.try_into().expect("8 bytes"))).map_err(|_| damaged()))
            .collect()
    }

    pub fn floats(&mut self) -> Result<Vec<f32>, StateError> {
        let n = self.count()?;
        Ok(self.take_items(n, 4)?.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4"))).collect())
    }

    pub fn scalars(&mut self) -> Result<Vec<f64>, StateError> {
        let n = self.count()?;
        Ok(self.take_items(n, 8)?.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().expect("8"))).collect())
    }

    /// A tensor's dimensions and values, for the caller to place.
    pub fn tensor_data(&mut self) -> Result<TensorData, StateError> {
        let dims = self.counts()?;
        let values = self.floats()?;
        if dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) != Some(values.len()) {
            return Err(damaged());
        }
        Ok(TensorData::new(values, dims))
    }

    /// A tensor of `D` dimensions, on `device`.
    pub fn tensor<B: Backend, const D: usize>(&mut self, device: &B::Device) -> Result<Tensor<B, D>, StateError> {
        let data = self.tensor_data()?;
        if data.shape.len() != D {
            return Err(damaged());
        }
        Ok(Tensor::from_data(data, device))
    }

    pub fn json<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, StateError> {
        let n = self.count()?;
        serde_json::from_slice(self.take(n)?).map_err(|e| StateError::Damaged(format!("a part of the checkpoint: {e}")))
    }

    /// Fails unless every byte was read.
    pub fn end(&self) -> Result<(), StateError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(damaged())
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::NdArray;

    use super::*;

    #[test]
    fn values_round_trip_and_damage_is_an_error_not_a_panic() {
        let device = Default::default();
        let t = Tensor::<NdArray, 2>::from_data(TensorData::new(vec![1f32, 2., 3., 4., 5., 6.], [2, 3]), &device);
        let mut w = Writer::default();
        w.count(7).counts(&[1, 2]).floats(&[0.5]).scalars(&[1e-300]).tensor(&t).json(&vec!["a"]);
        let mut r = Reader(&w.0);
        assert_eq!((r.count().unwrap(), r.counts().unwrap(), r.floats().unwrap()), (7, vec![1, 2], vec![0.5]));
        assert_eq!(r.scalars().unwrap(), vec![1e-300]);
        assert_eq!(r.tensor::<NdArray, 2>(&device).unwrap().to_data(), t.to_data());
        assert_eq!(r.json::<Vec<String>>().unwrap(), vec!["a".to_string()]);
        r.end().unwrap();
        // A count far past the end, and a truncated buffer.
        let mut huge = Writer::default();
        huge.count(usize::MAX / 2);
        assert!(Reader(&huge.0).floats().is_err());
        assert!(Reader(&w.0[..w.0.len() - 1]).count().and(Reader(&w.0[..20]).counts()).is_err());
    }
}
