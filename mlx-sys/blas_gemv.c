/* burn-mlx's `cblas_sgemm` for libmlx (see mlx-sys/blas.rs): matrix-vector shapes go to
 * OpenBLAS's sgemv, everything else to its sgemm.
 *
 * MLX's CPU backend computes every f32 matmul with one cblas_sgemm call per batch entry. When
 * one side of the product is a single row or column (a decoder's per-token step: activations
 * [1, in] times weights [in, out]), OpenBLAS's GEMM driver still packs the whole weight matrix
 * into its panel buffers before the kernel reads it, so each token copies every weight once more
 * than it needs to; its GEMV reads each weight once. The results are the same products summed in
 * another order (f32 rounding).
 *
 * Only the row-major interface MLX uses is forwarded directly; a column-major call is the
 * row-major one with the operands swapped. Empty products and everything with more than one row
 * and column go to sgemm unchanged. */

enum { ROW_MAJOR = 101, COL_MAJOR = 102, NO_TRANS = 111, TRANS = 112 };

void scipy_cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                       const float *a, int lda, const float *b, int ldb, float beta, float *c,
                       int ldc);
void scipy_cblas_sgemv(int order, int trans, int rows, int cols, float alpha, const float *a,
                       int lda, const float *x, int incx, float beta, float *y, int incy);

/* BLAS leaves C unread when beta is 0, and MLX hands over fresh (uninitialised) memory: clear it
 * first, so that GEMV's scaling of y by 0 cannot turn a stale NaN into the result. */
static void clear(float *y, int n, int inc) {
  for (long i = 0; i < n; i++) y[i * inc] = 0.0f;
}

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c,
                 int ldc) {
  if (order == COL_MAJOR) {
    /* C = op(A) op(B) column-major is Cᵀ = op(B)ᵀ op(A)ᵀ row-major. */
    cblas_sgemm(ROW_MAJOR, trans_b, trans_a, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
    return;
  }
  int ta = trans_a != NO_TRANS, tb = trans_b != NO_TRANS;
  if (order != ROW_MAJOR || m <= 0 || n <= 0 || k <= 0 || (m != 1 && n != 1)) {
    scipy_cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (m == 1) {
    /* c (1 x n) = a (1 x k) op(B) (k x n): y = op(B)ᵀ x. B is stored n x k when transposed,
     * k x n when not. The row of op(A) has stride lda when A is stored transposed (k x 1). */
    if (beta == 0.0f) clear(c, n, 1);
    int incx = ta ? lda : 1;
    if (tb)
      scipy_cblas_sgemv(ROW_MAJOR, NO_TRANS, n, k, alpha, b, ldb, a, incx, beta, c, 1);
    else
      scipy_cblas_sgemv(ROW_MAJOR, TRANS, k, n, alpha, b, ldb, a, incx, beta, c, 1);
  } else {
    /* c (m x 1, stride ldc) = op(A) (m x k) b (k x 1). A is stored k x m when transposed. The
     * column of op(B) has stride ldb when B is stored as it is used (k x 1). */
    if (beta == 0.0f) clear(c, m, ldc);
    int incx = tb ? 1 : ldb;
    if (ta)
      scipy_cblas_sgemv(ROW_MAJOR, TRANS, k, m, alpha, a, lda, b, incx, beta, c, ldc);
    else
      scipy_cblas_sgemv(ROW_MAJOR, NO_TRANS, m, k, alpha, a, lda, b, incx, beta, c, ldc);
  }
}
