// Prefill-sized products of 8-bit weights on Intel AMX tiles (Sapphire Rapids and later), called through
// jax.ffi (see jaxinfer/cpu/ffi/__init__.py). Same contract as gemm.cc for its 8-bit kinds:
//
//   jaxinfer_gemm_amx_int8   y[M, N] = (x[M, K] . w[N, K]^T) * scale[N]           (w int8)
//   jaxinfer_gemm_amx_e4m3   y[M, N] = (x . decode(w)^T) * scale[N]               (w: e4m3 bit patterns typed int8)
//   jaxinfer_amx_available() 1 if this CPU and OS let the process use AMX tiles (plain C, for ctypes)
//
// AMX multiplies bfloat16 tiles into float32 accumulators at ~2.5 TFLOP/s per core here (AVX-512 float32 FMAs:
// ~0.16). An 8-bit weight value (an integer up to 127, or e4m3 with 3 mantissa bits) is exactly a bfloat16; a
// float32 activation is not, so each activation is split into three bfloat16 terms, x = hi + mid + lo, exactly
// (each term takes the next 8 significant bits of what is left), and the product is summed over the three:
// every partial product is exact in float32 and accumulation is float32, so the result is the float32 product
// up to the order of additions (like the other kernels), at three times the tile work.
//
// Layout: the split activations are three row-major planes [Mp, Kp + pad] of bfloat16 (A tiles: 16 rows x 32 k,
// read in place). Each thread packs its share of weight columns once per call into B tiles (16 pairs of k x 16
// columns, "VNNI" pairs of k per 32-bit lane), decoding the bytes on the way, then walks panels of kPanel
// activation rows (their three planes stay in L2) x its column blocks, each a 2 x 2 block of 16 x 16 float32
// accumulator tiles. Rows and k past the ends are zero in the packed operands; only valid outputs are stored.
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "kernel_common.h"

#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define JAXINFER_HAVE_AMX 1
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#include <immintrin.h>
#else
#define JAXINFER_HAVE_AMX 0
#endif

namespace {

#if JAXINFER_HAVE_AMX

constexpr int64_t kTileK = 32;    // bfloat16 values of k per A tile row (64 bytes)
constexpr int64_t kBlock = 32;    // rows (activations) and columns (weights) per 2 x 2 block of tiles
constexpr int64_t kPanel = 128;   // activation rows per pass over a thread's packed weight columns
constexpr int64_t kPlaneSplits = 3;
constexpr int64_t kPackedTile = kTileK * 16;  // bfloat16 values in one packed 16-column B tile

bool cpu_has_amx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512 = (b >> 16 & 1) && (b >> 30 & 1) && (b >> 31 & 1);  // F, BW, VL
  const bool tiles = (d >> 24 & 1) && (d >> 22 & 1);                    // AMX-TILE, AMX-BF16
  if (!avx512 || !tiles || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return a >> 5 & 1;  // AVX512-BF16
}

bool amx_ready() {
  static const bool ready = [] {
    constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return cpu_has_amx() && syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return ready;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: float32 accumulators [16, 16]; 4-5: activation rows [16, 32 bf16]; 6-7: packed weights.
AMX_TARGET void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = 64, config.rows[t] = 16;
  _tile_loadconfig(&config);
}

AMX_TARGET inline __m512i bf16_bits(__m512 v) {  // bfloat16 of v (round to nearest even) in each low half
  return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v));
}

AMX_TARGET inline __m512 bf16_value(__m512i bits) { return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)); }

// Rows [m0, m1) of x [M, K] -> planes[s] [Mp, stride] bfloat16 with x = sum of the three terms; rows >= M and
// columns >= K zero.
AMX_TARGET void split_rows(const float* x, uint16_t* planes, int64_t M, int64_t K, int64_t Mp, int64_t stride,
                           int64_t m0, int64_t m1) {
  for (int64_t m = m0; m < m1; ++m) {
    uint16_t* out[kPlaneSplits];
    for (int64_t s = 0; s < kPlaneSplits; ++s) {
      out[s] = planes + (s * Mp + m) * stride;
      std::memset(out[s], 0, sizeof(uint16_t) * stride);
    }
    if (m >= M) continue;
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 lanes = K - k >= 16 ? 0xFFFF : (__mmask16)((1u << (K - k)) - 1);
      __m512 rest = _mm512_maskz_loadu_ps(lanes, x + m * K + k);
      for (int64_t s = 0; s < kPlaneSplits; ++s) {
        const __m512i bits = bf16_bits(rest);
        rest = _mm512_sub_ps(rest, bf16_value(bits));
        _mm256_mask_storeu_epi16(out[s] + k, lanes, _mm512_cvtepi32_epi16(bits));
      }
    }
  }
}

// Bytes of w as float32: signed bytes (sign-extended into int32 lanes) -> values.
struct AmxInt8 {
  AMX_TARGET static __m512 decode(__m512i b) { return _mm512_cvtepi32_ps(b); }
  static float one(int8_t b) { return static_cast<float>(b); }
};
struct AmxE4M3 {
  AMX_TARGET static __m512 decode(__m512i b) {
    const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7F));
    const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
    const __m512 subnormal = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(1.0f / 512.0f));
    const __mmask16 small = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
    const __m512i value = _mm512_mask_blend_epi32(small, normal, _mm512_castps_si512(subnormal));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
    return _mm512_castsi512_ps(_mm512_or_si512(value, sign));
  }
  static float one(int8_t b) { return e4m3_to_float(b); }
};

inline uint16_t exact_bf16(float v) {  // v has at most 8 significant bits: truncation is exact
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return static_cast<uint16_t>(bits >> 16);
}

// r[j] (16 lanes of 32 bits) -> r[p] holding lane p of every r[j]: a 16 x 16 transpose of 32-bit lanes.
AMX_TARGET void transpose_lanes(__m512i (&r)[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {  // pairs of rows interleaved within each 128-bit lane
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // b[4i + q], 128-bit lane L: column 4L + q of rows 4i .. 4i + 3
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int q = 0; q < 4; ++q) {  // gather lane L of the four row groups into column 4L + q
    const __m512i even01 = _mm512_shuffle_i32x4(b[q], b[4 + q], 0x88), odd01 = _mm512_shuffle_i32x4(b[q], b[4 + q], 0xDD);
    const __m512i even23 = _mm512_shuffle_i32x4(b[8 + q], b[12 + q], 0x88);
    const __m512i odd23 = _mm512_shuffle_i32x4(b[8 + q], b[12 + q], 0xDD);
    r[q] = _mm512_shuffle_i32x4(even01, even23, 0x88);
    r[8 + q] = _mm512_shuffle_i32x4(even01, even23, 0xDD);
    r[4 + q] = _mm512_shuffle_i32x4(odd01, odd23, 0x88);
    r[12 + q] = _mm512_shuffle_i32x4(odd01, odd23, 0xDD);
  }
}

// Columns [n0, n0 + 16) of w [N, K] -> packed [Kp / 32][16 pairs of k][16 columns][2]: B tiles, one per 32 k.
// Whole tiles load each column's 32 bytes, decode them to bfloat16 pairs (one 32-bit lane per pair of k) and
// transpose; tiles cut by the ends of N or K are packed one value at a time, zero outside.
template <class Fmt>
AMX_TARGET void pack_columns(const int8_t* w, uint16_t* packed, int64_t N, int64_t K, int64_t Kp, int64_t n0) {
  for (int64_t k0 = 0; k0 < Kp; k0 += kTileK) {
    uint16_t* tile = packed + (k0 / kTileK) * kPackedTile;
    if (n0 + 16 <= N && k0 + kTileK <= K) {
      __m512i r[16];
      for (int64_t c = 0; c < 16; ++c) {
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (n0 + c) * K + k0));
        const __m512 first = Fmt::decode(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(bytes)));
        const __m512 second = Fmt::decode(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(bytes, 1)));
        r[c] = (__m512i)_mm512_cvtne2ps_pbh(second, first);  // exact: 8-bit values fit bfloat16
      }
      transpose_lanes(r);
      for (int64_t p = 0; p < 16; ++p) _mm512_storeu_si512(tile + p * 32, r[p]);
      continue;
    }
    for (int64_t p = 0; p < kTileK / 2; ++p)
      for (int64_t c = 0; c < 16; ++c)
        for (int64_t e = 0; e < 2; ++e) {
          const int64_t k = k0 + 2 * p + e;
          tile[p * 32 + 2 * c + e] = n0 + c < N && k < K ? exact_bf16(Fmt::one(w[(n0 + c) * K + k])) : 0;
        }
  }
}

// y[m0 .. m0 + 32, n0 .. n0 + 32) from the accumulator tiles, times the columns' scales; valid entries only.
AMX_TARGET void store_block(const float* scale, float* y, int64_t M, int64_t N, int64_t m0, int64_t n0) {
  alignas(64) float block[kBlock * kBlock];
  _tile_stored(0, block, kBlock * 4);
  _tile_stored(1, block + 16, kBlock * 4);
  _tile_stored(2, block + 16 * kBlock, kBlock * 4);
  _tile_stored(3, block + 16 * kBlock + 16, kBlock * 4);
  const int64_t rows = std::min(kBlock, M - m0), cols = std::min(kBlock, N - n0);
  for (int64_t half = 0; half < 2 && half * 16 < cols; ++half) {
    const int64_t c = std::min<int64_t>(16, cols - half * 16);
    const __mmask16 lanes = c == 16 ? 0xFFFF : (__mmask16)((1u << c) - 1);
    const __m512 s = _mm512_maskz_loadu_ps(lanes, scale + n0 + half * 16);
    for (int64_t r = 0; r < rows; ++r)
      _mm512_mask_storeu_ps(y + (m0 + r) * N + n0 + half * 16, lanes,
                            _mm512_mul_ps(_mm512_load_ps(block + r * kBlock + half * 16), s));
  }
}

// Column blocks [b0, b1) (kBlock columns each) of y for every activation row.
template <class Fmt>
AMX_TARGET void gemm_columns(const uint16_t* planes, const int8_t* w, const float* scale, float* y, int64_t M,
                             int64_t K, int64_t N, int64_t Mp, int64_t Kp, int64_t stride, int64_t b0, int64_t b1) {
  const int64_t per_column_tile = (Kp / kTileK) * kPackedTile;
  std::unique_ptr<uint16_t[]> packed(new uint16_t[std::max<int64_t>(1, (b1 - b0) * 2 * per_column_tile)]);
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t h = 0; h < 2; ++h)
      pack_columns<Fmt>(w, packed.get() + ((b - b0) * 2 + h) * per_column_tile, N, K, Kp, b * kBlock + h * 16);
  configure_tiles();
  const int64_t row_bytes = stride * sizeof(uint16_t);
  for (int64_t p0 = 0; p0 < Mp; p0 += kPanel) {
    for (int64_t b = b0; b < b1; ++b) {
      const uint16_t* left = packed.get() + (b - b0) * 2 * per_column_tile;
      const uint16_t* right = left + per_column_tile;
      for (int64_t m0 = p0; m0 < std::min(Mp, p0 + kPanel); m0 += kBlock) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t k0 = 0; k0 < Kp; k0 += kTileK) {
          _tile_loadd(6, left + (k0 / kTileK) * kPackedTile, 64);
          _tile_loadd(7, right + (k0 / kTileK) * kPackedTile, 64);
          for (int64_t s = 0; s < kPlaneSplits; ++s) {
            const uint16_t* a = planes + (s * Mp + m0) * stride + k0;
            _tile_loadd(4, a, row_bytes);
            _tile_loadd(5, a + 16 * stride, row_bytes);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        if (m0 < M) store_block(scale, y, M, N, m0, b * kBlock);
      }
    }
  }
  _tile_release();
}

template <class Fmt>
ffi::Error gemm_amx(ffi::ThreadPool& pool, const float* x, Dims xd, const int8_t* w, Dims wd, const float* scale,
                    const Dims* scale_dims, float* y) {
  if (const char* bad = product_shape_error(xd, wd, scale_dims)) return ffi::Error::InvalidArgument(bad);
  if (!amx_ready()) return ffi::Error(ffi::ErrorCode::kUnimplemented, "AMX tiles are not usable on this CPU");
  const int64_t M = xd[0], K = xd[1], N = wd[0];
  if (M == 0 || N == 0) return ffi::Error::Success();
  const int64_t Mp = (M + kBlock - 1) / kBlock * kBlock, Kp = (K + kTileK - 1) / kTileK * kTileK;
  const int64_t stride = Kp + kTileK;  // a row stride off a multiple of 4 KiB keeps a tile's rows in distinct L1 sets
  std::unique_ptr<uint16_t[]> planes(new uint16_t[kPlaneSplits * Mp * stride]);  // split_rows writes every entry
  uint16_t* planes_p = planes.get();
  parallel_rows(pool, Mp, 16, [=](int64_t m0, int64_t m1) { split_rows(x, planes_p, M, K, Mp, stride, m0, m1); });
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  parallel_rows(pool, blocks, (blocks + threads - 1) / threads, [=](int64_t b0, int64_t b1) {
    gemm_columns<Fmt>(planes_p, w, scale, y, M, K, N, Mp, Kp, stride, b0, b1);
  });
  return ffi::Error::Success();
}

#else  // no AMX intrinsics in this compiler

bool amx_ready() { return false; }

template <class Fmt>
ffi::Error gemm_amx(ffi::ThreadPool&, const float*, Dims, const int8_t*, Dims, const float*, const Dims*, float*) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented, "built without AMX support");
}
struct AmxInt8 {};
struct AmxE4M3 {};

#endif

}  // namespace

extern "C" int jaxinfer_amx_available() { return amx_ready() ? 1 : 0; }

JAXINFER_SCALED_PRODUCT_HANDLER(jaxinfer_gemm_amx_int8, gemm_amx<AmxInt8>);
JAXINFER_SCALED_PRODUCT_HANDLER(jaxinfer_gemm_amx_e4m3, gemm_amx<AmxE4M3>);
