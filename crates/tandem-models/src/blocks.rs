//! The building blocks every classifier is made of, and the activation that flows between them.

use burn::module::Module;
use burn::nn::conv::Conv1d;
use burn::nn::gru::{BiGru, Gru};
use burn::nn::lstm::{BiLstm, Lstm};
use burn::nn::transformer::TransformerEncoderLayer;
use burn::nn::{Dropout, Embedding, Linear};
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};

use tandem_ops::fused::{self, dropout, embedded_on_gpu, masked_embedding};

/// What flows from one block (or stage) to the next.
#[derive(Clone, Debug)]
pub enum Activation<B: Backend> {
    /// Token ids, `[batch, seq]`: the input of the first block.
    Tokens(Tensor<B, 2, Int>),
    /// A feature sequence, `[batch, seq, features]`.
    Sequence(Tensor<B, 3>),
    /// One feature vector per sample, `[batch, features]` (the logits after the head).
    Features(Tensor<B, 2>),
}

/// Values that are not features: neither a sequence (3 dimensions) nor one vector per sample (2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("features of {0} dimensions")]
pub struct NotFeatures(pub usize);

impl<B: Backend> Activation<B> {
    /// Moves the activation to `device`.
    pub fn to_device(self, device: &B::Device) -> Self {
        match self {
            Self::Tokens(t) => Self::Tokens(t.to_device(device)),
            Self::Sequence(t) => Self::Sequence(t.to_device(device)),
            Self::Features(t) => Self::Features(t.to_device(device)),
        }
    }

    /// Features of `data`'s shape on `device`: a sequence (3 dimensions) or one vector per
    /// sample (2).
    pub fn from_data(data: TensorData, device: &B::Device) -> Result<Self, NotFeatures> {
        match data.shape.len() {
            3 => Ok(Self::Sequence(Tensor::from_data(data, device))),
            2 => Ok(Self::Features(Tensor::from_data(data, device))),
            n => Err(NotFeatures(n)),
        }
    }

    /// Number of scalar elements (4 bytes each on f32 / i32 backends, as sent over a link).
    pub fn num_elements(&self) -> usize {
        match self {
            Self::Tokens(t) => t.shape().num_elements(),
            Self::Sequence(t) => t.shape().num_elements(),
            Self::Features(t) => t.shape().num_elements(),
        }
    }

    /// The `[batch, features]` tensor; panics on another variant (a wiring bug, not user input).
    pub fn into_features(self) -> Tensor<B, 2> {
        match self {
            Self::Features(t) => t,
            other => panic!("expected features, got {}", other.kind()),
        }
    }

    fn into_sequence(self) -> Tensor<B, 3> {
        match self {
            Self::Sequence(t) => t,
            other => panic!("expected a feature sequence, got {}", other.kind()),
        }
    }

    /// What the activation holds, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Tokens(_) => "token ids",
            Self::Sequence(_) => "a feature sequence",
            Self::Features(_) => "features",
        }
    }
}

/// `[batch, seq]` float mask: 1 on real tokens, 0 on padding.
fn keep_mask<B: Backend>(mask_pad: &Tensor<B, 2, Bool>) -> Tensor<B, 2> {
    mask_pad.clone().bool_not().float()
}

/// Mean over the non-padding positions of a `[batch, seq, features]` tensor, as one batched matmul
/// by per-position weights (1 / count on real tokens, 0 on padding). Its backward is an outer
/// product; a masked sum's (`(x · keep).sum_dim(1)`) broadcasts element by element on CPU
/// backends, forward and backward (~5 % of an LSTM training step on Flex).
pub(crate) fn masked_mean<B: Backend>(x: Tensor<B, 3>, mask_pad: &Tensor<B, 2, Bool>) -> Tensor<B, 2> {
    let [batch, seq, features] = x.dims();
    let keep = keep_mask(mask_pad);
    let count = keep.clone().sum_dim(1).clamp_min(1.0); // [batch, 1]
    (keep / count).reshape([batch, 1, seq]).matmul(x).reshape([batch, features])
}

/// Token embedding (plus learned positions for the Transformer); padding positions are zeroed.
#[derive(Module, Debug)]
pub struct EmbeddingBlock<B: Backend> {
    pub(crate) tokens: Embedding<B>,
    pub(crate) positions: Option<Embedding<B>>,
    pub(crate) dropout: Dropout,
    /// Runs [`embedded_on_gpu`] or [`masked_embedding`] (where the backend has one) instead of
    /// Burn's lookup and a mask.
    pub(crate) fused: bool,
}

impl<B: Backend> EmbeddingBlock<B> {
    /// `[batch, seq]` ids → `[batch, seq, embedding]`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>, mask_pad: &Tensor<B, 2, Bool>) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let device = tokens.device();
        let position_ids =
            || Tensor::<B, 1, Int>::arange(0..seq as i64, &device).reshape([1, seq]).repeat_dim(0, batch);
        if self.fused {
            let positions = self.positions.as_ref().map(|p| p.weight.val());
            if let Some(x) = embedded_on_gpu(self.tokens.weight.val(), positions, tokens.clone(), mask_pad) {
                return dropout(&self.dropout, x);
            }
            if let Some(x) = masked_embedding(self.tokens.weight.val(), tokens.clone(), mask_pad) {
                let x = match &self.positions {
                    Some(positions) => {
                        x + masked_embedding(positions.weight.val(), position_ids(), mask_pad)
                            .expect("the same backend")
                    }
                    None => x,
                };
                return dropout(&self.dropout, x);
            }
        }
        let mut x = self.tokens.forward(tokens);
        if let Some(positions) = &self.positions {
            x = x + positions.forward(position_ids());
        }
        // The mask at the full shape: CPU backends multiply same-shape tensors in a vectorised loop,
        // a broadcast one element by element (forward and backward). It is expanded as an outer
        // product with a row of ones: Flex's `repeat_dim` along the last dimension copies one
        // value at a time (4 % of an LSTM step).
        let features = x.dims()[2];
        let ones = Tensor::<B, 2>::ones([1, features], &device);
        let keep = keep_mask(mask_pad).reshape([batch * seq, 1]).matmul(ones).reshape([batch, seq, features]);
        dropout(&self.dropout, x * keep)
    }
}

/// Parallel 1-D convolutions of several widths → ReLU → max over time, concatenated.
#[derive(Module, Debug)]
pub struct ConvPoolBlock<B: Backend> {
    pub(crate) convs: Vec<Conv1d<B>>,
    /// Runs [`fused::conv_pool`] instead of each Conv1d's own forward.
    pub(crate) fused: bool,
}

impl<B: Backend> ConvPoolBlock<B> {
    /// `[batch, seq, embedding]` → `[batch, filters × widths]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 2> {
        if self.fused {
            return fused::conv_pool(&self.convs, x);
        }
        let x = x.swap_dims(1, 2); // [batch, channels, seq], as Conv1d expects
        let pooled = self.convs.iter().map(|conv| relu(conv.forward(x.clone())).max_dim(2).squeeze_dim(2)).collect();
        Tensor::cat(pooled, 1)
    }
}

/// One recurrent cell type, uni- or bidirectional (Burn's own modules).
// Burn's `Module` derive takes the variants by value; a model holds a few of them.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Rnn<B: Backend> {
    Lstm(Lstm<B>),
    BiLstm(BiLstm<B>),
    Gru(Gru<B>),
    BiGru(BiGru<B>),
}

/// One recurrent layer over the whole sequence, followed by dropout.
#[derive(Module, Debug)]
pub struct RecurrentBlock<B: Backend> {
    pub(crate) rnn: Rnn<B>,
    /// Runs the [`fused`] recurrence instead of the Burn module's own forward.
    pub(crate) fused: bool,
    pub(crate) dropout: Dropout,
}

impl<B: Backend> RecurrentBlock<B> {
    /// `[batch, seq, in]` → `[batch, seq, hidden × directions]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let out = match (&self.rnn, self.fused) {
            (Rnn::Lstm(m), true) => fused::lstm(m, x, false),
            (Rnn::BiLstm(m), true) => fused::bi_lstm(m, x),
            (Rnn::Gru(m), true) => fused::gru(m, x, false),
            (Rnn::BiGru(m), true) => fused::bi_gru(m, x),
            (Rnn::Lstm(m), false) => m.forward(x, None).0,
            (Rnn::BiLstm(m), false) => m.forward(x, None).0,
            (Rnn::Gru(m), false) => m.forward(x, None),
            (Rnn::BiGru(m), false) => m.forward(x, None).0,
        };
        dropout(&self.dropout, out)
    }
}

/// One Transformer encoder layer (self-attention with the padding mask + feed-forward).
#[derive(Module, Debug)]
pub struct EncoderBlock<B: Backend> {
    pub(crate) layer: TransformerEncoderLayer<B>,
    /// Runs [`fused::encoder_layer`] instead of the Burn layer's own forward.
    pub(crate) fused: bool,
}

impl<B: Backend> EncoderBlock<B> {
    /// `[batch, seq, d_model]` → `[batch, seq, d_model]`.
    pub fn forward(&self, x: Tensor<B, 3>, mask_pad: &Tensor<B, 2, Bool>) -> Tensor<B, 3> {
        if self.fused {
            return fused::encoder_layer(&self.layer, x, mask_pad);
        }
        self.layer.forward(x, Some(mask_pad.clone()), None)
    }
}

/// Masked mean pooling (for sequences) → dropout → linear layer to the class logits.
#[derive(Module, Debug)]
pub struct HeadBlock<B: Backend> {
    pub(crate) dropout: Dropout,
    pub(crate) output: Linear<B>,
}

impl<B: Backend> HeadBlock<B> {
    /// Features or a sequence → `[batch, classes]` logits.
    pub fn forward(&self, x: Activation<B>, mask_pad: &Tensor<B, 2, Bool>) -> Tensor<B, 2> {
        let features = match x {
            Activation::Sequence(seq) => masked_mean(seq, mask_pad),
            other => other.into_features(),
        };
        self.output.forward(dropout(&self.dropout, features))
    }
}

/// Masked mean pooling (for sequences) → linear layer → ReLU: an auxiliary head's hidden layer.
#[derive(Module, Debug)]
pub struct DenseBlock<B: Backend> {
    pub(crate) linear: Linear<B>,
}

impl<B: Backend> DenseBlock<B> {
    /// Features or a sequence → `[batch, hidden]`.
    pub fn forward(&self, x: Activation<B>, mask_pad: &Tensor<B, 2, Bool>) -> Tensor<B, 2> {
        let features = match x {
            Activation::Sequence(seq) => masked_mean(seq, mask_pad),
            other => other.into_features(),
        };
        relu(self.linear.forward(features))
    }
}

/// One step of a classifier's block sequence.
// Burn's `Module` derive takes the variants by value; a model holds a few of them.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Block<B: Backend> {
    Embedding(EmbeddingBlock<B>),
    ConvPool(ConvPoolBlock<B>),
    Recurrent(RecurrentBlock<B>),
    Encoder(EncoderBlock<B>),
    Head(HeadBlock<B>),
    Dense(DenseBlock<B>),
}

impl<B: Backend> Block<B> {
    /// Runs the block; `mask_pad` (`true` at padding) is available to every block.
    pub fn forward(&self, x: Activation<B>, mask_pad: &Tensor<B, 2, Bool>) -> Activation<B> {
        match self {
            Block::Embedding(b) => match x {
                Activation::Tokens(ids) => Activation::Sequence(b.forward(ids, mask_pad)),
                other => panic!("the embedding block expects token ids, got {}", other.kind()),
            },
            Block::ConvPool(b) => Activation::Features(b.forward(x.into_sequence())),
            Block::Recurrent(b) => Activation::Sequence(b.forward(x.into_sequence())),
            Block::Encoder(b) => Activation::Sequence(b.forward(x.into_sequence(), mask_pad)),
            Block::Head(b) => Activation::Features(b.forward(x, mask_pad)),
            Block::Dense(b) => Activation::Features(b.forward(x, mask_pad)),
        }
    }

    /// Short name of the block kind, for logs and stage descriptions.
    pub fn kind(&self) -> &'static str {
        match self {
            Block::Embedding(_) => "embedding",
            Block::ConvPool(_) => "conv-pool",
            Block::Recurrent(_) => "recurrent",
            Block::Encoder(_) => "encoder",
            Block::Head(_) => "head",
            Block::Dense(_) => "dense",
        }
    }
}
