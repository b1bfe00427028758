/* burn-mlx's `cblas_sgemm` for libmlx (see mlx-sys/blas.rs): matrix-vector shapes go to
 * burn-mlx's own matrix-vector loops (or OpenBLAS's sgemv), everything else to OpenBLAS's sgemm.
 *
 * MLX's CPU backend computes every f32 matmul with one cblas_sgemm call per batch entry. When
 * one side of the product is a single row or column (a decoder's per-token step: activations
 * [1, in] times weights [in, out]), OpenBLAS's GEMM driver still packs the whole weight matrix
 * into its panel buffers before the kernel reads it, so each token copies every weight once more
 * than it needs to; a matrix-vector product reads each weight once. The results are the same
 * products summed in another order (f32 rounding).
 *
 * The matrix-vector loops are plain C that the compiler vectorizes (sixteen running sums per
 * row); a product of at least 2^16 weights is cut into parts for the calling thread and helper
 * threads (one thread per online core in all, up to 8, or BURN_MLX_GEMV_THREADS), which spin for
 * a few hundred microseconds after each product (a decode step's products come microseconds
 * apart) and then sleep. On a 2-core AMD EPYC VM OpenBLAS's threaded
 * sgemv and its spinning workers left a decode step at 1.5-2x the time the weights take to
 * stream from memory. BURN_MLX_GEMV=openblas sends these products to OpenBLAS's sgemv instead.
 *
 * Only the row-major interface MLX uses is forwarded directly; a column-major call is the
 * row-major one with the operands swapped. Empty products and everything with more than one row
 * and column go to sgemm unchanged. */

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { ROW_MAJOR = 101, COL_MAJOR = 102, NO_TRANS = 111, TRANS = 112 };

void scipy_cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                       const float *a, int lda, const float *b, int ldb, float beta, float *c,
                       int ldc);
void scipy_cblas_sgemv(int order, int trans, int rows, int cols, float alpha, const float *a,
                       int lda, const float *x, int incx, float beta, float *y, int incy);

/* y[i * incy] = alpha * (row i of B) . x + beta * y[i * incy] for the n rows of k values of B
 * (row stride ldb), x contiguous. Sixteen running sums per row, so that the loop vectorizes. */
static void gemv_rows(long n, long k, float alpha, const float *b, long ldb, const float *x,
                      float beta, float *y, long incy) {
  for (long i = 0; i < n; i++) {
    const float *row = b + i * ldb;
    float acc[16] = {0};
    long j = 0;
    for (; j + 16 <= k; j += 16)
      for (int t = 0; t < 16; t++) acc[t] += row[j + t] * x[j + t];
    float s = 0.0f;
    for (int t = 0; t < 16; t++) s += acc[t];
    for (; j < k; j++) s += row[j] * x[j];
    /* BLAS leaves y unread when beta is 0 (MLX hands over fresh memory). */
    float prev = beta == 0.0f ? 0.0f : beta * y[i * incy];
    y[i * incy] = alpha * s + prev;
  }
}

/* y = alpha * Bᵀ x + beta * y over n columns of B, which has k rows (row stride ldb); x and y
 * contiguous: y accumulates x[i] times row i, row after row. */
static void gemv_cols(long k, long n, float alpha, const float *b, long ldb, const float *x,
                      float beta, float *y) {
  if (beta == 0.0f)
    memset(y, 0, (size_t)n * sizeof(float));
  else if (beta != 1.0f)
    for (long j = 0; j < n; j++) y[j] *= beta;
  for (long i = 0; i < k; i++) {
    const float *row = b + i * ldb;
    float a = alpha * x[i];
    for (long j = 0; j < n; j++) y[j] += a * row[j];
  }
}

/* One matrix-vector product: gemv_rows (`rows`) or gemv_cols over n rows or columns. */
struct job {
  int rows;
  long n, k, ldb, incy;
  float alpha, beta;
  const float *b, *x;
  float *y;
};

/* Rows or columns [lo, hi) of `j`. */
static void run_part(const struct job *j, long lo, long hi) {
  if (j->rows)
    gemv_rows(hi - lo, j->k, j->alpha, j->b + lo * j->ldb, j->ldb, j->x, j->beta,
              j->y + lo * j->incy, j->incy);
  else
    gemv_cols(j->k, hi - lo, j->alpha, j->b + lo, j->ldb, j->x, j->beta, j->y + lo);
}

/* The helper threads' state: the job, how many parts it is cut into, the jobs posted, and the
 * helpers' parts finished of the current one. Helper i (1 to parts - 1) takes part i; the caller
 * takes part 0. */
static struct job shared_job;
static int shared_parts;
static atomic_long posted, parts_done;
static atomic_flag in_use = ATOMIC_FLAG_INIT;
static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int sleepers;

static inline void relax(void) {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Part `i` of `parts` of `j`: rows or columns [n i / parts, n (i + 1) / parts). */
static void run_share(const struct job *j, int i, int parts) {
  run_part(j, j->n * i / parts, j->n * (i + 1) / parts);
}

static void *helper_main(void *arg) {
  int index = (int)(long)arg;
  long seen = 0;
  for (;;) {
    long p;
    long spins = 0;
    while ((p = atomic_load_explicit(&posted, memory_order_acquire)) == seen) {
      if (++spins < (1L << 14)) {
        relax();
        continue;
      }
      pthread_mutex_lock(&wake_lock);
      sleepers++;
      while (atomic_load_explicit(&posted, memory_order_acquire) == seen)
        pthread_cond_wait(&wake, &wake_lock);
      sleepers--;
      pthread_mutex_unlock(&wake_lock);
      spins = 0;
    }
    seen = p;
    if (index < shared_parts) run_share(&shared_job, index, shared_parts);
    atomic_fetch_add(&parts_done, 1);
  }
  return NULL;
}

static pthread_once_t helper_once = PTHREAD_ONCE_INIT;
static int helpers;

/* Starts the helpers: BURN_MLX_GEMV_THREADS threads in all, or one per online core up to 8. */
static void start_helpers(void) {
  long want = sysconf(_SC_NPROCESSORS_ONLN);
  const char *v = getenv("BURN_MLX_GEMV_THREADS");
  if (v && atol(v) > 0) want = atol(v);
  if (want > 8 && !v) want = 8;
  for (long i = 1; i < want && i < 64; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, helper_main, (void *)i) != 0) break;
    pthread_detach(t);
    helpers++;
  }
}

/* Runs `j`: cut into parts for the caller and the helpers when it is large and the helpers are
 * free (another thread's product may hold them), else here. */
static void run(const struct job *j) {
  if (j->n * j->k < (1L << 16) || j->n < 2) {
    run_part(j, 0, j->n);
    return;
  }
  pthread_once(&helper_once, start_helpers);
  if (helpers == 0 || atomic_flag_test_and_set_explicit(&in_use, memory_order_acquire)) {
    run_part(j, 0, j->n);
    return;
  }
  int parts = helpers + 1 < j->n ? helpers + 1 : (int)j->n;
  shared_job = *j;
  shared_parts = parts;
  atomic_store_explicit(&parts_done, 0, memory_order_relaxed);
  long p = atomic_load_explicit(&posted, memory_order_relaxed) + 1;
  pthread_mutex_lock(&wake_lock);
  atomic_store(&posted, p);
  if (sleepers) pthread_cond_broadcast(&wake);
  pthread_mutex_unlock(&wake_lock);
  run_share(j, 0, parts);
  /* Every helper reports, also one without a part, so that none still reads the job when the
   * next one is written. */
  while (atomic_load_explicit(&parts_done, memory_order_acquire) != helpers) relax();
  atomic_flag_clear(&in_use);
}

/* Whether burn-mlx's own matrix-vector loops run (BURN_MLX_GEMV=openblas: OpenBLAS's sgemv). */
static int own_gemv(void) {
  static int on = -1;
  if (on < 0) {
    const char *v = getenv("BURN_MLX_GEMV");
    on = !(v && strcmp(v, "openblas") == 0);
  }
  return on;
}

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
    int incx = ta ? lda : 1;
    if (own_gemv() && incx == 1) {
      struct job j = {tb, n, k, ldb, 1, alpha, beta, b, a, c};
      run(&j);
      return;
    }
    if (beta == 0.0f) clear(c, n, 1);
    if (tb)
      scipy_cblas_sgemv(ROW_MAJOR, NO_TRANS, n, k, alpha, b, ldb, a, incx, beta, c, 1);
    else
      scipy_cblas_sgemv(ROW_MAJOR, TRANS, k, n, alpha, b, ldb, a, incx, beta, c, 1);
  } else {
    /* c (m x 1, stride ldc) = op(A) (m x k) b (k x 1). A is stored k x m when transposed. The
     * column of op(B) has stride ldb when B is stored as it is used (k x 1). */
    int incx = tb ? 1 : ldb;
    if (own_gemv() && incx == 1 && (!ta || ldc == 1)) {
      struct job j = {!ta, m, k, lda, ldc, alpha, beta, a, b, c};
      run(&j);
      return;
    }
    if (beta == 0.0f) clear(c, m, ldc);
    if (ta)
      scipy_cblas_sgemv(ROW_MAJOR, TRANS, k, m, alpha, a, lda, b, incx, beta, c, ldc);
    else
      scipy_cblas_sgemv(ROW_MAJOR, NO_TRANS, m, k, alpha, a, lda, b, incx, beta, c, ldc);
  }
}
