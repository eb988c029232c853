//! How much memory a model's training takes, estimated from its config before anything is
//! allocated: an allocation too large for the machine aborts the whole process, and with it the
//! manifest's remaining runs.

use tandem_models::{InputSpec, ModelConfig};

/// Largest training state `tandem validate` accepts for one model: 64 GiB.
pub const MAX_TRAINING_BYTES: u128 = 64 << 30;

/// Longest sequence (`[data] max_len`, in tokens) a manifest may ask for.
///
/// Every text is truncated or padded to `max_len` and every model computes over the padding:
/// the recurrent layers step through each position, the Transformer's attention is quadratic in
/// it and its position table has `max_len` rows. AG News texts, a headline and a short
/// description, are far shorter than this, so a longer limit would only add padding. Memory:
/// the encoded dataset, `rows × max_len` token ids of 4 bytes allocated whole before training,
/// stays under 2 GiB at this limit for all of AG News (asserted below), and a padded batch (its
/// ids and mask) holds at most the dataset's rows. The GPU recurrent kernels are tested up to
/// 512 steps; they loop over the steps and their shape plan depends only on the batch and the
/// hidden size, so a longer sequence runs the same code, on a GPU as on the CPU.
pub const MAX_SEQUENCE_LEN: usize = 4096;

// All of AG News, encoded at the longest sequence as 4-byte token ids, stays under 2 GiB.
const _: () = assert!((tandem_data::TRAIN_ROWS + tandem_data::TEST_ROWS) * MAX_SEQUENCE_LEN * 4 < 2 << 30);

/// Bytes per parameter while training: weights, gradients and Adam's two moments, 4 bytes each.
const BYTES_PER_PARAMETER: u128 = 4 * 4;

/// Parameters of the model `config.init(input, …)` builds, counted from the same shapes
/// (saturating, so that absurd sizes stay comparable instead of overflowing).
pub fn parameter_count(config: &ModelConfig, input: &InputSpec) -> u128 {
    let n = |v: usize| v as u128;
    let linear = |d_in: u128, d_out: u128| d_in.saturating_mul(d_out).saturating_add(d_out);
    let embedding = |dim: u128| n(input.vocab_size).saturating_mul(dim);
    let head = |d_in: u128| linear(d_in, n(input.num_classes));
    match config {
        ModelConfig::Cnn(c) => {
            let (dim, filters) = (n(c.embedding_dim), n(c.filters));
            let convs = c.kernel_widths.iter().fold(0u128, |sum, &w| {
                sum.saturating_add(dim.saturating_mul(filters).saturating_mul(n(w)).saturating_add(filters))
            });
            embedding(dim).saturating_add(convs).saturating_add(head(filters.saturating_mul(n(c.kernel_widths.len()))))
        }
        ModelConfig::Lstm(c) | ModelConfig::Gru(c) => {
            let gates = if matches!(config, ModelConfig::Lstm(_)) { 4 } else { 3 };
            let directions = if c.bidirectional { 2 } else { 1 };
            let hidden = n(c.hidden);
            let layers = (0..c.layers).fold(0u128, |sum, layer| {
                let d_in = if layer == 0 { n(c.embedding_dim) } else { hidden.saturating_mul(directions) };
                // Each gate: an input and a hidden-state linear layer, both with a bias.
                let gate = linear(d_in, hidden).saturating_add(linear(hidden, hidden));
                sum.saturating_add(gate.saturating_mul(gates).saturating_mul(directions))
            });
            embedding(n(c.embedding_dim)).saturating_add(layers).saturating_add(head(hidden.saturating_mul(directions)))
        }
        ModelConfig::Transformer(c) => {
            let (d, ff) = (n(c.d_model), n(c.d_ff));
            let positions = n(input.max_len).saturating_mul(d);
            // Attention (query, key, value, output), the feed-forward pair and two layer norms.
            let layer = linear(d, d)
                .saturating_mul(4)
                .saturating_add(linear(d, ff))
                .saturating_add(linear(ff, d))
                .saturating_add(d.saturating_mul(4));
            embedding(d)
                .saturating_add(positions)
                .saturating_add(layer.saturating_mul(n(c.layers)))
                .saturating_add(head(d))
        }
    }
}

/// Bytes `copies` models of `parameters` parameters take while training.
pub fn training_bytes(parameters: u128, copies: usize) -> u128 {
    parameters.saturating_mul(BYTES_PER_PARAMETER).saturating_mul(copies as u128)
}

/// `bytes` in GiB, for messages.
pub fn gib(bytes: u128) -> String {
    let gib = bytes as f64 / (1u64 << 30) as f64;
    if gib < 1e6 {
        format!("{gib:.1} GiB")
    } else {
        format!("{gib:.1e} GiB")
    }
}

/// Checks, before a CPU run (`cpu`) builds its model, that `copies` copies of it fit in the
/// memory the system has available now, so that the run fails alone instead of aborting the
/// process. GPU runs keep their parameters on the device: not checked here.
pub(crate) fn check_fits_in_ram(
    cpu: bool,
    config: &ModelConfig,
    input: &InputSpec,
    copies: usize,
) -> Result<(), String> {
    let Some(available) = available_bytes().filter(|_| cpu) else {
        return Ok(());
    };
    let parameters = parameter_count(config, input);
    let needed = training_bytes(parameters, copies);
    if needed > available {
        return Err(format!(
            "the model has {parameters} parameters: training {copies} cop{} needs about {} \
             (weights, gradients, two Adam moments), more than the {} of memory available",
            if copies == 1 { "y" } else { "ies" },
            gib(needed),
            gib(available)
        ));
    }
    Ok(())
}

/// `MemAvailable` from `/proc/meminfo` (`None` where there is none, e.g. not on Linux).
fn available_bytes() -> Option<u128> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
