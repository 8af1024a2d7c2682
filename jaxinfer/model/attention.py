"""Ragged paged attention on the XLA path (plain jnp), and the switch between attention backends.

Semantics (shared with ``pallas_kernels.ragged_paged_attention``): query ``i`` of sequence ``s`` sits at
position ``kv_lens[s] - q_len[s] + i`` and attends causally to the sequence's keys at positions up to its
own (optionally only those inside a sliding window), read from the paged cache through ``block_tables``.

Two loops serve every step, both blocked like flash attention (online softmax in float32) and both visiting
only the keys some query needs, with loop bounds computed from the data (``lax.fori_loop`` with dynamic
bounds), so a block table padded to its full width costs nothing:

* short query runs (decodes: one query; speculative verification: 1 + k) — ``_attend_short_queries``:
  every sequence slot at once, the context visited in chunks of blocks (on the CPU, the C++ kernel of
  ``jaxinfer.cpu.ffi`` instead, which reads the blocks in place);
* longer runs (prompts, prefill chunks) — ``_attend_query_blocks``: a work list of query blocks, each up to
  ``q_block`` consecutive queries of one sequence, against that sequence's keys in blocks of ``k_block`` (on
  the CPU, the C++ kernel ``cpu_ffi.ragged_attention``, flash attention in registers: ~3x the loop on a
  512-token prompt).

The static ``query_width`` says which a step needs: ``W >= 1`` promises that no sequence has more than W
queries (a decode or verification step: the short loop only); ``None`` is a mixed step (single-query slots
take the short loop, longer runs the query-block loop). Nothing else about the batch is static.

Per layer, optionally: Gemma 2's score soft-capping (``soft_cap``) and GPT-OSS's attention sinks (``sinks``
[Hq], a learned logit per head in every softmax's denominator: the online softmax starts at max = sink,
denominator 1); the C++ kernels have neither, so such layers take the loops.

Caches may be float, float8_e4m3fn, or e4m3 bytes typed int8 (an fp8 KV cache on the CPU): ``widen_kv``.

Backends are named by what runs (``BACKENDS``, ``resolve_attention_backend``): "pallas" (the Pallas kernel),
"xla" (the loops here, on every platform, no C++ kernel), "cpu" (the C++ kernels where they apply, these loops
elsewhere); "auto" picks one per platform. ``get_attention_fn`` returns the function of a resolved backend.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxinfer.cpu import ffi as cpu_ffi

# What runs the attention (and, on a CPU, the linears: ``jaxinfer.model.linear.with_cpu_kernels``); "auto" is
# resolved to one of them by ``resolve_attention_backend``.
BACKENDS = ("pallas", "xla", "cpu")
_FINITE_MIN = -1e30  # running-max start: finite, so a block with no valid key rescales by exp(0), never NaN


def widen_kv(x):
    """Gathered K/V as float32: float caches and e4m3 ones (``kv_cache_dtype="fp8"``) by a cast; e4m3 bytes held
    as int8 (the fp8 cache's CPU storage, ``jaxinfer.model.kv_cache``) reinterpreted first."""
    if jnp.dtype(x.dtype) == jnp.dtype(jnp.int8):
        x = jax.lax.bitcast_convert_type(x, jnp.float8_e4m3fn)
    return x.astype(jnp.float32)


def _online_softmax_step(carry, scores, weighted_sum):
    """Fold one block of masked ``scores`` [..., C] into the running (max, denominator, weighted sum [..., D]);
    ``weighted_sum(probs)`` gives the block's probs @ V [..., D]."""
    run_max, denom, acc = carry
    new_max = jnp.maximum(run_max, scores.max(-1))
    probs = jnp.exp(scores - new_max[..., None])
    rescale = jnp.exp(run_max - new_max)
    return new_max, denom * rescale + probs.sum(-1), acc * rescale[..., None] + weighted_sum(probs)


def _normalise(denom, acc):
    return acc / jnp.where(denom > 0, denom, 1.0)[..., None]


def _initial_state(shape, head_dim, sink_rows=None):
    """(running max, denominator, weighted sum) before any key: empty, or holding the sink, GPT-OSS's learned
    logit in the denominator (``sink_rows`` broadcastable to ``shape``): max = sink, denominator exp(0) = 1."""
    acc = jnp.zeros((*shape, head_dim), jnp.float32)
    if sink_rows is None:
        return jnp.full(shape, _FINITE_MIN, jnp.float32), jnp.zeros(shape, jnp.float32), acc
    return jnp.broadcast_to(sink_rows.astype(jnp.float32), shape), jnp.ones(shape, jnp.float32), acc


def soft_cap_scores(scores, soft_cap):
    """Gemma 2's logit soft-capping, ``cap * tanh(scores / cap)``: of the scaled attention scores, and (by
    ``model.decoder``) of the final logits; None: unchanged."""
    return scores if soft_cap is None else soft_cap * jnp.tanh(scores / soft_cap)


def _key_range(first_query_pos, last_query_pos, sliding_window):
    """[first, last] key positions a run of queries at positions first..last may see."""
    first = jnp.int32(0) if sliding_window is None else jnp.maximum(first_query_pos - sliding_window + 1, 0)
    return first, last_query_pos


_DECODE_CHUNK_BYTES = 1 << 20  # K gathered per chunk of the short-query loop: small enough to stay in cache
_DECODE_CHUNK_KEYS = 128  # and at most this many keys per sequence (the last chunk's unneeded keys are wasted)


def _attend_short_queries(q_TNH, k_cache, v_cache, block_tables, q_start, q_lens, kv_lens, *, width, sm_scale,
                          sliding_window, chunk_bytes=_DECODE_CHUNK_BYTES, max_chunk_keys=_DECODE_CHUNK_KEYS,
                          cpu_kernel=None, soft_cap=None, sinks=None):
    """Attention of sequences with at most ``width`` queries each, the last at position kv_len - 1 (a slot
    with q_len 0 sees nothing): returns [S, width, Hq, D] (float32).

    On the CPU (``cpu_kernel`` None: when ``cpu_ffi.use_paged_attention`` says so) the C++ kernel reads the
    keys in place; otherwise the loop below.

    The context is visited once, in chunks of blocks, with an online softmax for all of a sequence's queries
    together, so the gathered K/V and the scores of one chunk stay small (gathering a whole long context at
    once made XLA:CPU allocate and page-fault tens of megabytes per layer). Only the chunks between the
    first key any query may see and the last are visited.
    """
    num_tokens, num_heads, head_dim = q_TNH.shape
    num_seqs, max_blocks = block_tables.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    rows = width * group  # query rows per (sequence, KV head), ordered (query, head in group)
    j = jnp.arange(width)
    q_valid = j[None, :] < q_lens[:, None]  # [S, W]
    q = q_TNH[jnp.clip(q_start[:, None] + j[None, :], 0, num_tokens - 1)]  # [S, W, Hq, D]
    if cpu_kernel is None:
        cpu_kernel = cpu_ffi.use_paged_attention(q.dtype, k_cache.dtype)
    if cpu_kernel:
        return cpu_ffi.paged_attention(q, k_cache, v_cache, block_tables, q_lens, kv_lens, sm_scale=sm_scale,
                                       sliding_window=sliding_window)
    q = q.reshape(num_seqs, width, num_kv_heads, group, head_dim).transpose(0, 2, 1, 3, 4)
    q = q.reshape(num_seqs, num_kv_heads, rows, head_dim).astype(jnp.float32) * sm_scale
    q_pos = (kv_lens - q_lens)[:, None] + j[None, :]  # [S, W]
    row_pos = jnp.repeat(jnp.where(q_valid, q_pos, -1), group, axis=1)  # [S, rows]; -1: sees no key
    column_bytes = num_seqs * block_size * num_kv_heads * head_dim * 4
    chunk = 1
    while (chunk * 2 * column_bytes <= chunk_bytes and chunk * 2 <= max_blocks
           and chunk * 2 * block_size <= max_chunk_keys):
        chunk *= 2
    num_chunks = -(-max_blocks // chunk)
    keys = chunk * block_size
    tables = jnp.pad(block_tables, ((0, 0), (0, num_chunks * chunk - max_blocks)))
    tables = tables.reshape(num_seqs, num_chunks, chunk).transpose(1, 0, 2)  # [chunks, S, chunk]

    live = q_valid & (q_pos >= 0)
    big = jnp.iinfo(jnp.int32).max
    first_key, last_key = _key_range(jnp.min(jnp.where(live, q_pos, big)), jnp.max(jnp.where(live, q_pos, -1)),
                                     sliding_window)

    def visit(index, carry):
        table = tables[index]
        k = widen_kv(k_cache[table]).reshape(num_seqs, keys, num_kv_heads, head_dim)
        v = widen_kv(v_cache[table]).reshape(num_seqs, keys, num_kv_heads, head_dim)
        scores = soft_cap_scores(jnp.einsum("skqd,sckd->skqc", q, k), soft_cap)
        k_pos = index * keys + jnp.arange(keys)
        valid = k_pos[None, None, :] <= row_pos[:, :, None]  # [S, rows, C]
        if sliding_window is not None:
            valid &= k_pos[None, None, :] > row_pos[:, :, None] - sliding_window
        scores = jnp.where(valid[:, None], scores, -jnp.inf)
        return _online_softmax_step(carry, scores, lambda probs: jnp.einsum("skgc,sckd->skgd", probs, v))

    sink_rows = None if sinks is None else jnp.tile(sinks.reshape(num_kv_heads, group), (1, width))  # [Hkv, rows]
    init = _initial_state((num_seqs, num_kv_heads, rows), head_dim, sink_rows)
    lo = jnp.minimum(first_key // keys, num_chunks)
    hi = jnp.where(last_key >= 0, last_key // keys + 1, 0)
    _, denom, acc = jax.lax.fori_loop(lo, jnp.maximum(hi, lo), visit, init)
    out = _normalise(denom, acc)  # [S, Hkv, rows, D]
    out = out.reshape(num_seqs, num_kv_heads, width, group, head_dim).transpose(0, 2, 1, 3, 4)
    return out.reshape(num_seqs, width, num_heads, head_dim)


_PREFILL_Q_BLOCK = 64  # queries per block of the query-block loop
_PREFILL_K_BLOCK = 128  # keys per block


def num_query_blocks(num_tokens: int, num_seqs: int, q_block: int) -> int:
    """Static bound on the query blocks of a step: every run of >= 2 queries is cut into blocks of
    ``q_block``, so there are at most T / q_block full blocks plus one partial block per such run."""
    return -(-num_tokens // q_block) + min(num_seqs, num_tokens // 2)


def _attend_query_blocks(q_TNH, k_cache, v_cache, block_tables, cu_q_lens, q_lens, kv_lens, *, sm_scale,
                         sliding_window, q_block=_PREFILL_Q_BLOCK, k_block=_PREFILL_K_BLOCK, soft_cap=None,
                         sinks=None):
    """Attention of the query runs with more than one query: returns [T, Hq, D] (float32; rows of other
    tokens are garbage for the caller to drop).

    A work list of query blocks (up to ``q_block`` consecutive queries of one sequence) is derived from
    ``cu_q_lens`` on the device; a loop over the blocks that exist visits, for each, only the key blocks
    (``k_block`` keys of the same sequence) between the first key its first query may see and its last
    query's position — the causal half, the table's padding and keys before a sliding window are never
    computed — so the work follows the real tokens, not the padded shape.
    """
    num_tokens, num_heads, head_dim = q_TNH.shape
    num_seqs, max_blocks = block_tables.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    q_block = max(1, min(q_block, num_tokens))
    pages = max(1, k_block // block_size)  # cache blocks per key block
    keys = pages * block_size
    tables = jnp.pad(block_tables, ((0, 0), (0, -max_blocks % pages)))
    rows = group * q_block

    blocks_per_seq = jnp.where(q_lens > 1, -(-q_lens // q_block), 0)
    block_end = jnp.cumsum(blocks_per_seq)
    block_start = block_end - blocks_per_seq
    max_blocks_total = num_query_blocks(num_tokens, num_seqs, q_block)
    # rows are (head in group, query): each head's sink repeated for its q_block queries
    sink_rows = None if sinks is None else jnp.repeat(sinks.reshape(num_kv_heads, group), q_block, axis=1)

    def one_block(b, out):
        s = jnp.clip(jnp.searchsorted(block_end, b, side="right"), 0, num_seqs - 1)
        offset = (b - block_start[s]) * q_block
        n = jnp.minimum(q_block, q_lens[s] - offset)
        first_pos = kv_lens[s] - q_lens[s] + offset
        j = jnp.arange(q_block)
        q = q_TNH[jnp.clip(cu_q_lens[s] + offset + j, 0, num_tokens - 1)].astype(jnp.float32) * sm_scale
        q = q.reshape(q_block, num_kv_heads, group, head_dim).transpose(1, 2, 0, 3).reshape(num_kv_heads, rows, head_dim)
        q_pos = jnp.tile(jnp.where(j < n, first_pos + j, -1), group)  # [rows] in (head in group, query) order
        first_key, last_key = _key_range(first_pos, first_pos + n - 1, sliding_window)
        table = tables[s]

        def visit(kb, carry):
            ids = jax.lax.dynamic_slice_in_dim(table, kb * pages, pages)
            k = widen_kv(k_cache[ids]).reshape(keys, num_kv_heads, head_dim)
            v = widen_kv(v_cache[ids]).reshape(keys, num_kv_heads, head_dim)
            scores = soft_cap_scores(jnp.einsum("krd,ckd->krc", q, k), soft_cap)
            k_pos = kb * keys + jnp.arange(keys)
            valid = k_pos[None, :] <= q_pos[:, None]  # [rows, C]
            if sliding_window is not None:
                valid &= k_pos[None, :] > q_pos[:, None] - sliding_window
            scores = jnp.where(valid[None], scores, -jnp.inf)
            return _online_softmax_step(carry, scores, lambda probs: jnp.einsum("krc,ckd->krd", probs, v))

        init = _initial_state((num_kv_heads, rows), head_dim, sink_rows)
        _, denom, acc = jax.lax.fori_loop(first_key // keys, last_key // keys + 1, visit, init)
        res = _normalise(denom, acc).reshape(num_kv_heads, group, q_block, head_dim).transpose(2, 0, 1, 3)
        # rows past the block's n queries spill into the next rows, which a later block (or the caller, for
        # single-query slots and padding) overwrites: blocks run in order
        return jax.lax.dynamic_update_slice_in_dim(out, res.reshape(q_block, num_heads, head_dim),
                                                   cu_q_lens[s] + offset, axis=0)

    out = jnp.zeros((num_tokens + q_block, num_heads, head_dim), jnp.float32)
    out = jax.lax.fori_loop(0, jnp.minimum(block_end[-1], max_blocks_total), one_block, out)
    return out[:num_tokens]


def xla_ragged_paged_attention(
    q_TNH, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, *, sm_scale, query_width=None, sliding_window=None,
    decode_chunk_bytes=_DECODE_CHUNK_BYTES, prefill_q_block=_PREFILL_Q_BLOCK, prefill_k_block=_PREFILL_K_BLOCK,
    cpu_kernel=None, soft_cap=None, sinks=None, value_dim=None,
):
    """q_TNH [T, Hq, D]; caches [N, BS, Hkv, D]; block_tables [S, MB]; cu_q_lens [S+1]; kv_lens [S].
    Returns [T, Hq, D] (zeros for padding tokens). ``v_cache=None`` with ``value_dim``: latent rows (MLA), the
    values being the first ``value_dim`` lanes of the keys' rows; the result is then [T, Hq, value_dim] (here the
    whole row is weighted and the key-only lanes dropped after).

    ``query_width`` (static): W >= 1 promises that no sequence has more than W queries (decode: 1;
    verification of k drafts: 1 + k): one short-query loop serves every slot. None: any run lengths;
    single-query slots take the short-query loop, longer runs the query-block loop.
    ``cpu_kernel``: whether the C++ kernels take the step (None: on the CPU when they are loaded,
    ``cpu_ffi.loaded()``): single queries and short query runs ``cpu_ffi.paged_attention``, longer runs
    ``cpu_ffi.ragged_attention``. ``soft_cap``: Gemma 2's ``cap * tanh(score / cap)`` on the scaled scores
    (None: off); ``sinks`` [Hq]: GPT-OSS's per-head logit added to every softmax's denominator (None: off). The
    C++ kernels do neither, so a capped or sinking call always takes the loops here.
    """
    if soft_cap is not None or sinks is not None:
        cpu_kernel = False
    if (v_cache is None) != (value_dim is not None):
        raise ValueError("latent rows (MLA) are v_cache=None with value_dim; a V cache takes no value_dim")
    if v_cache is None:
        v_cache = k_cache
    value_lanes = slice(None, value_dim)
    num_tokens = q_TNH.shape[0]
    num_seqs = kv_lens.shape[0]
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    t = jnp.arange(num_tokens)
    s = jnp.clip(jnp.searchsorted(cu_q_lens, t, side="right") - 1, 0, num_seqs - 1)
    idx = t - cu_q_lens[s]
    real = t < cu_q_lens[-1]
    short = dict(sm_scale=sm_scale, sliding_window=sliding_window, chunk_bytes=decode_chunk_bytes,
                 cpu_kernel=cpu_kernel, soft_cap=soft_cap, sinks=sinks)
    if query_width is not None:
        tile = _attend_short_queries(q_TNH, k_cache, v_cache, block_tables, cu_q_lens[:-1], q_lens, kv_lens,
                                     width=query_width, **short)
        out = tile[s, jnp.clip(idx, 0, query_width - 1)]
        return jnp.where(real[:, None, None], out, 0.0)[..., value_lanes].astype(q_TNH.dtype)
    single = q_lens == 1
    decodes = _attend_short_queries(q_TNH, k_cache, v_cache, block_tables, cu_q_lens[:-1],
                                    single.astype(jnp.int32), jnp.where(single, kv_lens, 0), width=1, **short)
    if cpu_kernel is None:
        cpu_kernel = cpu_ffi.use_paged_attention(q_TNH.dtype, k_cache.dtype)
    if cpu_kernel:  # the runs by the C++ kernel; single queries see no key there (kv_len 0: a query at -1)
        runs = cpu_ffi.ragged_attention(q_TNH, k_cache, v_cache, block_tables, cu_q_lens, jnp.where(single, 0, kv_lens),
                                        sm_scale=sm_scale, sliding_window=sliding_window)
    else:
        runs = _attend_query_blocks(q_TNH, k_cache, v_cache, block_tables, cu_q_lens, q_lens, kv_lens,
                                    sm_scale=sm_scale, sliding_window=sliding_window, q_block=prefill_q_block,
                                    k_block=prefill_k_block, soft_cap=soft_cap, sinks=sinks)
    out = jnp.where(single[s][:, None, None], decodes[s, 0], runs)
    return jnp.where(real[:, None, None], out, 0.0)[..., value_lanes].astype(q_TNH.dtype)


def resolve_attention_backend(requested: str, platform: str) -> str:
    """The backend that runs for ``requested`` ("auto", "pallas", "xla" or "cpu") on ``platform`` (JAX's
    ``jax.default_backend()``: "cpu", "gpu", "tpu").

    * "pallas": the Pallas kernel (``pallas_kernels.ragged_paged_attention``; interpreted on a CPU);
    * "xla": pure XLA everywhere, no C++ kernel (the XLA loops above; linears by XLA's dots);
    * "cpu": the C++ kernels of ``jaxinfer.cpu.ffi`` (paged / ragged attention, the matrix products); the CPU
      platform only, and only where they load (built now if needed);
    * "auto": "pallas" on a GPU; on a CPU "cpu" where the kernels load, else "xla" (a failed build is warned
      about; ``JAXINFER_CPU_KERNELS=0`` is not); "xla" elsewhere.

    "cpu" on another platform, or where the kernels cannot be loaded, is a ValueError. Call it outside any
    trace (it may build the kernels): the engine does as it starts.
    """
    if requested not in ("auto", *BACKENDS):
        raise ValueError(f"attention_backend must be one of {('auto', *BACKENDS)}, got {requested!r}")
    if requested == "auto":
        if platform == "gpu":
            return "pallas"
        return "cpu" if platform == "cpu" and cpu_ffi.available() else "xla"
    if requested == "cpu":
        if platform != "cpu":
            raise ValueError(f"attention_backend='cpu' runs the C++ CPU kernels (jaxinfer.cpu.ffi), but JAX runs on "
                             f"{platform!r} here: use 'auto', 'pallas' or 'xla' (or JAX_PLATFORMS=cpu)")
        reason = cpu_ffi.unavailable_reason()
        if reason is not None:
            raise ValueError(f"attention_backend='cpu' runs the C++ CPU kernels (jaxinfer.cpu.ffi), which cannot be "
                             f"used here: {reason}. Use attention_backend='xla' (pure XLA) or 'auto'")
    return requested


def get_attention_fn(backend: str, *, query_width: int | None, sliding_window: int | None,
                     interpret: bool | None = None):
    """Return ``fn(q, k_cache, v_cache, block_tables, cu_q_lens, kv_lens, sm_scale=...)`` for a resolved backend
    (``resolve_attention_backend``): "xla" never calls a C++ kernel; "cpu" hands the query runs to them where
    their types apply (float32 queries; float32 or e4m3-byte caches) and needs them loaded
    (``jaxinfer.cpu.ffi.load()``, which ``resolve_attention_backend`` calls)."""
    if backend == "xla":
        return functools.partial(xla_ragged_paged_attention, query_width=query_width, sliding_window=sliding_window,
                                 cpu_kernel=False)
    if backend == "cpu":
        if not cpu_ffi.loaded():
            raise RuntimeError("attention_backend='cpu' needs the C++ CPU kernels loaded in this process: call "
                               "jaxinfer.cpu.ffi.load() (or resolve_attention_backend('cpu', 'cpu')) before tracing")
        return functools.partial(xla_ragged_paged_attention, query_width=query_width, sliding_window=sliding_window,
                                 cpu_kernel=None)
    if backend == "pallas":
        from pallas_kernels.ragged_paged_attention import ragged_paged_attention

        return functools.partial(ragged_paged_attention, sliding_window=sliding_window, interpret=interpret)
    if backend == "auto":
        raise ValueError("attention_backend 'auto' must be resolved first: resolve_attention_backend('auto', "
                         "jax.default_backend())")
    raise ValueError(f"attention_backend must be one of {BACKENDS}, got {backend!r}")
