//! Averaging gradients across replicas: flat buckets, and only the touched embedding rows.

use std::ops::Range;
use std::time::Instant;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use tandem_data::Encoded;
use tandem_models::Classifier;
use tandem_ops::on_cpu;

use crate::collective::{self, AllReduceKind};
use crate::ranks::CrossRank;

/// Communication of one replica, summed over steps.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct CommStats {
    /// Optimizer steps covered.
    pub steps: u64,
    /// All-reduce calls (one per bucket, plus one for the embedding rows).
    pub all_reduce_calls: u64,
    /// f32 values all-reduced.
    pub elements: u64,
    /// Bytes this replica sent (= received), as the all-reduce algorithm moves them.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Bytes a dense all-reduce of every gradient would have sent, for comparison.
    pub dense_bytes: u64,
    /// Wall time inside all-reduce calls, including waiting for the slowest replica.
    pub seconds: f64,
    /// Bytes this replica sent to other ranks (multi-process jobs), as a ring all-reduce moves
    /// them (MPI does not report its own).
    #[serde(default)]
    pub cross_rank_bytes: u64,
    /// Part of `seconds` spent in all-reduces across ranks.
    #[serde(default)]
    pub cross_rank_seconds: f64,
}

impl CommStats {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &CommStats) {
        self.steps += other.steps;
        self.all_reduce_calls += other.all_reduce_calls;
        self.elements += other.elements;
        self.bytes_sent += other.bytes_sent;
        self.bytes_received += other.bytes_received;
        self.dense_bytes += other.dense_bytes;
        self.seconds += other.seconds;
        self.cross_rank_bytes += other.cross_rank_bytes;
        self.cross_rank_seconds += other.cross_rank_seconds;
    }
}

/// One float parameter, in module visiting order.
#[derive(Clone, Debug)]
struct Slot {
    id: ParamId,
    dims: Vec<usize>,
}

impl Slot {
    fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// How one replica exchanges its gradients: which parameters travel in which bucket, and
/// whether the token-embedding table travels as the rows the global batch touched.
///
/// Every replica builds the same exchange from the same model, so their all-reduce calls
/// line up one for one. In a multi-process job each sum over the local replicas is then summed
/// over the ranks: replica `j` of every rank over link `j`. (Every local replica sends the whole
/// sum, R times the bytes of one; Horovod's reduce-scatter would avoid that.)
#[derive(Debug)]
pub struct GradientExchange {
    rank: usize,
    peers: usize,
    kind: AllReduceKind,
    slots: Vec<Slot>,
    /// Index in `slots` of the token-embedding table exchanged row-wise.
    sparse: Option<usize>,
    /// Ranges of dense slot indices (`slots` without `sparse`), one per bucket.
    buckets: Vec<Range<usize>>,
    /// A bucket's bound, and the bytes of the last bucket's dense gradients: the embedding rows
    /// travel in that bucket where they fit, in a call of their own where they don't.
    bucket_bytes: usize,
    last_bucket_bytes: usize,
    /// The link to the other ranks of a multi-process job.
    cross: Option<CrossRank>,
}

impl GradientExchange {
    /// Plans the exchange for replica `rank` of `peers`: dense gradients in buckets of at most
    /// `bucket_bytes` (a larger tensor gets a bucket of its own); with `sparse_embedding`, the
    /// token-embedding table row-wise.
    pub fn new<B: AutodiffBackend>(
        model: &Classifier<B>,
        rank: usize,
        peers: usize,
        kind: AllReduceKind,
        bucket_bytes: usize,
        sparse_embedding: bool,
    ) -> Self {
        let mut shapes = Shapes(Vec::new());
        model.visit(&mut shapes);
        let slots = shapes.0;
        let embedding = model.token_embedding_id().filter(|_| sparse_embedding);
        let sparse = embedding.and_then(|id| slots.iter().position(|s| s.id == id && s.dims.len() == 2));
        let dense: Vec<usize> = (0..slots.len()).filter(|&i| Some(i) != sparse).map(|i| slots[i].numel() * 4).collect();
        let mut buckets = Vec::new();
        let (mut start, mut bytes) = (0, 0);
        for (i, size) in dense.iter().enumerate() {
            if i > start && bytes + size > bucket_bytes {
                buckets.push(start..i);
                (start, bytes) = (i, 0);
            }
            bytes += size;
        }
        if start < dense.len() {
            buckets.push(start..dense.len());
        }
        let last_bucket_bytes = buckets.last().map_or(0, |last| dense[last.clone()].iter().sum());
        Self { rank, peers, kind, slots, sparse, buckets, bucket_bytes, last_bucket_bytes, cross: None }
    }

    /// Sums every all-reduce over the ranks of a multi-process job too.
    pub(crate) fn set_cross_rank(&mut self, cross: CrossRank) {
        self.cross = Some(cross);
    }

    /// Number of dense buckets per step.
    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Whether the token-embedding table travels row-wise.
    pub fn is_row_sparse(&self) -> bool {
        self.sparse.is_some()
    }

    /// The weighted average of every replica's gradients: each replica passes the mean-loss
    /// gradients of its shard (`None` for an empty shard) and `weight` = shard size / global
    /// batch size, so the result is the gradient of the mean loss over the whole global batch,
    /// exactly as one device computing the whole batch would get it. `rows` lists every token id
    /// of the global batch (see [`touched_rows`]); every replica must pass the same list.
    pub fn average<B: AutodiffBackend>(
        &mut self,
        model: &Classifier<B>,
        local: Option<GradientsParams>,
        weight: f64,
        rows: &[i64],
        device: &B::Device,
    ) -> Result<(GradientsParams, CommStats), String> {
        let sparse_id = self.sparse.map(|i| self.slots[i].id);
        let rows_tensor = (sparse_id.is_some() && !rows.is_empty()).then(|| {
            Tensor::<B::InnerBackend, 1, Int>::from_data(TensorData::new(rows.to_vec(), [rows.len()]), device)
        });
        let mut flatten = Flatten::<B> {
            grads: local,
            sparse_id,
            rows: rows_tensor.clone(),
            flats: Vec::new(),
            sparse: None,
            table: None,
            device,
        };
        model.visit(&mut flatten);

        let mut stats = CommStats { steps: 1, ..Default::default() };
        stats.dense_bytes = self.kind.bytes_per_peer(
            4 * self.slots.iter().map(Slot::numel).sum::<usize>() as u64,
            self.rank,
            self.peers,
        );
        let mut reduced = Vec::with_capacity(flatten.flats.len());
        let mut flats = flatten.flats.into_iter();
        let fits = |rows: &Tensor<B::InnerBackend, 2>| {
            !self.buckets.is_empty() && self.last_bucket_bytes + 4 * rows.shape().num_elements() <= self.bucket_bytes
        };
        let (mut rides_along, alone) = match flatten.sparse {
            Some(rows) if fits(&rows) => (Some(rows), None),
            rows => (None, rows),
        };
        let mut sparse = None;
        for (b, bucket) in self.buckets.clone().into_iter().enumerate() {
            let mut parts: Vec<Tensor<B::InnerBackend, 1>> = flats.by_ref().take(bucket.len()).collect();
            let sizes: Vec<usize> = parts.iter().map(|t| t.dims()[0]).collect();
            let rows_here = rides_along.take_if(|_| b + 1 == self.buckets.len());
            let rows_shape = rows_here.as_ref().map(|t| t.dims());
            parts.extend(rows_here.map(|t| t.reshape([-1])));
            let summed = self.all_reduce(Tensor::cat(parts, 0).mul_scalar(weight), &mut stats)?;
            let mut offset = 0;
            for size in sizes {
                reduced.push(summed.clone().slice(offset..offset + size));
                offset += size;
            }
            if let Some([rows, cols]) = rows_shape {
                sparse = Some(summed.slice(offset..offset + rows * cols).reshape([rows, cols]));
            }
        }
        if let Some(rows) = alone {
            sparse = Some(self.all_reduce(rows.mul_scalar(weight), &mut stats)?);
        }
        let mut unflatten = Unflatten::<B, _> {
            grads: GradientsParams::new(),
            flats: reduced.into_iter(),
            sparse_id,
            rows: rows_tensor,
            row_ids: rows,
            sparse,
            table: flatten.table,
            device,
        };
        model.visit(&mut unflatten);
        Ok((unflatten.grads, stats))
    }

    fn all_reduce<B: burn::tensor::backend::Backend, const D: usize>(
        &mut self,
        tensor: Tensor<B, D>,
        stats: &mut CommStats,
    ) -> Result<Tensor<B, D>, String> {
        let elements = tensor.shape().num_elements() as u64;
        let bytes = self.kind.bytes_per_peer(4 * elements, self.rank, self.peers);
        let started = Instant::now();
        let summed = if self.peers > 1 { collective::all_reduce_sum(self.rank, tensor)? } else { tensor };
        let summed = match &mut self.cross {
            Some(cross) => reduce_across_ranks(cross, summed, stats)?,
            None => summed,
        };
        stats.seconds += started.elapsed().as_secs_f64();
        stats.all_reduce_calls += 1;
        stats.elements += elements;
        stats.bytes_sent += bytes;
        stats.bytes_received += bytes;
        Ok(summed)
    }
}

/// Sums `tensor` over the ranks through host memory (MPI moves host buffers).
fn reduce_across_ranks<B: burn::tensor::backend::Backend, const D: usize>(
    cross: &mut CrossRank,
    tensor: Tensor<B, D>,
    stats: &mut CommStats,
) -> Result<Tensor<B, D>, String> {
    let (device, shape) = (tensor.device(), tensor.shape());
    let mut values = tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| format!("cannot read a gradient bucket: {e:?}"))?;
    let started = Instant::now();
    cross.link.all_reduce_sum(&mut values, cross.timeout).map_err(|e| e.to_string())?;
    stats.cross_rank_seconds += started.elapsed().as_secs_f64();
    stats.cross_rank_bytes += AllReduceKind::Ring.bytes_per_peer(4 * values.len() as u64, 0, cross.ranks);
    Ok(Tensor::from_data(TensorData::new(values, shape), &device))
}

/// Every token id in the global batch `indices` of `data`, sorted and without repeats: the only
/// embedding rows whose gradient can be non-zero on any replica.
pub(crate) fn touched_rows(data: &Encoded, indices: &[usize]) -> Vec<i64> {
    let mut rows: Vec<i64> = indices
        .iter()
        .flat_map(|&i| &data.tokens[i * data.max_len..(i + 1) * data.max_len])
        .map(|&t| i64::from(t))
        .collect();
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// Records every float parameter's id and shape.
struct Shapes(Vec<Slot>);

impl<B: AutodiffBackend> ModuleVisitor<B> for Shapes {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push(Slot { id: param.id, dims: param.lazy_shape().iter().copied().collect() });
    }
}

/// Takes each parameter's gradient (zeros where there is none) as a flat vector; the
/// token-embedding gradient as its touched rows only.
struct Flatten<'a, B: AutodiffBackend> {
    grads: Option<GradientsParams>,
    sparse_id: Option<ParamId>,
    rows: Option<Tensor<B::InnerBackend, 1, Int>>,
    flats: Vec<Tensor<B::InnerBackend, 1>>,
    sparse: Option<Tensor<B::InnerBackend, 2>>,
    /// This replica's own gradient of the whole table, `[rows, cols]`, kept on a CPU backend
    /// for the reduced rows to be written over.
    table: Option<Tensor<B::InnerBackend, 2>>,
    device: &'a B::Device,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let shape = param.lazy_shape();
        let grad = self
            .grads
            .as_mut()
            .and_then(|g| g.remove::<B::InnerBackend, D>(param.id))
            .unwrap_or_else(|| Tensor::zeros(shape.clone(), self.device));
        match (&self.rows, Some(param.id) == self.sparse_id) {
            (Some(rows), true) => {
                let table = grad.reshape([shape[0] as i32, -1]);
                self.sparse = Some(table.clone().select(0, rows.clone()));
                self.table = on_cpu::<B::InnerBackend>().then_some(table);
            }
            // No token at all in the batch (never in practice): nothing to exchange.
            (None, true) => {}
            (_, false) => self.flats.push(grad.reshape([-1])),
        }
    }
}

/// Registers the reduced gradients back under their parameters, in their shapes.
struct Unflatten<'a, B: AutodiffBackend, I: Iterator<Item = Tensor<B::InnerBackend, 1>>> {
    grads: GradientsParams,
    flats: I,
    sparse_id: Option<ParamId>,
    rows: Option<Tensor<B::InnerBackend, 1, Int>>,
    /// The same rows, in host memory.
    row_ids: &'a [i64],
    sparse: Option<Tensor<B::InnerBackend, 2>>,
    /// This replica's own gradient of the table (CPU backends only): zero but on the rows of its
    /// shard, all among `rows`, so writing the reduced rows over it gives the reduced table.
    table: Option<Tensor<B::InnerBackend, 2>>,
    device: &'a B::Device,
}

impl<B: AutodiffBackend, I: Iterator<Item = Tensor<B::InnerBackend, 1>>> ModuleVisitor<B> for Unflatten<'_, B, I> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let shape = param.lazy_shape();
        let grad: Tensor<B::InnerBackend, D> = if Some(param.id) == self.sparse_id {
            let [rows, cols] = [shape[0], shape.num_elements() / shape[0].max(1)];
            let dense = match (self.rows.take(), self.sparse.take(), self.table.take()) {
                (Some(_), Some(values), Some(table)) => write_rows_in_host_memory(table, values, self.row_ids),
                (Some(ids), Some(values), _) => {
                    Tensor::zeros([rows, cols], self.device).select_assign(0, ids, values, IndexingUpdateOp::Add)
                }
                _ => Tensor::zeros([rows, cols], self.device),
            };
            dense.reshape(shape)
        } else {
            self.flats.next().expect("one reduced vector per dense parameter").reshape(shape)
        };
        self.grads.register::<B::InnerBackend, D>(param.id, grad);
    }
}

/// `table` with `values[k]` written over its row `row_ids[k]`, in host memory: on a CPU backend
/// the table's own buffer is reused (it is this replica's alone), so a step neither allocates
/// nor zeroes another table, and only the touched rows are written.
fn write_rows_in_host_memory<B: burn::tensor::backend::Backend>(
    table: Tensor<B, 2>,
    values: Tensor<B, 2>,
    row_ids: &[i64],
) -> Tensor<B, 2> {
    let (device, [rows, cols]) = (table.device(), table.dims());
    let values = values.into_data().convert::<f32>();
    let copied: Vec<f32>;
    let values = match values.as_slice::<f32>() {
        Ok(values) => values,
        Err(_) => {
            copied = values.iter::<f32>().collect();
            &copied
        }
    };
    let write = |dense: &mut [f32]| {
        for (row, values) in row_ids.iter().zip(values.chunks_exact(cols.max(1))) {
            let at = *row as usize * cols;
            dense[at..at + cols].copy_from_slice(values);
        }
    };
    let table = table.into_data();
    let dtype = table.dtype;
    let mut table = table.convert::<f32>();
    if let Ok(dense) = table.as_mut_slice::<f32>() {
        write(dense);
    } else {
        let mut dense: Vec<f32> = table.iter::<f32>().collect();
        write(&mut dense);
        table = TensorData::new(dense, [rows, cols]);
    }
    Tensor::from_data(table.convert_dtype(dtype), &device)
}
