//! Matrix products in host memory for the CPU fast paths, with the `gemm` crate that Flex's own
//! matmul runs on, written straight into a caller's buffer.
//!
//! A buffer of f32 values becomes a Flex tensor without a copy (`TensorData::new`), while Flex's
//! matmul allocates its output zero-filled as bytes and then copies it into an aligned buffer:
//! two extra passes over every output (about 6 % of an LSTM training step).

/// A read-only matrix over host values: `rows × cols`, element `(i, j)` at
/// `i × row_stride + j × col_stride`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Matrix<'a> {
    values: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Matrix<'a> {
    /// Row-major `[rows, cols]`.
    pub(crate) fn rows(values: &'a [f32], rows: usize, cols: usize) -> Self {
        Self { values, rows, cols, row_stride: cols, col_stride: 1 }
    }

    /// The same matrix with its rows `row_stride` values apart (rows picked out of a wider or
    /// interleaved buffer).
    pub(crate) fn with_row_stride(self, row_stride: usize) -> Self {
        Self { row_stride, ..self }
    }

    /// The transpose, as a view.
    pub(crate) fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }

    /// Whether every element lies inside `values`.
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride < self.values.len()
    }
}

/// Row-major `[rows, cols]` `values` as row-major `[cols, rows]`.
pub(crate) fn transposed(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(values.len(), rows * cols, "transposed: {} values as [{rows}, {cols}]", values.len());
    let mut out = vec![0f32; rows * cols];
    for (r, row) in values.chunks_exact(cols.max(1)).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
    out
}

/// `out = a · b`, or with `accumulate` `out += a · b`; `out` is row-major `[a.rows, b.cols]`.
pub(crate) fn host_matmul(out: &mut [f32], a: Matrix, b: Matrix, accumulate: bool) {
    assert!(
        b.rows == a.cols && out.len() == a.rows * b.cols && a.fits() && b.fits(),
        "host_matmul: {a:?} · {b:?} into {} values",
        out.len()
    );
    // SAFETY: checked just above.
    unsafe { gemm_into(out.as_mut_ptr(), a, b, accumulate) }
}

/// `a · b` as a new row-major `[a.rows, b.cols]` buffer, not zero-filled first where gemm's
/// blocked path writes every value (which it does without reading them).
pub(crate) fn host_product(a: Matrix, b: Matrix) -> Vec<f32> {
    assert!(b.rows == a.cols && a.fits() && b.fits(), "host_product: {a:?} · {b:?}");
    let len = a.rows * b.cols;
    if a.rows <= 1 || b.cols <= 1 || a.cols == 0 {
        // gemm's vector paths and the empty product may read the output: start from zeros.
        let mut out = vec![0f32; len];
        host_matmul(&mut out, a, b, false);
        return out;
    }
    let mut out = Vec::with_capacity(len);
    // SAFETY: the sizes are checked above and `out` has room for `len` values; with more than one
    // row and column and a non-empty inner dimension, gemm's blocked path writes each of them
    // (without reading it first: `accumulate` is off), so all `len` are initialised. (gemm's
    // `experimental-apple-amx` kernel would read them first; that feature is not enabled.)
    unsafe {
        gemm_into(out.as_mut_ptr(), a, b, false);
        out.set_len(len);
    }
    out
}

/// The product into `out` (`a.rows × b.cols` values, row-major) with `gemm`, on one thread below
/// Flex's threshold for using all of them (192³ multiply-adds; an LSTM step of hidden 128
/// crosses it at batch 109), on the current rayon pool's threads above.
///
/// # Safety
/// `a.cols == b.rows`, both views fit their values, and `out` is valid for writing (and, with
/// `accumulate`, reading) `a.rows × b.cols` values that overlap neither.
unsafe fn gemm_into(out: *mut f32, a: Matrix, b: Matrix, accumulate: bool) {
    let [m, k, n] = [a.rows, a.cols, b.cols];
    if m == 0 || n == 0 {
        return;
    }
    let parallelism = if m * n * k >= 192 * 192 * 192 { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
    let stride = |s: usize| s as isize;
    // SAFETY: the caller's contract; gemm reads `a` and `b` only at the elements their views name.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out,
            1,
            stride(n),
            accumulate,
            a.values.as_ptr(),
            stride(a.col_stride),
            stride(a.row_stride),
            b.values.as_ptr(),
            stride(b.col_stride),
            stride(b.row_stride),
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{host_matmul, host_product, transposed, Matrix};

    /// `a · b` by the definition, for row-major `a` (`[m, k]`) and `b` (`[k, n]`).
    fn naive(a: &[f32], b: &[f32], [m, k, n]: [usize; 3]) -> Vec<f32> {
        (0..m).flat_map(|i| (0..n).map(move |j| (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum())).collect()
    }

    #[test]
    fn transposed_and_strided_views_multiply_as_their_values() {
        let [m, k, n] = [5, 7, 3];
        let a: Vec<f32> = (0..m * k).map(|i| (i % 5) as f32 - 2.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 3) as f32 * 0.5).collect();
        let expected = naive(&a, &b, [m, k, n]);
        let mut out = vec![1.0; m * n];
        host_matmul(&mut out, Matrix::rows(&a, m, k), Matrix::rows(&b, k, n), false);
        assert_eq!(out, expected, "plain");
        // aᵀ stored row-major, read back transposed; b inside rows twice as wide.
        let a_t: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        assert_eq!(transposed(&a, m, k), a_t);
        let wide: Vec<f32> = b.chunks(n).flat_map(|row| row.iter().chain(row).copied()).collect();
        host_matmul(&mut out, Matrix::rows(&a_t, k, m).t(), Matrix::rows(&wide, k, n).with_row_stride(2 * n), true);
        assert_eq!(out, expected.iter().map(|v| 2.0 * v).collect::<Vec<_>>(), "accumulated, transposed and strided");
        assert_eq!(host_product(Matrix::rows(&a, m, k), Matrix::rows(&b, k, n)), expected, "new buffer");
        for [m, k, n] in [[1, 7, 3], [5, 7, 1], [5, 0, 3], [0, 7, 3]] {
            let product = host_product(Matrix::rows(&a[..m * k], m, k), Matrix::rows(&b[..k * n], k, n));
            assert_eq!(product, naive(&a[..m * k], &b[..k * n], [m, k, n]), "[{m}, {k}] · [{k}, {n}]");
        }
    }
}
