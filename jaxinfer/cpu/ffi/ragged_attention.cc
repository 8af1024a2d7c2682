// Ragged paged attention of whole steps for XLA:CPU (the engine sends it the prompts and prefill chunks),
// called through jax.ffi (see jaxinfer/cpu/ffi/__init__.py).
//
//   jaxinfer_ragged_attention_f32    float32 K/V caches
//   jaxinfer_ragged_attention_e4m3   e4m3 bit patterns typed int8 (kv_cache_dtype="fp8" on the CPU)
//
// q [T, Hq, D] float32, the step's tokens: sequence s owns tokens cu_q_lens[s] .. cu_q_lens[s + 1], its query j
// at position kv_lens[s] - q_len + j; caches [num_blocks, BS, Hkv, D]; block_tables [S, MB] int32; cu_q_lens
// [S + 1], kv_lens [S] int32; attributes sm_scale (f32) and sliding_window (i64, 0: none). out [T, Hq, D]
// float32: each query's softmax(q . k * sm_scale) . v over the keys it sees (causal, inside the window); zeros
// for tokens past cu_q_lens[S] and for a query that sees no key. The semantics of jaxinfer.model.attention's loops.
//
// Flash attention on the CPU: one task per (sequence, KV head, block of up to kQueries queries), whose query
// rows (queries x heads sharing the KV head, at most kMaxRows) share every key and value read. The task's
// queries are transposed once into [D, rows]; keys are visited in chunks of kKeys, read in place through the
// block table (decoded from e4m3 into a buffer if need be). Per vector of rows the chunk's scores are kKeys
// vectors (per d: one load of the transposed queries and a fused multiply-add per key with its broadcast
// value), then an online softmax, vectorized over rows (a polynomial exp), folds the chunk into each row's
// running maximum, denominator and weighted sum of V (held in registers over the chunk). Only the key chunks
// between the first key the block's first query may see and its last query's position are visited. Tasks are
// split over the caller and XLA's threads.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernel_common.h"

namespace {

constexpr int64_t kQueries = 32;   // queries per task, unless their rows (x group) pass kMaxRows
constexpr int64_t kMaxRows = 256;  // query rows per task
constexpr int64_t kKeys = 16;     // keys per chunk

struct Geometry {
  int64_t T, Hq, D, num_blocks, BS, Hkv, S, MB, group;
  int64_t queries_per_task() const { return std::max<int64_t>(1, std::min(kQueries, kMaxRows / group)); }
};

// e^x per lane (|relative error| < 2e-7); lanes below -87 give 0 (masked scores are -inf).
inline f32v exp_lanes(f32v x) {
  const f32v clamped = x < -87.0f ? f32v{} - 87.0f : (x > 88.0f ? f32v{} + 88.0f : x);
  const f32v t = clamped * 1.44269504088896341f;
  const i32v n = __builtin_convertvector(t + (t >= 0.0f ? f32v{} + 0.5f : f32v{} - 0.5f), i32v);
  const f32v nf = __builtin_convertvector(n, f32v);
  const f32v r = clamped - nf * 0.693145751953125f - nf * 1.428606765330187e-06f;  // ln 2 in two parts
  f32v p = f32v{} + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const i32v bits = (n + 127) << 23;
  f32v two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const f32v e = p * two_n;
  return x < -87.0f ? f32v{} : e;
}

struct Scratch {  // per thread, reused across tasks
  int64_t padded_rows;
  std::vector<float> qt, acc, keys, values, zeros;
  explicit Scratch(const Geometry& g)
      : padded_rows((g.queries_per_task() * g.group + kLanes - 1) / kLanes * kLanes), qt(g.D * padded_rows),
        acc(padded_rows * g.D), keys(kKeys * g.D), values(kKeys * g.D), zeros(g.D) {}
};

// acc[0, D) = acc * rescale + sum_k p[k * kLanes] * v[k][0, D), over nk keys; DV = D / kLanes vectors held in
// registers (0: any D, through memory).
template <int DV>
inline void fold_values(float* acc, float rescale, const float* p, const float* const* v, int64_t nk, int64_t D) {
  if constexpr (DV > 0) {
    f32v a[DV];
    for (int i = 0; i < DV; ++i) a[i] = *reinterpret_cast<const f32v*>(acc + i * kLanes) * rescale;
    for (int64_t k = 0; k < nk; ++k) {
      const float pk = p[k * kLanes];
      for (int i = 0; i < DV; ++i) a[i] += pk * *reinterpret_cast<const f32v*>(v[k] + i * kLanes);
    }
    for (int i = 0; i < DV; ++i) *reinterpret_cast<f32v*>(acc + i * kLanes) = a[i];
  } else {
    for (int64_t d = 0; d < D; ++d) acc[d] *= rescale;
    for (int64_t k = 0; k < nk; ++k)
      for (int64_t d = 0; d < D; ++d) acc[d] += p[k * kLanes] * v[k][d];
  }
}

// Queries [offset, offset + n) of sequence s against KV head h: rows r = j * group + i (query j, query head
// h * group + i), kLanes rows per vector. Scores are computed key by key as vectors over rows (the transposed
// queries are built once per task; keys and values are read in place), so the online softmax is vectorized
// over rows too.
template <class Fmt, int DV>
void attend_block(const Geometry& g, int64_t s, int64_t h, int64_t offset, int64_t n, const float* q,
                  const typename Fmt::T* k_cache, const typename Fmt::T* v_cache, const int32_t* tables,
                  int64_t q_start, int64_t q_len, int64_t kv_len, float sm_scale, int64_t window, float* out,
                  Scratch& w) {
  const int64_t D = g.D, rows = n * g.group, RP = w.padded_rows, vecs = (rows + kLanes - 1) / kLanes;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto token_row = [&](int64_t r) { return ((q_start + offset + r / g.group) * g.Hq + h * g.group + r % g.group) * D; };
  const int64_t first_pos = kv_len - q_len + offset, last_pos = first_pos + n - 1;
  for (int64_t r = 0; r < vecs * kLanes; ++r) {
    const float* src = r < rows ? q + token_row(r) : nullptr;
    for (int64_t d = 0; d < D; ++d) w.qt[d * RP + r] = src ? src[d] * sm_scale : 0.0f;
  }
  std::fill_n(w.acc.data(), rows * D, 0.0f);
  constexpr int kMaxVecs = kMaxRows / kLanes;
  f32v run_max[kMaxVecs], denom[kMaxVecs];
  i32v pos[kMaxVecs];
  for (int64_t v = 0; v < vecs; ++v) {
    run_max[v] = f32v{} + neg_inf;
    denom[v] = f32v{};
    for (int i = 0; i < kLanes; ++i) {
      const int64_t r = v * kLanes + i;
      pos[v][i] = r < rows ? static_cast<int32_t>(first_pos + r / g.group) : -1;
    }
  }
  const int64_t lo = window > 0 ? std::max<int64_t>(0, first_pos - window + 1) : 0;
  const int64_t hi = std::min(last_pos, g.MB * g.BS - 1);  // no key past the table's width
  const int32_t* table = tables + s * g.MB;
  const float* key_rows[kKeys];
  const float* value_rows[kKeys];
  alignas(64) float p[kKeys * kLanes];
  alignas(64) float rescale_lanes[kLanes];
  for (int64_t c0 = lo; c0 <= hi; c0 += kKeys) {
    const int64_t nk = std::min(kKeys, hi - c0 + 1);
    for (int64_t k = 0; k < kKeys; ++k) {
      key_rows[k] = k < nk ? cached_floats<Fmt>(k_cache, table, g.num_blocks, g.BS, g.Hkv, D, h, c0 + k, w.keys.data() + k * D) : w.zeros.data();
      value_rows[k] = k < nk ? cached_floats<Fmt>(v_cache, table, g.num_blocks, g.BS, g.Hkv, D, h, c0 + k, w.values.data() + k * D) : w.zeros.data();
    }
    for (int64_t v = 0; v < vecs; ++v) {
      f32v sc[kKeys];
      for (int64_t k = 0; k < kKeys; ++k) sc[k] = f32v{};
      const float* qt = w.qt.data() + v * kLanes;
      for (int64_t d = 0; d < D; ++d) {
        const f32v qd = *reinterpret_cast<const f32v*>(qt + d * RP);
        for (int64_t k = 0; k < kKeys; ++k) sc[k] += key_rows[k][d] * qd;
      }
      f32v chunk_max = f32v{} + neg_inf;
      for (int64_t k = 0; k < nk; ++k) {
        const int32_t t = static_cast<int32_t>(c0 + k);
        i32v sees = t <= pos[v];
        if (window > 0) sees &= (pos[v] - static_cast<int32_t>(window)) < t;
        sc[k] = sees ? sc[k] : f32v{} + neg_inf;
        chunk_max = chunk_max > sc[k] ? chunk_max : sc[k];
      }
      const f32v new_max = run_max[v] > chunk_max ? run_max[v] : chunk_max;
      const i32v none = new_max == neg_inf;  // rows that have seen no key yet: nothing to fold
      const f32v safe_max = none ? f32v{} : new_max;
      const f32v rescale = run_max[v] == neg_inf ? f32v{} : exp_lanes(run_max[v] - safe_max);
      f32v total{};
      for (int64_t k = 0; k < nk; ++k) {
        const f32v e = sc[k] == neg_inf ? f32v{} : exp_lanes(sc[k] - safe_max);
        total += e;
        *reinterpret_cast<f32v*>(p + k * kLanes) = e;
      }
      denom[v] = denom[v] * rescale + total;
      run_max[v] = new_max;
      *reinterpret_cast<f32v*>(rescale_lanes) = none ? f32v{} + 1.0f : rescale;
      for (int i = 0; i < kLanes && v * kLanes + i < rows; ++i)
        fold_values<DV>(w.acc.data() + (v * kLanes + i) * D, rescale_lanes[i], p + i, value_rows, nk, D);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out + token_row(r);
    const float total = denom[r / kLanes][r % kLanes];
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int64_t d = 0; d < D; ++d) dst[d] = w.acc[r * D + d] * inv;
  }
}

template <class Fmt, ffi::DataType DT>
ffi::Error RaggedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<DT> k, ffi::Buffer<DT> v,
                           ffi::Buffer<ffi::S32> tables, ffi::Buffer<ffi::S32> cu_q_lens, ffi::Buffer<ffi::S32> kv_lens,
                           ffi::Result<ffi::Buffer<ffi::F32>> out, float sm_scale, int64_t sliding_window) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), td = tables.dimensions();
  if (qd.size() != 3 || kd.size() != 4 || td.size() != 2)
    return ffi::Error::InvalidArgument("want q [T, Hq, D], caches [N, BS, Hkv, D], block_tables [S, MB]");
  if (vd.size() != 4 || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2] || vd[3] != kd[3])
    return ffi::Error::InvalidArgument("the K and V caches differ in shape");
  const Geometry g{qd[0], qd[1], qd[2], kd[0], kd[1], kd[2], td[0], td[1], kd[2] > 0 ? qd[1] / kd[2] : 0};
  if (kd[3] != g.D || g.Hkv <= 0 || g.Hq % g.Hkv != 0 || g.num_blocks <= 0 || g.BS <= 0)
    return ffi::Error::InvalidArgument("q and the caches disagree on heads or head size");
  if (g.group > kMaxRows) return ffi::Error::InvalidArgument("more than 256 query heads per KV head");
  if (static_cast<int64_t>(cu_q_lens.element_count()) != g.S + 1 || static_cast<int64_t>(kv_lens.element_count()) != g.S)
    return ffi::Error::InvalidArgument("cu_q_lens must be [S + 1] and kv_lens [S] for block_tables [S, MB]");
  const float* qp = q.typed_data();
  const auto* kp = reinterpret_cast<const typename Fmt::T*>(k.typed_data());
  const auto* vp = reinterpret_cast<const typename Fmt::T*>(v.typed_data());
  const int32_t *tp = tables.typed_data(), *cu = cu_q_lens.typed_data(), *kl = kv_lens.typed_data();
  float* op = out->typed_data();
  std::memset(op, 0, sizeof(float) * g.T * g.Hq * g.D);
  struct Task {
    int64_t s, h, offset, n;
  };
  std::vector<Task> tasks;
  for (int64_t s = 0; s < g.S; ++s) {
    const int64_t start = std::min<int64_t>(std::max(cu[s], 0), g.T);
    const int64_t len = std::min<int64_t>(std::max(cu[s + 1], cu[s]), g.T) - start;
    const int64_t per_task = g.queries_per_task();
    for (int64_t offset = 0; offset < len; offset += per_task) {
      const int64_t n = std::min(per_task, len - offset);
      const int64_t q_len = std::max(cu[s + 1], cu[s]) - cu[s];
      if (static_cast<int64_t>(kl[s]) - q_len + offset + n - 1 < 0) continue;  // no query sees a key: zeros
      for (int64_t h = 0; h < g.Hkv; ++h) tasks.push_back({s, h, offset, n});
    }
  }
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t per_chunk = std::max<int64_t>(1, static_cast<int64_t>(tasks.size()) / (8 * threads));
  const Task* task_list = tasks.data();
  const int64_t lanes_per_head = g.D % kLanes == 0 ? g.D / kLanes : 0;
  parallel_rows(pool, tasks.size(), per_chunk, [=](int64_t t0, int64_t t1) {
    Scratch scratch(g);
    for (int64_t i = t0; i < t1; ++i) {
      const Task& t = task_list[i];
      const int64_t start = std::max(cu[t.s], 0), q_len = std::max(cu[t.s + 1], cu[t.s]) - cu[t.s];
      auto run = [&](auto dv) {
        attend_block<Fmt, decltype(dv)::value>(g, t.s, t.h, t.offset, t.n, qp, kp, vp, tp, start, q_len, kl[t.s],
                                               sm_scale, sliding_window, op, scratch);
      };
      if (lanes_per_head == 4) run(std::integral_constant<int, 4>{});
      else if (lanes_per_head == 8) run(std::integral_constant<int, 8>{});
      else if (lanes_per_head == 16) run(std::integral_constant<int, 16>{});
      else run(std::integral_constant<int, 0>{});
    }
  });
  return ffi::Error::Success();
}

}  // namespace

JAXINFER_ATTENTION_HANDLER(jaxinfer_ragged_attention_f32, (RaggedAttention<F32, ffi::F32>), ffi::F32);
JAXINFER_ATTENTION_HANDLER(jaxinfer_ragged_attention_e4m3, (RaggedAttention<E4M3, ffi::S8>), ffi::S8);
