//! Small, fast fixtures for tests of training strategies: a learnable toy corpus and the
//! four architectures at toy sizes with dropout off (so strategies can be compared exactly),
//! and the settings and epoch under which they are compared.

pub mod data_dir;
pub use data_dir::ag_news_dir;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use tandem_data::{Encoded, Sample, Vocab, VocabConfig};
use tandem_models::{Architecture, Classifier, CnnConfig, InputSpec, ModelConfig, RecurrentConfig, TransformerConfig};

use tandem_train::{EpochPlan, EpochRecord, Observer, Point, Start, Strategy, TrainConfig, TrainStats};

/// Tokens per toy sample.
pub const TOY_MAX_LEN: usize = 10;

/// A learnable toy corpus: each class has its own topic words, mixed with shared filler.
pub fn toy_corpus(n: usize, salt: u64) -> Vec<Sample> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64 ^ salt;
    let mut next = move |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % m
    };
    (0..n)
        .map(|i| {
            let label = i % 4;
            let words: Vec<String> = (0..3 + next(6))
                .map(|_| if next(3) == 0 { format!("filler{}", next(8)) } else { format!("topic{label}x{}", next(5)) })
                .collect();
            Sample { label, title: words[0].clone(), description: words[1..].join(" ") }
        })
        .collect()
}

/// 160 training and 40 holdout toy samples, encoded, and the vocabulary size.
pub fn toy_data() -> (Encoded, Encoded, usize) {
    let train = toy_corpus(160, 1);
    let holdout = toy_corpus(40, 2);
    let vocab = Vocab::build(train.iter().map(|s| s.text()), &VocabConfig { max_size: 100, min_freq: 1 });
    (Encoded::new(&train, &vocab, TOY_MAX_LEN), Encoded::new(&holdout, &vocab, TOY_MAX_LEN), vocab.len())
}

/// The input of a toy model over a vocabulary of `vocab_size`.
pub fn toy_input(vocab_size: usize) -> InputSpec {
    InputSpec { vocab_size, max_len: TOY_MAX_LEN, num_classes: 4 }
}

/// CNN, LSTM, GRU and Transformer at toy sizes, dropout off, in [`Architecture::ALL`]'s order
/// (for tests that run every architecture).
pub fn toy_models() -> [ModelConfig; 4] {
    Architecture::ALL.map(toy_model)
}

/// The `architecture` at toy size (embedding 16; CNN 8 filters × widths 2/3; LSTM/GRU hidden
/// 16; Transformer 1 layer, 2 heads, ff 32), dropout off.
pub fn toy_model(architecture: Architecture) -> ModelConfig {
    match architecture {
        Architecture::Cnn => ModelConfig::Cnn(CnnConfig {
            embedding_dim: 16,
            filters: 8,
            kernel_widths: vec![2, 3],
            dropout: 0.0,
            ..Default::default()
        }),
        Architecture::Lstm => {
            ModelConfig::Lstm(RecurrentConfig { embedding_dim: 16, hidden: 16, dropout: 0.0, ..Default::default() })
        }
        Architecture::Gru => {
            ModelConfig::Gru(RecurrentConfig { embedding_dim: 16, hidden: 16, dropout: 0.0, ..Default::default() })
        }
        Architecture::Transformer => ModelConfig::Transformer(TransformerConfig {
            d_model: 16,
            heads: 2,
            layers: 1,
            d_ff: 32,
            dropout: 0.0,
            embedding_dropout: 0.0,
            ..Default::default()
        }),
    }
}

/// `‖a − b‖ / ‖b‖`: how far two parameter vectors are apart, relative to `b`.
pub fn relative_difference(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "parameter vectors of different models");
    let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// The reference shapes of the benchmarks (the configs' defaults: embedding 128; CNN 100
/// filters × widths 3/4/5; LSTM/GRU hidden 128; Transformer 2 layers, 4 heads, ff 256) with
/// dropout off.
pub fn reference_model(architecture: Architecture) -> ModelConfig {
    match architecture {
        Architecture::Cnn => ModelConfig::Cnn(CnnConfig { dropout: 0.0, ..Default::default() }),
        Architecture::Lstm => ModelConfig::Lstm(RecurrentConfig { dropout: 0.0, ..Default::default() }),
        Architecture::Gru => ModelConfig::Gru(RecurrentConfig { dropout: 0.0, ..Default::default() }),
        Architecture::Transformer => {
            ModelConfig::Transformer(TransformerConfig { dropout: 0.0, embedding_dropout: 0.0, ..Default::default() })
        }
    }
}

/// Positions per sample and the vocabulary of the benchmarks' reference shape.
pub const REFERENCE_SEQ: usize = 64;
pub const REFERENCE_VOCAB: usize = 20_000;

/// A batch of `batch` samples at the reference shape ([`REFERENCE_SEQ`] positions, no padding,
/// tokens spread over the [`REFERENCE_VOCAB`] ids, four classes in turn), the same every time.
pub fn reference_batch<B: Backend>(batch: usize, device: &B::Device) -> tandem_data::Batch<B> {
    let (seq, vocab) = (REFERENCE_SEQ, REFERENCE_VOCAB);
    let ids: Vec<i64> = (0..batch * seq).map(|i| ((i * 7919) % (vocab - 2) + 2) as i64).collect();
    tandem_data::Batch {
        tokens: Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, seq]), device),
        mask_pad: Tensor::<B, 2, Int>::zeros([batch, seq], device).equal_elem(1),
        lengths: Tensor::full([batch], seq as i64, device),
        labels: Tensor::<B, 1, Int>::from_data(
            TensorData::new((0..batch as i64).map(|i| i % 4).collect(), [batch]),
            device,
        ),
    }
}

/// Training settings under which strategies must match sequential training exactly: global
/// batch 12 over the 160 toy samples (13 full batches and a last one of 4), warm-up, clipping.
///
/// Adam's ε is raised from 1e-8 to 1e-4: the attention key bias has a gradient that is zero
/// in exact arithmetic (softmax ignores a shift shared by all keys), so in floating point it is
/// summation noise of ~1e-9, which Adam with a tiny ε turns into steps of up to the learning
/// rate in a direction set by that noise (1e-5 relative after 14 steps with ε = 1e-6, varying
/// with the build's SIMD features). The tests are about the gradients, not that noise.
pub fn exact_train_config() -> TrainConfig {
    TrainConfig {
        epochs: 1,
        batch_size: 12,
        learning_rate: 1e-2,
        epsilon: 1e-4,
        warmup_steps: 2,
        grad_clip_norm: Some(1.0),
        ..Default::default()
    }
}

/// A toy model with the same initial parameters every time (the backend seeded with 3).
pub fn initial_model<B: Backend>(config: &ModelConfig, vocab_size: usize) -> Classifier<B> {
    let device = Default::default();
    B::seed(&device, 3);
    config.init(&toy_input(vocab_size), &device)
}

/// One epoch over `data` in a fixed shuffled order, without the epoch loop's evaluation.
pub fn one_epoch<B: AutodiffBackend>(
    strategy: &mut dyn Strategy<B>,
    data: &Encoded,
    config: &TrainConfig,
) -> TrainStats {
    let order: Vec<usize> = tandem_data::epoch_order(data.len(), 5, 0);
    let batches = tandem_data::batches(&order, config.batch_size).map(<[usize]>::to_vec).collect();
    let total_steps = config.steps_per_epoch(data.len());
    let plan = epoch_plan(batches, data, total_steps);
    strategy.train_epoch(&plan).expect("training epoch")
}

/// One epoch's plan over `batches` of `data` from step 0 (of `total_steps`), dropout seed 0,
/// reporting nothing and never interrupted.
pub fn epoch_plan(batches: Vec<Vec<usize>>, data: &Encoded, total_steps: usize) -> EpochPlan<'_> {
    EpochPlan {
        epoch: 0,
        batches,
        data,
        first_step: 0,
        total_steps,
        rng_seed: 0,
        on_batch: &|_| {},
        interrupt: &|| false,
    }
}

/// The whole epoch loop over the toy data with seed 9 on the default device, from the start,
/// nothing reported along the way.
pub fn train_toy<B: AutodiffBackend>(
    strategy: &mut dyn Strategy<B>,
    config: &TrainConfig,
    data: &Encoded,
    holdout: &Encoded,
) -> Vec<EpochRecord> {
    let start = Start { rng_seed: 9, ..Default::default() };
    let eval = tandem_train::EvalSets::holdout(holdout);
    tandem_train::train(strategy, config, 9, data, eval, &Default::default(), &mut Quiet, start).expect("training")
}

/// An observer of the epoch loop that wants nothing and never interrupts.
pub struct Quiet;

impl<B: AutodiffBackend> Observer<B> for Quiet {
    fn point(&mut self, _: Point, _: &dyn Strategy<B>) -> Result<(), tandem_train::Halt> {
        Ok(())
    }
}
