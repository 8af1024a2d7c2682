// Paged attention of short query runs for XLA:CPU (decode: one query per sequence; speculative
// verification: 1 + k), called through jax.ffi (see jaxinfer/cpu/ffi/__init__.py).
//
//   jaxinfer_paged_attention_f32    float32 K/V caches
//   jaxinfer_paged_attention_e4m3   e4m3 bit patterns typed int8 (kv_cache_dtype="fp8" on the CPU)
//
// q [S, W, Hq, D] float32: sequence slot s's queries, query j at position kv_lens[s] - q_lens[s] + j for
// j < q_lens[s] (the rest are padding); caches [num_blocks, BS, Hkv, D]; block_tables [S, MB] int32; q_lens,
// kv_lens [S] int32; attributes sm_scale (f32) and sliding_window (i64, 0: none). out [S, W, Hq, D] float32:
// each query's softmax(q . k * sm_scale) . v over the keys it sees (causal, inside the window); a query that
// sees no key (padding, or a position below 0) gets zeros.
//
// One task per (sequence, KV head): its keys are read once, straight from their blocks through the table
// (no gathered copy), for all W x group query rows that share them; one float32 score per (row, key) goes to
// a scratch buffer, then an exact softmax per row, then the probability-weighted sum of V. Only the keys
// between the first any row sees and the last are read. Tasks are split over the caller and XLA's threads.
#include <cmath>
#include <limits>
#include <vector>

#include "kernel_common.h"

namespace {

struct Shapes {
  int64_t S, W, Hq, D, num_blocks, BS, Hkv, MB, group;
};

inline float dot(const float* a, const float* b, int64_t D) {
  const int64_t d_vec = D / kLanes * kLanes;
  f32v acc{};
  for (int64_t d = 0; d < d_vec; d += kLanes)
    acc += *reinterpret_cast<const f32v*>(a + d) * *reinterpret_cast<const f32v*>(b + d);
  float s = lane_sum(acc);
  for (int64_t d = d_vec; d < D; ++d) s += a[d] * b[d];
  return s;
}

inline void add_scaled(float* acc, float p, const float* b, int64_t D) {  // acc += p * b
  const int64_t d_vec = D / kLanes * kLanes;
  for (int64_t d = 0; d < d_vec; d += kLanes)
    *reinterpret_cast<f32v*>(acc + d) += p * *reinterpret_cast<const f32v*>(b + d);
  for (int64_t d = d_vec; d < D; ++d) acc[d] += p * b[d];
}

// Query rows r = j * group + g of (sequence s, KV head h): query j of the sequence, query head h * group + g.
template <class Fmt>
void attend(const Shapes& sh, int64_t s, int64_t h, const float* q, const typename Fmt::T* k_cache,
            const typename Fmt::T* v_cache, const int32_t* tables, int32_t q_len, int32_t kv_len, float sm_scale,
            int64_t window, float* out) {
  const int64_t rows = sh.W * sh.group, D = sh.D;
  auto offset = [&](int64_t r) { return ((s * sh.W + r / sh.group) * sh.Hq + h * sh.group + r % sh.group) * D; };
  std::vector<int64_t> pos(rows);
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = -1;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t j = r / sh.group;
    pos[r] = j < q_len ? static_cast<int64_t>(kv_len) - q_len + j : -1;
    if (pos[r] < 0) continue;
    lo = std::min(lo, window > 0 ? std::max<int64_t>(0, pos[r] - window + 1) : 0);
    hi = std::max(hi, pos[r]);
  }
  hi = std::min(hi, sh.MB * sh.BS - 1);  // no key past the table's width
  for (int64_t r = 0; r < rows; ++r) std::fill_n(out + offset(r), D, 0.0f);
  if (hi < lo) return;
  const int64_t n = hi - lo + 1;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(rows * n), buf(D);
  auto cached_row = [&](const typename Fmt::T* cache, int64_t t) {
    return cached_floats<Fmt>(cache, tables + s * sh.MB, sh.num_blocks, sh.BS, sh.Hkv, D, h, t, buf.data());
  };
  for (int64_t t = lo; t <= hi; ++t) {
    const float* key = cached_row(k_cache, t);
    for (int64_t r = 0; r < rows; ++r) {
      const bool sees = t <= pos[r] && (window <= 0 || t > pos[r] - window);
      scores[r * n + t - lo] = sees ? dot(q + offset(r), key, D) * sm_scale : neg_inf;
    }
  }
  std::vector<float> denom(rows, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    if (pos[r] < 0) continue;
    float* row = scores.data() + r * n;
    const float top = *std::max_element(row, row + n);
    for (int64_t i = 0; i < n; ++i) {
      row[i] = row[i] == neg_inf ? 0.0f : std::exp(row[i] - top);
      denom[r] += row[i];
    }
  }
  for (int64_t t = lo; t <= hi; ++t) {
    const float* value = cached_row(v_cache, t);
    for (int64_t r = 0; r < rows; ++r) {
      const float p = scores[r * n + t - lo];
      if (pos[r] >= 0 && p != 0.0f) add_scaled(out + offset(r), p, value, D);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (denom[r] <= 0.0f) continue;
    const float inv = 1.0f / denom[r];
    float* o = out + offset(r);
    for (int64_t d = 0; d < D; ++d) o[d] *= inv;
  }
}

template <class Fmt, ffi::DataType DT>
ffi::Error PagedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<DT> k, ffi::Buffer<DT> v,
                          ffi::Buffer<ffi::S32> tables, ffi::Buffer<ffi::S32> q_lens, ffi::Buffer<ffi::S32> kv_lens,
                          ffi::Result<ffi::Buffer<ffi::F32>> out, float sm_scale, int64_t sliding_window) {
  const auto qd = q.dimensions(), kd = k.dimensions(), td = tables.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || td.size() != 2)
    return ffi::Error::InvalidArgument("want q [S, W, Hq, D], caches [N, BS, Hkv, D], block_tables [S, MB]");
  const Shapes sh{qd[0], qd[1], qd[2], qd[3], kd[0], kd[1], kd[2], td[1], kd[2] > 0 ? qd[2] / kd[2] : 0};
  const auto vd = v.dimensions();
  if (vd.size() != 4 || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2] || vd[3] != kd[3])
    return ffi::Error::InvalidArgument("the K and V caches differ in shape");
  if (kd[3] != sh.D || sh.Hkv <= 0 || sh.Hq % sh.Hkv != 0 || sh.num_blocks <= 0 || sh.BS <= 0)
    return ffi::Error::InvalidArgument("q and the caches disagree on heads or head size");
  const int64_t num_q_lens = q_lens.element_count(), num_kv_lens = kv_lens.element_count();
  if (td[0] != sh.S || num_q_lens != sh.S || num_kv_lens != sh.S)
    return ffi::Error::InvalidArgument("block_tables, q_lens and kv_lens must have one row per sequence of q");
  const float* qp = q.typed_data();
  const auto* kp = reinterpret_cast<const typename Fmt::T*>(k.typed_data());
  const auto* vp = reinterpret_cast<const typename Fmt::T*>(v.typed_data());
  const int32_t *tp = tables.typed_data(), *ql = q_lens.typed_data(), *kl = kv_lens.typed_data();
  float* op = out->typed_data();
  const int64_t tasks = sh.S * sh.Hkv;
  const int64_t per_chunk = std::max<int64_t>(1, tasks / (4 * std::max<int64_t>(1, pool.num_threads())));
  parallel_rows(pool, tasks, per_chunk, [=](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t s = task / sh.Hkv, h = task % sh.Hkv;
      attend<Fmt>(sh, s, h, qp, kp, vp, tp, ql[s], kl[s], sm_scale, sliding_window, op);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

JAXINFER_ATTENTION_HANDLER(jaxinfer_paged_attention_f32, (PagedAttention<F32, ffi::F32>), ffi::F32);
JAXINFER_ATTENTION_HANDLER(jaxinfer_paged_attention_e4m3, (PagedAttention<E4M3, ffi::S8>), ffi::S8);
