//! What crosses a stage boundary, and its size on a link.

use burn::tensor::backend::AutodiffBackend;
use tandem_models::Activation;

/// What crosses a boundary: a plain (non-autodiff) activation or gradient.
pub type Wire<B> = Activation<<B as AutodiffBackend>::InnerBackend>;

/// Bytes a [`Wire`] value occupies on a link (4 per element: f32 features, i32 token ids).
pub fn wire_bytes<B: AutodiffBackend>(value: &Wire<B>) -> usize {
    value.num_elements() * 4
}
