// Vector types, 8-bit weight formats, the thread split and the FFI handler definitions shared by the C++ CPU
// kernels (matvec.cc, gemm.cc, gemm_amx.cc, paged_attention.cc, ragged_attention.cc). Included once per translation unit; everything is in an anonymous namespace.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <type_traits>

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

// How each stored format turns kLanes elements into kLanes floats (load) or one into a float (one).
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

struct BF16 {  // bfloat16 bit patterns: the upper half of a float32
  using T = uint16_t;
  static f32v load(const uint16_t* p) {
#if defined(__AVX512F__)
    const i32v b = (i32v)_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__AVX2__)
    const i32v b = (i32v)_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    typedef uint16_t u16v __attribute__((vector_size(2 * kLanes), aligned(2)));
    const i32v b = __builtin_convertvector(*reinterpret_cast<const u16v*>(p), i32v);
#endif
    const i32v bits = b << 16;
    f32v v;
    __builtin_memcpy(&v, &bits, sizeof v);
    return v;
  }
  static float one(uint16_t v) {
    const uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }
};

// The D floats of one cached row: the row itself (float32) or its decoded copy in buf (8-bit formats).
template <class Fmt>
inline const float* as_floats(const typename Fmt::T* row, int64_t D, float* buf) {
  if constexpr (std::is_same_v<Fmt, F32>) {
    return row;
  } else {
    const int64_t d_vec = D / kLanes * kLanes;
    for (int64_t d = 0; d < d_vec; d += kLanes) *reinterpret_cast<f32v*>(buf + d) = Fmt::load(row + d);
    for (int64_t d = d_vec; d < D; ++d) buf[d] = Fmt::one(row[d]);
    return buf;
  }
}

// Position t of a sequence (block table `table`) for KV head h in a paged cache [num_blocks, BS, Hkv, D], as
// floats (as_floats); a block id outside the cache is clamped, as XLA's gather clamps it.
template <class Fmt>
inline const float* cached_floats(const typename Fmt::T* cache, const int32_t* table, int64_t num_blocks, int64_t BS,
                                  int64_t Hkv, int64_t D, int64_t h, int64_t t, float* buf) {
  const int64_t block = std::min(std::max<int64_t>(table[t / BS], 0), num_blocks - 1);
  return as_floats<Fmt>(cache + ((block * BS + t % BS) * Hkv + h) * D, D, buf);
}

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

using Dims = ffi::Span<const int64_t>;

// Why x [M, K], w [N, K] and scale [N] (or no scale) do not make a product, or nullptr if they do.
inline const char* product_shape_error(Dims xd, Dims wd, const Dims* scale_dims) {
  if (xd.size() != 2 || wd.size() != 2) return "x and w must be 2-D";
  if (wd[1] != xd[1]) return "x [M, K] and w [N, K] disagree on K";
  if (scale_dims && (scale_dims->size() != 1 || (*scale_dims)[0] != wd[0])) return "scale must be [N]";
  return nullptr;
}

// The FFI handlers of a matrix product F(pool, x, x dims, w, w dims, scale or null, scale dims or null, y):
// a float32 weight without scales, or an int8-typed one (int8, or e4m3 bytes) with a float32 scale per row.
template <ffi::Error (*F)(ffi::ThreadPool&, const float*, Dims, const float*, Dims, const float*, const Dims*,
                          float*)>
ffi::Error UnscaledProduct(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                           ffi::Result<ffi::Buffer<ffi::F32>> y) {
  return F(pool, x.typed_data(), x.dimensions(), w.typed_data(), w.dimensions(), nullptr, nullptr, y->typed_data());
}

template <ffi::Error (*F)(ffi::ThreadPool&, const float*, Dims, const int8_t*, Dims, const float*, const Dims*,
                          float*)>
ffi::Error ScaledProduct(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> w,
                         ffi::Buffer<ffi::F32> scale, ffi::Result<ffi::Buffer<ffi::F32>> y) {
  const Dims scale_dims = scale.dimensions();
  return F(pool, x.typed_data(), x.dimensions(), w.typed_data(), w.dimensions(), scale.typed_data(), &scale_dims,
           y->typed_data());
}

}  // namespace

// Defines the handler `name` of a product F(pool, x, w int8-typed, scale, y) (at global scope).
#define JAXINFER_SCALED_PRODUCT_HANDLER(name, F)                                                           \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, ScaledProduct<F>,                                                    \
                                ffi::Ffi::Bind()                                                           \
                                    .Ctx<ffi::ThreadPool>()                                                \
                                    .Arg<ffi::Buffer<ffi::F32>>()                                          \
                                    .Arg<ffi::Buffer<ffi::S8>>()                                           \
                                    .Arg<ffi::Buffer<ffi::F32>>()                                          \
                                    .Ret<ffi::Buffer<ffi::F32>>())

// Defines <prefix>_f32, <prefix>_int8 and <prefix>_e4m3 for a product template fn<Fmt> (at global scope).
#define JAXINFER_PRODUCT_HANDLERS(prefix, fn)                                                              \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(prefix##_f32, UnscaledProduct<fn<F32>>,                                    \
                                ffi::Ffi::Bind()                                                           \
                                    .Ctx<ffi::ThreadPool>()                                                \
                                    .Arg<ffi::Buffer<ffi::F32>>()                                          \
                                    .Arg<ffi::Buffer<ffi::F32>>()                                          \
                                    .Ret<ffi::Buffer<ffi::F32>>());                                        \
  JAXINFER_SCALED_PRODUCT_HANDLER(prefix##_int8, fn<Int8>);                                                \
  JAXINFER_SCALED_PRODUCT_HANDLER(prefix##_e4m3, fn<E4M3>)

// Defines the handler `name` of an attention kernel F(pool, q, k cache, v cache, block tables, two int32 arrays of
// lengths, out; attributes sm_scale, sliding_window), caches of ffi::DataType `dtype` (at global scope).
#define JAXINFER_ATTENTION_HANDLER(name, F, dtype)                                                         \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, F,                                                                   \
                                ffi::Ffi::Bind()                                                           \
                                    .Ctx<ffi::ThreadPool>()                                                \
                                    .Arg<ffi::Buffer<ffi::F32>>()                                          \
                                    .Arg<ffi::Buffer<dtype>>()                                             \
                                    .Arg<ffi::Buffer<dtype>>()                                             \
                                    .Arg<ffi::Buffer<ffi::S32>>()                                          \
                                    .Arg<ffi::Buffer<ffi::S32>>()                                          \
                                    .Arg<ffi::Buffer<ffi::S32>>()                                          \
                                    .Ret<ffi::Buffer<ffi::F32>>()                                          \
                                    .Attr<float>("sm_scale")                                               \
                                    .Attr<int64_t>("sliding_window"))
