// Small-batch matrix products for XLA:CPU, called through jax.ffi (see jaxinfer/cpu/ffi/__init__.py).
//
//   jaxinfer_matvec_f32    y[M, N] = x[M, K] . w[N, K]^T                 (w float32, K-major)
//   jaxinfer_matvec_int8   y[M, N] = (x . w^T) * scale[N]                (w int8)
//   jaxinfer_matvec_e4m3   y[M, N] = (x . decode(w)^T) * scale[N]        (w: e4m3 bit patterns typed int8)
//   jaxinfer_matvec_bf16   y[M, N] = x . w^T                             (w bfloat16: half the bytes of float32)
//
// Decode steps multiply a handful of activation rows by every weight of the model, so their speed is the
// rate at which the weights stream from memory. Each output row n is the dot product of the weight's row n
// with each activation row: the weight is read once, front to back, in its stored width (an 8-bit weight is
// widened in registers, never in memory), blocks of activation rows share every weight vector loaded, and
// the rows of N are split into chunks that the caller and XLA's intra-op threads take from a shared counter.
// Each tile prefetches the next tile's weight rows: without it a thread waits on memory between tiles (a
// 32000 x 768 weight at 1 row, with / without: int8 19.6 / 12.6 GB/s, float32 31.7 / 28.6; at 16 rows 7.3 / 4.8
// and 14.3 / 9.0 GB/s).
// Accumulation is float32. e4m3 NaN (0x7F/0xFF) is not decoded as NaN (saturating quantizers never write it).
#include "kernel_common.h"

namespace {

constexpr int kWideRows = kLanes == 16 ? 4 : 2;  // weight rows per 4-row activation tile (registers allow)
constexpr int64_t kRowBlock = 64;  // activation rows per pass over the weight (their floats stay in L2)

// y[m0 + i, n0 + r] for i < MB, r < R: MB activation rows share every weight vector loaded for R rows.
template <class Fmt, int MB, int R>
inline void tile(const float* x, const typename Fmt::T* w, const float* scale, float* y, int64_t K, int64_t N,
                 int64_t m0, int64_t n0) {
  const int64_t k_vec = K / kLanes * kLanes;
  const typename Fmt::T* wr = w + n0 * K;
  const float* xr = x + m0 * K;
  const bool prefetch = n0 + 2 * R <= N;
  f32v acc[MB][R];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[i][r] = f32v{};
  for (int64_t k = 0; k < k_vec; k += kLanes) {
    f32v wv[R];
    if (prefetch && (k * sizeof(typename Fmt::T)) % 64 == 0) {  // the next tile's rows, a cache line each
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) __builtin_prefetch(wr + (R + r) * K + k);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = Fmt::load(wr + r * K + k);
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      const f32v xv = *reinterpret_cast<const f32v*>(xr + i * K + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[i][r] += xv * wv[r];
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int r = 0; r < R; ++r) {
      float s = lane_sum(acc[i][r]);
      for (int64_t k = k_vec; k < K; ++k) s += xr[i * K + k] * Fmt::one(wr[r * K + k]);
      y[(m0 + i) * N + n0 + r] = scale ? s * scale[n0 + r] : s;
    }
  }
}

// Output columns [n0, n1) for every activation row.
template <class Fmt>
void matvec_rows(const float* x, const typename Fmt::T* w, const float* scale, float* y, int64_t M, int64_t K,
                 int64_t N, int64_t n0, int64_t n1) {
  int64_t m = 0;
#if defined(__AVX512F__)
  for (; m + 8 <= M; m += 8) {
    int64_t n = n0;
    for (; n + 2 <= n1; n += 2) tile<Fmt, 8, 2>(x, w, scale, y, K, N, m, n);
    for (; n < n1; ++n) tile<Fmt, 8, 1>(x, w, scale, y, K, N, m, n);
  }
#endif
  for (; m + 4 <= M; m += 4) {
    int64_t n = n0;
    for (; n + kWideRows <= n1; n += kWideRows) tile<Fmt, 4, kWideRows>(x, w, scale, y, K, N, m, n);
    for (; n < n1; ++n) tile<Fmt, 4, 1>(x, w, scale, y, K, N, m, n);
  }
  for (; m + 2 <= M; m += 2) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) tile<Fmt, 2, 4>(x, w, scale, y, K, N, m, n);
    for (; n < n1; ++n) tile<Fmt, 2, 1>(x, w, scale, y, K, N, m, n);
  }
  for (; m < M; ++m) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) tile<Fmt, 1, 4>(x, w, scale, y, K, N, m, n);
    for (; n < n1; ++n) tile<Fmt, 1, 1>(x, w, scale, y, K, N, m, n);
  }
}

// Rows per chunk: a multiple of 4, at least 16, about 8 chunks per thread.
int64_t chunk_rows(ffi::ThreadPool& pool, int64_t N) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t rows = (N / (8 * threads) + 3) / 4 * 4;
  return std::max<int64_t>(16, rows);
}

template <class Fmt>
ffi::Error matvec(ffi::ThreadPool& pool, const float* x, Dims xd, const typename Fmt::T* w, Dims wd,
                  const float* scale, const Dims* scale_dims, float* y) {
  if (const char* bad = product_shape_error(xd, wd, scale_dims)) return ffi::Error::InvalidArgument(bad);
  const int64_t M = xd[0], K = xd[1], N = wd[0];
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, M - m0);
    const float* xb = x + m0 * K;
    float* yb = y + m0 * N;
    parallel_rows(pool, N, chunk_rows(pool, N), [=](int64_t n0, int64_t n1) {
      matvec_rows<Fmt>(xb, w, scale, yb, rows, K, N, n0, n1);
    });
  }
  return ffi::Error::Success();
}

ffi::Error MatvecBf16(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::BF16> w,
                      ffi::Result<ffi::Buffer<ffi::F32>> y) {
  return matvec<BF16>(pool, x.typed_data(), x.dimensions(), w.typed_data(), w.dimensions(), nullptr, nullptr,
                      y->typed_data());
}

}  // namespace

JAXINFER_PRODUCT_HANDLERS(jaxinfer_matvec, matvec);
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxinfer_matvec_bf16, MatvecBf16,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
