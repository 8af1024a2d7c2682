// Small-batch matrix products for XLA:CPU, called through jax.ffi (see jaxinfer/cpu_ffi/__init__.py).
//
//   jaxinfer_matvec_f32    y[M, N] = x[M, K] . w[N, K]^T                 (w float32, K-major)
//   jaxinfer_matvec_int8   y[M, N] = (x . w^T) * scale[N]                (w int8)
//   jaxinfer_matvec_e4m3   y[M, N] = (x . decode(w)^T) * scale[N]        (w: e4m3 bit patterns typed int8)
//
// Decode steps multiply a handful of activation rows by every weight of the model, so their speed is the
// rate at which the weights stream from memory. Each output row n is the dot product of the weight's row n
// with each activation row: the weight is read once, front to back, in its stored width (an 8-bit weight is
// widened in registers, never in memory), blocks of activation rows share every weight vector loaded, and
// the rows of N are split into chunks that the caller and XLA's intra-op threads take from a shared counter.
// Accumulation is float32. e4m3 NaN (0x7F/0xFF) is not decoded as NaN (saturating quantizers never write it).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;  // float32 lanes of one vector register
#else
constexpr int kLanes = 8;
#endif
constexpr int kWideRows = kLanes == 16 ? 4 : 2;  // weight rows per 4-row activation tile (registers allow)
constexpr int64_t kRowBlock = 64;  // activation rows per pass over the weight (their floats stay in L2)
typedef float f32v __attribute__((vector_size(4 * kLanes), aligned(4)));
typedef int32_t i32v __attribute__((vector_size(4 * kLanes), aligned(4)));
typedef int8_t i8v __attribute__((vector_size(kLanes), aligned(1)));

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

inline i32v widen_bytes(const int8_t* p) {  // kLanes signed bytes -> kLanes int32
#if defined(__AVX512F__)
  return (i32v)_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif defined(__AVX2__)
  return (i32v)_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#else
  return __builtin_convertvector(*reinterpret_cast<const i8v*>(p), i32v);
#endif
}

inline float e4m3_to_float(int8_t byte) {
  const int32_t b = byte, mag = b & 0x7F;
  float v;
  if (mag < 8) {
    v = static_cast<float>(mag) * (1.0f / 512.0f);  // subnormal: m * 2^-9
  } else {
    const int32_t bits = (mag << 20) + (120 << 23);  // exponent e - 7 + 127, mantissa m << 20
    __builtin_memcpy(&v, &bits, 4);
  }
  return (b & 0x80) ? -v : v;
}

// How each weight format turns 8 stored elements into 8 floats.
struct F32 {
  using T = float;
  static f32v load(const float* p) { return *reinterpret_cast<const f32v*>(p); }
  static float one(float v) { return v; }
};
struct Int8 {
  using T = int8_t;
  static f32v load(const int8_t* p) { return __builtin_convertvector(widen_bytes(p), f32v); }
  static float one(int8_t v) { return static_cast<float>(v); }
};
struct E4M3 {
  using T = int8_t;
  static f32v load(const int8_t* p) {
    const i32v b = widen_bytes(p);
    const i32v mag = b & 0x7F;
    const i32v normal_bits = (mag << 20) + (120 << 23);
    f32v normal;
    __builtin_memcpy(&normal, &normal_bits, sizeof normal);
    const f32v subnormal = __builtin_convertvector(mag, f32v) * (1.0f / 512.0f);
    f32v v = mag < 8 ? subnormal : normal;
    i32v bits;
    __builtin_memcpy(&bits, &v, sizeof bits);
    bits |= (b & 0x80) << 24;
    __builtin_memcpy(&v, &bits, sizeof v);
    return v;
  }
  static float one(int8_t v) { return e4m3_to_float(v); }
};

inline float lane_sum(f32v v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#elif defined(__AVX2__)
  const __m256 a = (__m256)v;
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
#else
  float s = 0.f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
#endif
}

// y[m0 + i, n0 + r] for i < MB, r < R: MB activation rows share every weight vector loaded for R rows.
template <class Fmt, int MB, int R>
inline void tile(const float* x, const typename Fmt::T* w, const float* scale, float* y, int64_t K, int64_t N,
                 int64_t m0, int64_t n0) {
  const int64_t k_vec = K / kLanes * kLanes;
  const typename Fmt::T* wr = w + n0 * K;
  const float* xr = x + m0 * K;
  f32v acc[MB][R];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[i][r] = f32v{};
  for (int64_t k = 0; k < k_vec; k += kLanes) {
    f32v wv[R];
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

// Runs body(n0, n1) over [0, N) in chunks of `rows` on the caller and XLA's intra-op threads. A chunk is
// taken from a shared counter, so helpers that start late (or never) leave their share to the caller; the
// caller returns once every chunk is finished, and a helper starting after that finds no chunk and returns.
template <class Body>
void parallel_rows(ffi::ThreadPool& pool, int64_t N, int64_t rows, Body body) {
  const int64_t chunks = (N + rows - 1) / rows;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), chunks) - 1;
  if (helpers <= 0) {
    body(0, N);
    return;
  }
  struct Progress {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> finished{0};
  };
  auto progress = std::make_shared<Progress>();
  auto work = [progress, chunks, rows, N, body]() {
    for (int64_t c; (c = progress->next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      body(c * rows, std::min(N, (c + 1) * rows));
      progress->finished.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t i = 0; i < helpers; ++i) {
    auto task = work;
    pool.Schedule(std::move(task));
  }
  work();
  while (progress->finished.load(std::memory_order_acquire) < chunks) cpu_relax();
}

// Rows per chunk: a multiple of 4, at least 16, about 8 chunks per thread.
int64_t chunk_rows(ffi::ThreadPool& pool, int64_t N) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t rows = (N / (8 * threads) + 3) / 4 * 4;
  return std::max<int64_t>(16, rows);
}

using Dims = ffi::Span<const int64_t>;

template <class Fmt>
ffi::Error matvec(ffi::ThreadPool& pool, const float* x, Dims xd, const typename Fmt::T* w, Dims wd,
                  const float* scale, const Dims* scale_dims, float* y) {
  if (xd.size() != 2 || wd.size() != 2) return ffi::Error::InvalidArgument("x and w must be 2-D");
  const int64_t M = xd[0], K = xd[1], N = wd[0];
  if (wd[1] != K) return ffi::Error::InvalidArgument("x [M, K] and w [N, K] disagree on K");
  if (scale_dims && (scale_dims->size() != 1 || (*scale_dims)[0] != N))
    return ffi::Error::InvalidArgument("scale must be [N]");
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

ffi::Error MatvecF32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                     ffi::Result<ffi::Buffer<ffi::F32>> y) {
  return matvec<F32>(pool, x.typed_data(), x.dimensions(), w.typed_data(), w.dimensions(), nullptr, nullptr,
                     y->typed_data());
}

template <class Fmt>
ffi::Error MatvecScaled(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> w,
                        ffi::Buffer<ffi::F32> scale, ffi::Result<ffi::Buffer<ffi::F32>> y) {
  const Dims scale_dims = scale.dimensions();
  return matvec<Fmt>(pool, x.typed_data(), x.dimensions(), w.typed_data(), w.dimensions(), scale.typed_data(),
                     &scale_dims, y->typed_data());
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxinfer_matvec_f32, MatvecF32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

#define JAXINFER_SCALED(name, fn)                                                   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, fn, ffi::Ffi::Bind()                           \
                                              .Ctx<ffi::ThreadPool>()               \
                                              .Arg<ffi::Buffer<ffi::F32>>()         \
                                              .Arg<ffi::Buffer<ffi::S8>>()          \
                                              .Arg<ffi::Buffer<ffi::F32>>()         \
                                              .Ret<ffi::Buffer<ffi::F32>>());
JAXINFER_SCALED(jaxinfer_matvec_int8, MatvecScaled<Int8>)
JAXINFER_SCALED(jaxinfer_matvec_e4m3, MatvecScaled<E4M3>)
