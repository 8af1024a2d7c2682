// Matrix products of many activation rows (prefill) for XLA:CPU, called through jax.ffi (see
// jaxinfer/cpu/ffi/__init__.py). Same contract as matvec.cc:
//
//   jaxinfer_gemm_f32    y[M, N] = x[M, K] . w[N, K]^T                 (w float32, K-major)
//   jaxinfer_gemm_int8   y[M, N] = (x . w^T) * scale[N]                (w int8)
//   jaxinfer_gemm_e4m3   y[M, N] = (x . decode(w)^T) * scale[N]        (w: e4m3 bit patterns typed int8)
//
// With tens to hundreds of rows the product is bound by arithmetic, not by reading the weight, so it is
// computed as outer products in registers: y^T[n, m] = sum_k w[n, k] x^T[k, m]. The activations are transposed
// once, in blocks of kCols rows (two vectors), each block [K, kCols] contiguous. Each thread takes groups of
// kGroup x kRows weight rows and widens them once into a float32 panel (an 8-bit weight is decoded exactly
// once per call); then for every block of activation rows, in passes of kDepth values of k that stay in L1,
// the micro-kernel runs for each tile of kRows weight rows: per k, two vector loads of x^T and kRows
// broadcasts from the panel feed 2 x kRows fused multiply-adds into 2 x kRows accumulators. A tile of y is
// stored (scaled) once its whole K sum is done. Laying each activation block out contiguously mattered most:
// reading x^T [K, M] with a row stride of M floats mapped a pass onto a few L1 sets (~245 -> ~300 GFLOP/s
// on the 2-core Xeon, where XLA's own float32 dot reaches ~330).
#include <cstring>
#include <memory>

#include "kernel_common.h"

namespace {

constexpr int kRows = kLanes == 16 ? 12 : 6;  // weight rows per tile: 2 x kRows accumulators + 3 registers
constexpr int kCols = 2 * kLanes;             // activation rows per tile (two vectors)

// x [M, K] -> xt: for each block of kCols activation rows, [K, kCols] (rows m >= M zero), so the micro-kernel
// reads one contiguous run; k in [k0, k1).
void transpose_rows(const float* x, float* xt, int64_t M, int64_t K, int64_t k0, int64_t k1) {
  for (int64_t m0 = 0; m0 < M; m0 += kCols) {
    float* block = xt + (m0 / kCols) * K * kCols;
    const int64_t cols = std::min<int64_t>(kCols, M - m0);
    for (int64_t k = k0; k < k1; ++k) {
      float* out = block + k * kCols;
      for (int64_t c = 0; c < cols; ++c) out[c] = x[(m0 + c) * K + k];
      for (int64_t c = cols; c < kCols; ++c) out[c] = 0.0f;
    }
  }
}

constexpr int kGroup = 4;          // tiles of kRows weight rows sharing each pass over x^T
constexpr int64_t kDepth = 256;    // k per pass: x^T [kDepth, kCols] and kRows panel rows stay in L1

// Rows [n0, n0 + rows) of w as float32 rows of panel [tiles x kRows, K]; rows past `rows` (up to whole tiles)
// are zero. (A k-major panel, each k's kRows values contiguous, measured no faster and needs a transpose.)
template <class Fmt>
void widen_panel(const typename Fmt::T* w, float* panel, int64_t K, int64_t n0, int64_t rows) {
  const int64_t k_vec = K / kLanes * kLanes, tiles = (rows + kRows - 1) / kRows;
  for (int64_t r = 0; r < tiles * kRows; ++r) {
    float* out = panel + r * K;
    if (r >= rows) {
      std::memset(out, 0, sizeof(float) * K);
      continue;
    }
    const typename Fmt::T* in = w + (n0 + r) * K;
    for (int64_t k = 0; k < k_vec; k += kLanes) *reinterpret_cast<f32v*>(out + k) = Fmt::load(in + k);
    for (int64_t k = k_vec; k < K; ++k) out[k] = Fmt::one(in[k]);
  }
}

// acc[r][v] += sum over k in [k0, k1) of tile[r, k] * xb[k, v * kLanes ..]: the micro-kernel.
inline void accumulate(const float* tile, const float* xb, int64_t K, int64_t k0, int64_t k1,
                       f32v (&acc)[kRows][2]) {
  f32v r[kRows][2];
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i) r[i][0] = acc[i][0], r[i][1] = acc[i][1];
  for (int64_t k = k0; k < k1; ++k) {
    const f32v a = *reinterpret_cast<const f32v*>(xb + k * kCols);
    const f32v b = *reinterpret_cast<const f32v*>(xb + k * kCols + kLanes);
    const float* wk = tile + k;
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      r[i][0] += wk[i * K] * a;
      r[i][1] += wk[i * K] * b;
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i) acc[i][0] = r[i][0], acc[i][1] = r[i][1];
}

// y rows [m0, m0 + cols), columns [n0, n0 + rows) <- acc (y^T tile), times the columns' scales; written row
// by row of y (a column-wise walk would hit one cache set per row when N is a multiple of 1024).
inline void store(const f32v (&acc)[kRows][2], const float* scale, float* y, int64_t N, int64_t m0, int64_t n0,
                  int64_t rows, int64_t cols) {
  float lanes[kRows][kCols];
  for (int64_t r = 0; r < rows; ++r) {
    const f32v s = f32v{} + (scale ? scale[n0 + r] : 1.0f);
    const f32v lo = acc[r][0] * s, hi = acc[r][1] * s;
    std::memcpy(lanes[r], &lo, sizeof(f32v));
    std::memcpy(lanes[r] + kLanes, &hi, sizeof(f32v));
  }
  for (int64_t c = 0; c < cols; ++c) {
    float* out = y + (m0 + c) * N + n0;
    for (int64_t r = 0; r < rows; ++r) out[r] = lanes[r][c];
  }
}

// Weight rows of groups [g0, g1) (kGroup * kRows rows each) for every activation row.
template <class Fmt>
void gemm_groups(const float* xt, const typename Fmt::T* w, const float* scale, float* y, int64_t M, int64_t K,
                 int64_t N, int64_t g0, int64_t g1) {
  constexpr int64_t kGroupRows = kGroup * kRows;
  std::unique_ptr<float[]> panel(new float[kGroupRows * K]);  // every row is written before it is read
  f32v acc[kGroup][kRows][2];
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t n0 = g * kGroupRows, rows = std::min(kGroupRows, N - n0);
    const int64_t tiles = (rows + kRows - 1) / kRows;
    widen_panel<Fmt>(w, panel.get(), K, n0, rows);
    for (int64_t m0 = 0; m0 < M; m0 += kCols) {
      for (int64_t t = 0; t < tiles; ++t)
        for (int i = 0; i < kRows; ++i) acc[t][i][0] = acc[t][i][1] = f32v{};
      for (int64_t k0 = 0; k0 < K; k0 += kDepth)
        for (int64_t t = 0; t < tiles; ++t)
          accumulate(panel.get() + t * kRows * K, xt + (m0 / kCols) * K * kCols, K, k0, std::min(K, k0 + kDepth),
                     acc[t]);
      for (int64_t t = 0; t < tiles; ++t)
        store(acc[t], scale, y, N, m0, n0 + t * kRows, std::min<int64_t>(kRows, rows - t * kRows),
              std::min<int64_t>(kCols, M - m0));
    }
  }
}

template <class Fmt>
ffi::Error gemm(ffi::ThreadPool& pool, const float* x, Dims xd, const typename Fmt::T* w, Dims wd,
                const float* scale, const Dims* scale_dims, float* y) {
  if (const char* bad = product_shape_error(xd, wd, scale_dims)) return ffi::Error::InvalidArgument(bad);
  const int64_t M = xd[0], K = xd[1], N = wd[0];
  if (M == 0 || N == 0) return ffi::Error::Success();
  const int64_t Mp = (M + kCols - 1) / kCols * kCols;
  std::unique_ptr<float[]> xt(new float[std::max<int64_t>(K, 1) * Mp]);  // the transpose writes every entry
  float* xtp = xt.get();
  parallel_rows(pool, K, std::max<int64_t>(16, K / 8), [=](int64_t k0, int64_t k1) {
    transpose_rows(x, xtp, M, K, k0, k1);
  });
  const int64_t groups = (N + kGroup * kRows - 1) / (kGroup * kRows);
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t per_chunk = std::max<int64_t>(1, groups / (4 * threads));
  parallel_rows(pool, groups, per_chunk, [=](int64_t g0, int64_t g1) {
    gemm_groups<Fmt>(xtp, w, scale, y, M, K, N, g0, g1);
  });
  return ffi::Error::Success();
}

}  // namespace

JAXINFER_PRODUCT_HANDLERS(jaxinfer_gemm, gemm);
