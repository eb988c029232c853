//! A classifier as an ordered block sequence, and cutting it into stages.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};

use crate::blocks::{Activation, Block};

/// A text classifier: blocks run in order from token ids to class logits.
///
/// A contiguous slice of a classifier's blocks is itself a `Classifier` (a *stage*):
/// [`Classifier::split`] cuts one into stages, [`Classifier::join`] glues them back.
#[derive(Module, Debug)]
pub struct Classifier<B: Backend> {
    blocks: Vec<Block<B>>,
}

/// Why a list of cut points is not a legal cut.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CutError {
    #[error("cut point {cut} is outside 1..{blocks} (the model has {blocks} blocks)")]
    OutOfRange { cut: usize, blocks: usize },
    #[error("cut points must be strictly increasing, got {0:?}")]
    NotIncreasing(Vec<usize>),
    #[error("{stages} stages requested but the model has only {blocks} blocks")]
    TooManyStages { stages: usize, blocks: usize },
}

impl<B: Backend> Classifier<B> {
    /// A classifier (or stage) made of `blocks`.
    pub fn from_blocks(blocks: Vec<Block<B>>) -> Self {
        Self { blocks }
    }

    /// The blocks, in execution order.
    pub fn blocks(&self) -> &[Block<B>] {
        &self.blocks
    }

    /// The id of the token-embedding table's parameter, if this classifier (or stage) starts
    /// with the embedding block. Its gradient is non-zero only on rows of tokens in the batch,
    /// which data parallelism exploits to exchange only those rows.
    pub fn token_embedding_id(&self) -> Option<burn::module::ParamId> {
        match self.blocks.first() {
            Some(Block::Embedding(e)) => Some(e.tokens.weight.id),
            _ => None,
        }
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Token ids `[batch, seq]` and padding mask (`true` at padding) → logits `[batch, classes]`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>, mask_pad: &Tensor<B, 2, Bool>) -> Tensor<B, 2> {
        self.forward_activation(Activation::Tokens(tokens), mask_pad).into_features()
    }

    /// Runs this classifier's (or stage's) blocks on an activation.
    pub fn forward_activation(&self, x: Activation<B>, mask_pad: &Tensor<B, 2, Bool>) -> Activation<B> {
        self.blocks.iter().fold(x, |x, block| block.forward(x, mask_pad))
    }

    /// Cuts the block sequence before each index in `cuts` (strictly increasing, in `1..num_blocks`).
    /// `cuts = [1, 3]` on a 4-block model gives stages `[0]`, `[1, 2]`, `[3]`.
    pub fn split(self, cuts: &[usize]) -> Result<Vec<Classifier<B>>, CutError> {
        let n = self.blocks.len();
        if let Some(&cut) = cuts.iter().find(|&&c| c == 0 || c >= n) {
            return Err(CutError::OutOfRange { cut, blocks: n });
        }
        if cuts.windows(2).any(|w| w[0] >= w[1]) {
            return Err(CutError::NotIncreasing(cuts.to_vec()));
        }
        let mut stages = Vec::with_capacity(cuts.len() + 1);
        let mut rest = self.blocks;
        for &cut in cuts.iter().rev() {
            let tail = rest.split_off(cut);
            stages.push(Classifier::from_blocks(tail));
        }
        stages.push(Classifier::from_blocks(rest));
        stages.reverse();
        Ok(stages)
    }

    /// Cut points that split this model into `stages` stages with block counts as even as possible.
    pub fn even_cuts(&self, stages: usize) -> Result<Vec<usize>, CutError> {
        let n = self.blocks.len();
        if stages == 0 || stages > n {
            return Err(CutError::TooManyStages { stages, blocks: n });
        }
        Ok((1..stages).map(|s| s * n / stages).collect())
    }

    /// Glues stages back into one classifier (the inverse of [`Classifier::split`]).
    pub fn join(stages: Vec<Classifier<B>>) -> Self {
        Self::from_blocks(stages.into_iter().flat_map(|s| s.blocks).collect())
    }

    /// Number of scalar parameters.
    pub fn parameter_count(&self) -> usize {
        self.num_params()
    }
}

/// Collects every float parameter's values, in visiting order.
struct CollectValues(Vec<burn::tensor::TensorData>);

impl<B: Backend> burn::module::ModuleVisitor<B> for CollectValues {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
        self.0.push(param.val().into_data());
    }
}

/// Replaces every float parameter's values, in visiting order.
struct AssignValues(std::vec::IntoIter<burn::tensor::TensorData>);

impl<B: Backend> burn::module::ModuleMapper<B> for AssignValues {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<Tensor<B, D>>,
    ) -> burn::module::Param<Tensor<B, D>> {
        let data = self.0.next().expect("source and target have the same parameters");
        param.map(|t| {
            let device = t.device();
            let value = Tensor::from_data(data, &device);
            if t.is_require_grad() {
                value.require_grad()
            } else {
                value
            }
        })
    }
}

/// Replaces every float parameter's values with the next ones of a flat list, in visiting order.
struct AssignFlat<'v>(&'v [f32]);

impl<B: Backend> burn::module::ModuleMapper<B> for AssignFlat<'_> {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<Tensor<B, D>>,
    ) -> burn::module::Param<Tensor<B, D>> {
        param.map(|t| {
            let (shape, device) = (t.shape(), t.device());
            let (these, rest) = self.0.split_at(shape.num_elements());
            self.0 = rest;
            let value = Tensor::from_data(burn::tensor::TensorData::new(these.to_vec(), shape), &device);
            if t.is_require_grad() {
                value.require_grad()
            } else {
                value
            }
        })
    }
}

impl<B: Backend> Classifier<B> {
    /// Sets the parameters to `values`, as [`parameter_values`](Self::parameter_values) lists
    /// them for a classifier of the same config. Parameter ids stay `self`'s.
    pub fn with_parameter_values(self, values: &[f32]) -> Self {
        assert_eq!(values.len(), self.num_params(), "one value per parameter");
        self.map(&mut AssignFlat(values))
    }

    /// Copies `source`'s parameter values (from any backend or device) into `self`,
    /// which must have been built from the same config. Parameter ids stay `self`'s.
    pub fn with_parameters_of<A: Backend>(self, source: &Classifier<A>) -> Self {
        let mut values = CollectValues(Vec::new());
        source.visit(&mut values);
        self.map(&mut AssignValues(values.0.into_iter()))
    }

    /// Every parameter value as `f32`, in visiting order (for comparing models).
    pub fn parameter_values(&self) -> Vec<f32> {
        let mut values = CollectValues(Vec::new());
        self.visit(&mut values);
        values.0.iter().flat_map(|d| d.iter::<f32>()).collect()
    }
}
