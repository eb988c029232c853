//! An embedding lookup with the padding positions zeroed, as **one operation** with a
//! hand-written backward pass on the CPU backends.
//!
//! Burn's lookup followed by a multiplication by the padding mask runs three passes forward and
//! two backward, and its backward builds the table's gradient by copying a zero-filled table
//! (2.56 M values at the reference vocabulary) before adding the rows in. Here the forward pass
//! gathers the rows and zeroes the padding ones in place, and the backward pass adds each real
//! position's gradient row into one zero-filled table. On `Autodiff<I>` for a CPU backend `I`
//! compiled into this crate (Flex, ndarray) it is one autodiff node, on those backends without
//! autodiff the same forward pass; elsewhere [`masked_embedding`] returns `None` and the caller
//! runs Burn's operations.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData, TensorPrimitive};

use crate::backend::Which;
use crate::cpu::dispatch::{host_f32, record_node, same_type, values, values_mut};

/// The rows of `table` (`[vocab, dim]`) named by `ids` (`[batch, seq]`), zero where `mask_pad`
/// is `true`: `[batch, seq, dim]`. `None` on a backend without a host path.
pub fn masked_embedding<B: Backend>(
    table: Tensor<B, 2>,
    ids: Tensor<B, 2, Int>,
    mask_pad: &Tensor<B, 2, Bool>,
) -> Option<Tensor<B, 3>> {
    let which = Which::of::<B>();
    if !which.on_host() {
        return None;
    }
    let lookup = Lookup::new(ids, mask_pad, table.dims()[0]);
    Some(match which {
        #[cfg(feature = "flex")]
        Which::AutodiffFlex => same_type(tracked::<burn::backend::Flex>(same_type(table), lookup)),
        #[cfg(feature = "ndarray")]
        Which::AutodiffNdArray => same_type(tracked::<burn::backend::NdArray>(same_type(table), lookup)),
        _ => {
            let device = table.device();
            forward(table, &lookup, &device)
        }
    })
}

/// Which table row each position reads, in host memory.
#[derive(Clone, Debug)]
struct Lookup {
    /// Per position (row-major `[batch, seq]`), the table row, or [`Lookup::PADDING`].
    rows: Vec<u32>,
    batch: usize,
    seq: usize,
    vocab: usize,
}

impl Lookup {
    const PADDING: u32 = u32::MAX;

    fn new<B: Backend>(ids: Tensor<B, 2, Int>, mask_pad: &Tensor<B, 2, Bool>, vocab: usize) -> Self {
        let [batch, seq] = ids.dims();
        let ids = ids.into_data().convert::<i64>();
        let padding = mask_pad.clone().into_data();
        let rows = ids
            .iter::<i64>()
            .zip(padding.iter::<bool>())
            .map(|(id, pad)| {
                assert!((0..vocab as i64).contains(&id), "token id {id} outside the embedding table's {vocab} rows");
                if pad {
                    Self::PADDING
                } else {
                    id as u32
                }
            })
            .collect();
        Self { rows, batch, seq, vocab }
    }
}

/// The forward pass: Burn's gather (it reads the table in place; taking its values to host
/// memory would copy a table the parameter still holds), then the padding rows zeroed.
fn forward<B: Backend>(table: Tensor<B, 2>, lookup: &Lookup, device: &B::Device) -> Tensor<B, 3> {
    let dim = table.dims()[1];
    let positions = lookup.rows.len();
    let index: Vec<i64> = lookup.rows.iter().map(|&r| if r == Lookup::PADDING { 0 } else { i64::from(r) }).collect();
    let index = Tensor::<B, 1, Int>::from_data(TensorData::new(index, [positions]), device);
    let mut gathered = host_f32(table.select(0, index));
    for (row, &r) in values_mut(&mut gathered).chunks_exact_mut(dim.max(1)).zip(&lookup.rows) {
        if r == Lookup::PADDING {
            row.fill(0.0);
        }
    }
    Tensor::<B, 2>::from_data(gathered, device).reshape([lookup.batch, lookup.seq, dim])
}

/// Runs the forward pass on `I` and registers one autodiff node for it.
fn tracked<I: Backend>(table: Tensor<Autodiff<I>, 2>, lookup: Lookup) -> Tensor<Autodiff<I>, 3> {
    let device = table.device();
    let output = record_node(EmbeddingBackward, [table.into_primitive().tensor()], |[table], record| {
        let out = forward::<I>(Tensor::from_primitive(TensorPrimitive::Float(table)), &lookup, &device);
        (out.into_primitive().tensor(), record.then_some(lookup))
    });
    Tensor::from_primitive(TensorPrimitive::Float(output))
}

/// The autodiff node of one [`masked_embedding`].
#[derive(Debug)]
struct EmbeddingBackward;

impl<I: Backend> Backward<I, 1> for EmbeddingBackward {
    type State = Lookup;

    fn backward(self, ops: Ops<Lookup, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = Tensor::<I, 3>::from_primitive(TensorPrimitive::Float(grads.consume::<I>(&ops.node)));
        let [parent] = ops.parents;
        let Some(parent) = parent else { return };
        let (device, dim) = (grad.device(), grad.dims()[2]);
        let grad = host_f32(grad);
        let lookup = ops.state;
        let mut d_table = vec![0f32; lookup.vocab * dim];
        for (g, &r) in values(&grad).chunks_exact(dim.max(1)).zip(&lookup.rows) {
            if r != Lookup::PADDING {
                for (sum, g) in d_table[r as usize * dim..][..dim].iter_mut().zip(g) {
                    *sum += g;
                }
            }
        }
        let d_table = Tensor::<I, 2>::from_data(TensorData::new(d_table, [lookup.vocab, dim]), &device);
        grads.register::<I>(parent.id, d_table.into_primitive().tensor());
    }
}

/// The rows of `tokens` (`[vocab, dim]`) named by `ids` (`[batch, seq]`), plus row `s` of
/// `positions` at position `s` where given, zero where `mask_pad` is `true`: `[batch, seq, dim]`,
/// one kernel forward and two backward where `B` is a GPU
/// backend compiled into this crate and the tables are f32; `None` elsewhere.
pub fn embedded_on_gpu<B: Backend>(
    tokens: Tensor<B, 2>,
    positions: Option<Tensor<B, 2>>,
    ids: Tensor<B, 2, Int>,
    mask_pad: &Tensor<B, 2, Bool>,
) -> Option<Tensor<B, 3>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if tokens.dtype() == burn::tensor::DType::F32 {
        let task = gpu::Lookup { tokens, positions, ids, mask_pad: mask_pad.clone() };
        return crate::ops::gpu_path::run::<B, _>(task).ok();
    }
    let _ = (tokens, positions, ids, mask_pad);
    None
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu {
    use burn::backend::Autodiff;
    use burn::tensor::backend::Backend;
    use burn::tensor::ops::{FloatTensor, IntTensor};
    use burn::tensor::{Bool, Int, Tensor, TensorPrimitive};

    use crate::cpu::dispatch::same_type;
    use crate::gpu::GpuKernels;
    use crate::ops::gpu_path::{gpu_node, padding_on, GpuBackward, GpuPath};

    /// One lookup for [`crate::ops::gpu_path::run`].
    pub(super) struct Lookup<B: Backend> {
        pub(super) tokens: Tensor<B, 2>,
        pub(super) positions: Option<Tensor<B, 2>>,
        pub(super) ids: Tensor<B, 2, Int>,
        pub(super) mask_pad: Tensor<B, 2, Bool>,
    }

    impl<B: Backend> Lookup<B> {
        /// The ids (`G`'s under `Autodiff<G>` too) and the padding mask as floats on `G`.
        fn ids_and_padding<G: Backend>(&self) -> (IntTensor<G>, FloatTensor<G>) {
            (same_type(self.ids.clone().into_primitive()), padding_on::<B, G>(&self.mask_pad))
        }
    }

    impl<B: Backend> GpuPath<B> for Lookup<B> {
        type Output = Tensor<B, 3>;

        fn plain<G: GpuKernels>(self) -> Tensor<B, 3> {
            let (ids, padding) = self.ids_and_padding::<G>();
            let table = |t: Tensor<B, 2>| same_type::<_, Tensor<G, 2>>(t).into_primitive().tensor();
            let out = G::lookup_forward(table(self.tokens), self.positions.map(table), ids, padding);
            same_type(Tensor::<G, 3>::from_primitive(TensorPrimitive::Float(out)))
        }

        fn autodiff<G: GpuKernels>(self) -> Tensor<B, 3> {
            let (ids, padding) = self.ids_and_padding::<G>();
            let table = |t: Tensor<B, 2>| same_type::<_, Tensor<Autodiff<G>, 2>>(t).into_primitive().tensor();
            let kept = Kept {
                ids: ids.clone(),
                padding: padding.clone(),
                vocab: self.tokens.dims()[0],
                position_rows: self.positions.as_ref().map(|p| p.dims()[0]),
            };
            let (tokens, positions) = (table(self.tokens), self.positions.map(table));
            let out = match positions {
                None => gpu_node(Backward, [tokens], |[tokens], tracked| {
                    (G::lookup_forward(tokens, None, ids, padding), tracked.then_some(kept))
                }),
                Some(positions) => gpu_node(Backward, [tokens, positions], |[tokens, positions], tracked| {
                    (G::lookup_forward(tokens, Some(positions), ids, padding), tracked.then_some(kept))
                }),
            };
            same_type(Tensor::<Autodiff<G>, 3>::from_primitive(TensorPrimitive::Float(out)))
        }
    }

    /// What the backward pass reads: the ids, the padding mask, and the tables' rows.
    #[derive(Clone, Debug)]
    struct Kept<G: Backend> {
        ids: IntTensor<G>,
        padding: FloatTensor<G>,
        vocab: usize,
        position_rows: Option<usize>,
    }

    /// The lookup's backward pass: the token table's gradient (and the position table's, `N` = 2).
    #[derive(Debug)]
    struct Backward;

    impl<G: GpuKernels, const N: usize> GpuBackward<G, N> for Backward {
        type Kept = Kept<G>;

        fn input_gradients(self, kept: Kept<G>, grad: FloatTensor<G>) -> [FloatTensor<G>; N] {
            let (d_tokens, d_positions) =
                G::lookup_backward(grad, kept.ids, kept.padding, kept.vocab, kept.position_rows);
            let gradients: Vec<_> = [Some(d_tokens), d_positions].into_iter().flatten().collect();
            gradients.try_into().unwrap_or_else(|_| unreachable!("a gradient for each table"))
        }
    }
}
