"""``jaxinfer-bench kernels``: the ragged paged-attention kernel, checked against its reference, then timed.

For every case (a batch of sequences with given query and context lengths, at the head shapes of a real
model) the bench builds a paged KV cache the way the engine lays it out (shuffled 16-token pages, block 0
reserved, token and sequence counts padded to powers of two, spare pages poisoned with NaN), then:

1. **Correctness first.** The Pallas kernel's output is compared with ``ragged_paged_attention_reference``
   (float32, one sequence at a time) on up to ``MAX_CHECKED_SEQS`` of the batch's sequences, and its
   padding rows must be exactly zero. A case outside the dtype's tolerance is marked FAIL and not timed.
   The XLA path (``jaxinfer.model.attention.xla_ragged_paged_attention``) is checked the same way.
2. **Timing** (GPU only: interpret mode on CPU only checks correctness). Both paths run inside one jitted
   call over several disjoint page sets (so repeated calls do not hit in L2), after a warm-up; the median
   over ``--repeats`` calls, divided by the number of sets, is the time per attention call. Bytes moved
   are the K/V the call must read (each sequence's visible keys, once) plus q and the output; achieved
   GB/s is set against the bandwidth measured in the same run (``bench.hardware.measure_bandwidth``).

Head shapes: Llama-2-7B, Llama-3-8B and Qwen2.5-7B's K/V heads, and DeepSeek-V2-Lite / V3's latent rows (MLA:
one cached 576-lane row per token, keys and, its first 512 lanes, values: ``v_cache=None, value_dim=512``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench import hardware, report
from jaxinfer.model.attention import xla_ragged_paged_attention
from jaxinfer.runner.shape_plan import bucket
from pallas_kernels.ragged_paged_attention import ragged_paged_attention, ragged_paged_attention_reference

MAX_CHECKED_SEQS = 8  # sequences of a batch compared against the reference
ROTATION_BYTES = 512 << 20  # page sets are replicated until the timed K/V exceed this (H200 L2: 60 MB)
MAX_PAGE_SETS = 8
POISON_BLOCKS = 4  # spare pages filled with NaN that no block table names

# (relative L2 error, max abs error as a fraction of max |reference|) allowed per dtype.
TOLERANCES = {
    "float32": (1e-5, 1e-4),
    "float16": (2e-3, 1e-2),
    "bfloat16": (1.5e-2, 5e-2),
}


@dataclasses.dataclass(frozen=True)
class HeadShape:
    """Attention head layout of one model."""

    name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int  # the key width
    value_dim: int | None = None  # latent rows (MLA): one cache, the values its rows' first value_dim lanes

    @property
    def value_width(self) -> int:
        return self.head_dim if self.value_dim is None else self.value_dim

    @property
    def cache_arrays(self) -> int:  # K and V, or the one latent array
        return 1 if self.value_dim is not None else 2


LLAMA2_7B = HeadShape("llama-2-7b", 32, 32, 128)
LLAMA3_8B = HeadShape("llama-3-8b", 32, 8, 128)
QWEN25_7B = HeadShape("qwen2.5-7b", 28, 4, 128)
GPU_HEAD_SHAPES = (LLAMA3_8B, LLAMA2_7B, QWEN25_7B)
# MLA's absorbed attention: 512 latent + 64 rope lanes, one cached row per token read by every head
DEEPSEEK_V2_LITE = HeadShape("deepseek-v2-lite", 16, 1, 576, value_dim=512)
DEEPSEEK_V3 = HeadShape("deepseek-v3", 128, 1, 576, value_dim=512)
LATENT_HEAD_SHAPES = (DEEPSEEK_V2_LITE, DEEPSEEK_V3)
CPU_HEAD_SHAPES = (HeadShape("mha-tiny", 4, 4, 32), HeadShape("gqa4-tiny", 8, 2, 32),
                   HeadShape("gqa7-tiny", 7, 1, 32))


@dataclasses.dataclass(frozen=True)
class KernelCase:
    """One attention call: sequence ``i`` has ``q_lens[i]`` new tokens and ``kv_lens[i]`` keys in total."""

    kind: str  # "decode" | "mixed" | "check"
    heads: HeadShape
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]  # includes the new tokens, so kv_len >= q_len >= 1
    block_size: int = 16
    sliding_window: int | None = None
    num_kv_splits: int | None = None  # None: the kernel's own choice

    def __post_init__(self):
        if len(self.q_lens) != len(self.kv_lens) or not self.q_lens:
            raise ValueError("q_lens and kv_lens must be non-empty and of equal length")
        if any(q < 1 or kv < q for q, kv in zip(self.q_lens, self.kv_lens)):
            raise ValueError(f"need 1 <= q_len <= kv_len for every sequence: {self.q_lens} {self.kv_lens}")

    @property
    def batch(self) -> int:
        return len(self.q_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)

    @property
    def name(self) -> str:
        h = self.heads
        ctx = max(self.kv_lens)
        ctx_s = f"{ctx // 1024}k" if ctx % 1024 == 0 else str(ctx)
        extra = "".join([f" w{self.sliding_window}" if self.sliding_window else "",
                         f" split{self.num_kv_splits}" if self.num_kv_splits else "",
                         f" bs{self.block_size}" if self.block_size != 16 else ""])
        dims = f"{h.head_dim}" if h.value_dim is None else f"{h.head_dim}:{h.value_dim}"
        return f"{self.kind} {h.name} ({h.num_q_heads}/{h.num_kv_heads}/{dims}) b{self.batch} ctx{ctx_s}{extra}"


def _decode(heads, batch, ctx):
    return KernelCase("decode", heads, (1,) * batch, (ctx,) * batch)


def _mixed(heads, prefills, chunk, prefill_ctx, decodes, decode_ctx):
    """``prefills`` prompt chunks of ``chunk`` tokens (ending at ``prefill_ctx``) next to ``decodes`` decodes."""
    return KernelCase("mixed", heads, (chunk,) * prefills + (1,) * decodes,
                      (prefill_ctx,) * prefills + (decode_ctx,) * decodes)


def gpu_cases() -> list[KernelCase]:
    """The sweep, most important first (a time budget cuts the tail): >=16k KV tokens for every model."""
    first_points = ((1, 16384), (32, 4096), (64, 16384))
    first, rest = [], []
    for heads in GPU_HEAD_SHAPES:
        first += [_decode(heads, b, ctx) for b, ctx in first_points]
        first.append(_mixed(heads, 1, 512, 2048, 31, 4096))
    for batch in (1, 8, 32, 64):  # the rest of the grid, models interleaved
        for ctx in (16384, 4096, 1024):
            rest += [_decode(h, batch, ctx) for h in GPU_HEAD_SHAPES if (batch, ctx) not in first_points]
    rest += [_mixed(h, 4, 256, 8192, 28, 8192) for h in GPU_HEAD_SHAPES]
    for heads in LATENT_HEAD_SHAPES:
        rest += [_decode(heads, b, ctx) for b, ctx in first_points]
        rest.append(_mixed(heads, 1, 512, 2048, 31, 4096))
    return first + rest


def gpu_check_cases() -> list[KernelCase]:
    """Correctness on the device over the knobs the sweep does not vary (not timed)."""
    return [
        _decode(LLAMA3_8B, 3, 1000),
        KernelCase("check", LLAMA3_8B, (1, 1, 1), (5000, 333, 17), num_kv_splits=4),
        KernelCase("check", LLAMA3_8B, (1, 1), (3000, 900), num_kv_splits=1),
        KernelCase("check", QWEN25_7B, (37, 1, 300, 1), (1500, 2000, 300, 70)),
        KernelCase("check", LLAMA2_7B, (1, 64, 1), (700, 64, 1), block_size=32),
        KernelCase("check", HeadShape("mistral-7b", 32, 8, 128), (1, 100, 1), (4000, 2100, 200),
                   sliding_window=1024),
        KernelCase("check", HeadShape("qwen2.5-0.5b", 14, 2, 64), (1, 1, 130), (900, 2000, 600)),
        KernelCase("check", HeadShape("phi-2", 32, 32, 80), (1, 20), (1200, 300), num_kv_splits=3),
        KernelCase("check", HeadShape("gemma-d256", 8, 1, 256), (1, 33), (800, 100)),
        KernelCase("check", DEEPSEEK_V2_LITE, (1, 40, 1), (3000, 300, 17), num_kv_splits=2),
        KernelCase("check", DEEPSEEK_V3, (1, 9), (1200, 200)),
    ]


def cpu_cases() -> list[KernelCase]:
    """Tiny float32 cases for interpret mode (correctness only)."""
    cases = [_decode(h, b, ctx) for h in CPU_HEAD_SHAPES for b, ctx in ((1, 40), (3, 100))]
    cases += [_mixed(CPU_HEAD_SHAPES[1], 1, 24, 60, 2, 75)]
    return cases


def cpu_check_cases() -> list[KernelCase]:
    gqa = CPU_HEAD_SHAPES[1]
    return [
        KernelCase("check", gqa, (1, 9), (150, 30), num_kv_splits=3),
        KernelCase("check", CPU_HEAD_SHAPES[2], (1, 12), (90, 40), sliding_window=24),
        KernelCase("check", HeadShape("d80-tiny", 4, 2, 80), (1, 5), (70, 20), block_size=32),
        KernelCase("check", HeadShape("mla-tiny", 8, 1, 48, value_dim=32), (1, 7), (60, 30), num_kv_splits=2),
    ]


CASE_SETS = {"gpu": gpu_cases, "gpu-check": gpu_check_cases, "cpu": cpu_cases, "cpu-check": cpu_check_cases}


# ----------------------------------------------------------------------------------------------------------
# Inputs laid out as the engine lays them out
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CaseInputs:
    q: jax.Array  # [T, Hq, D], T = bucket(num_tokens, 8); rows past num_tokens are padding
    k_cache: jax.Array  # [N, BS, Hkv, D]
    v_cache: jax.Array | None  # None: latent rows (the values are k_cache's first value_dim lanes)
    block_tables: tuple[jax.Array, ...]  # one [S, MB] table per disjoint page set
    cu_q_lens: jax.Array  # [S + 1], S = bucket(batch); padding slots repeat the last value
    kv_lens: jax.Array  # [S]; 0 for padding slots
    query_width: int | None  # the XLA path's step kind, as the engine plans it (1: decode; None: mixed)


def build_inputs(case: KernelCase, dtype, num_sets: int, seed: int = 0) -> CaseInputs:
    """Random q and K/V on shuffled pages; ``num_sets`` disjoint page sets; spare pages are NaN."""
    rng = np.random.default_rng(seed)
    bs, h = case.block_size, case.heads
    num_seqs, num_tokens = bucket(case.batch), bucket(case.num_tokens, 8)
    pages = [-(-kv // bs) for kv in case.kv_lens]
    max_pages = bucket(max(pages))
    num_blocks = 1 + num_sets * sum(pages) + POISON_BLOCKS  # block 0 is the engine's null block
    order = rng.permutation(np.arange(1, num_blocks)).tolist()
    tables = []
    for _ in range(num_sets):
        table = np.zeros((num_seqs, max_pages), np.int32)
        for s, n in enumerate(pages):
            table[s, :n] = [order.pop() for _ in range(n)]
        tables.append(jnp.asarray(table))
    poisoned = np.zeros(num_blocks, bool)
    poisoned[order] = True  # the pages no table names
    q_lens = np.zeros(num_seqs, np.int32)
    q_lens[: case.batch] = case.q_lens
    kv_lens = np.zeros(num_seqs, np.int32)
    kv_lens[: case.batch] = case.kv_lens
    cu_q_lens = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)

    shape = (num_blocks, bs, h.num_kv_heads, h.head_dim)
    make_cache = jax.jit(
        lambda key, poison: jnp.where(poison[:, None, None, None], jnp.nan,
                                      jax.random.normal(key, shape, jnp.float32)).astype(dtype))
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    poison = jnp.asarray(poisoned)
    return CaseInputs(
        q=jax.random.normal(kq, (num_tokens, h.num_q_heads, h.head_dim), jnp.float32).astype(dtype),
        k_cache=make_cache(kk, poison), v_cache=None if h.value_dim else make_cache(kv, poison),
        block_tables=tuple(tables),
        cu_q_lens=jnp.asarray(cu_q_lens), kv_lens=jnp.asarray(kv_lens),
        query_width=1 if max(case.q_lens) == 1 else None)


def kv_bytes(case: KernelCase, itemsize: int) -> int:
    """K/V bytes one call must read: each sequence's keys visible to at least one of its queries, once (latent
    rows: one row per key, both keys and values)."""
    h = case.heads
    keys = 0
    for q, kv in zip(case.q_lens, case.kv_lens):
        first = 0 if case.sliding_window is None else max(0, kv - q - case.sliding_window + 1)
        keys += kv - first
    return keys * h.cache_arrays * h.num_kv_heads * h.head_dim * itemsize


def bytes_moved(case: KernelCase, itemsize: int) -> int:
    """K/V read plus q read (``[tokens, Hq, D]``) and the output written (``[tokens, Hq, Dv]``)."""
    h = case.heads
    return kv_bytes(case, itemsize) + case.num_tokens * h.num_q_heads * (h.head_dim + h.value_width) * itemsize


def attention_flops(case: KernelCase) -> int:
    """2 flops per multiply-add of q . k (D lanes) and p . v (Dv lanes) over every (query, visible key) pair and
    query head."""
    h = case.heads
    pairs = 0
    for q, kv in zip(case.q_lens, case.kv_lens):
        visible = np.arange(kv - q, kv) + 1  # keys 0..position
        if case.sliding_window is not None:
            visible = np.minimum(visible, case.sliding_window)
        pairs += int(visible.sum())
    return 2 * pairs * h.num_q_heads * (h.head_dim + h.value_width)


# ----------------------------------------------------------------------------------------------------------
# Correctness
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Comparison:
    max_abs_err: float
    rel_l2_err: float
    max_abs_ref: float
    padding_max_abs: float  # largest |output| on padding rows (must be 0)
    ok: bool
    reason: str  # "" when ok

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def compare_outputs(out: np.ndarray, ref: np.ndarray, dtype, padding: np.ndarray | None = None) -> Comparison:
    """Judge ``out`` against ``ref`` (both float arrays of one shape) with ``dtype``'s tolerance.

    Fails on any non-finite output, a relative L2 error or a max abs error (relative to max |ref|) over the
    tolerance, or a nonzero padding row.
    """
    rel_tol, max_tol = TOLERANCES[jnp.dtype(dtype).name]
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"output shape {out.shape} != reference shape {ref.shape}")
    pad = np.asarray(padding, np.float64) if padding is not None else np.zeros(0)
    finite = bool(np.isfinite(out).all()) and bool(np.isfinite(pad).all())
    diff = np.abs(out - ref)
    max_abs_ref = float(np.max(np.abs(ref), initial=0.0))
    max_abs_err = float(np.max(diff, initial=0.0)) if finite else math.inf
    ref_norm = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(out - ref)) / ref_norm if ref_norm > 0 else float(np.linalg.norm(out))
    rel = rel if finite else math.inf
    pad_max = float(np.max(np.abs(pad), initial=0.0)) if pad.size else 0.0
    reasons = []
    if not finite:
        reasons.append("non-finite output")
    elif not np.isfinite(ref).all():
        reasons.append("non-finite reference")
    else:
        if rel > rel_tol:
            reasons.append(f"rel L2 err {rel:.2e} > {rel_tol:.0e}")
        if max_abs_err > max_tol * max(max_abs_ref, 1e-6):
            reasons.append(f"max abs err {max_abs_err:.2e} > {max_tol:.0e} x max|ref| {max_abs_ref:.2e}")
        if pad_max != 0.0:
            reasons.append(f"padding rows not zero (max {pad_max:.2e})")
    return Comparison(max_abs_err, rel, max_abs_ref, pad_max, not reasons, "; ".join(reasons))


def checked_sequences(case: KernelCase, limit: int = MAX_CHECKED_SEQS) -> list[int]:
    """Which sequences to compare: every prefill chunk (up to ``limit``), then decodes spread evenly."""
    prefill = [i for i, q in enumerate(case.q_lens) if q > 1][:limit]
    decode = [i for i, q in enumerate(case.q_lens) if q == 1]
    room = limit - len(prefill)
    if len(decode) > room:
        decode = sorted({decode[round(j * (len(decode) - 1) / max(room - 1, 1))] for j in range(room)})
    return sorted(prefill + decode)


def _reference_rows(case: KernelCase, inputs: CaseInputs, seqs: list[int], sm_scale: float):
    """Reference outputs of ``seqs`` (as one sub-batch) and their row indices in the full batch."""
    cu = np.asarray(inputs.cu_q_lens)
    rows = np.concatenate([np.arange(cu[s], cu[s + 1]) for s in seqs])
    q_lens = np.array([case.q_lens[s] for s in seqs], np.int32)
    ref = ragged_paged_attention_reference(
        inputs.q[jnp.asarray(rows)], inputs.k_cache, inputs.v_cache,
        inputs.block_tables[0][jnp.asarray(seqs)],
        jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)),
        jnp.asarray(np.array([case.kv_lens[s] for s in seqs], np.int32)),
        sm_scale=sm_scale, sliding_window=case.sliding_window, value_dim=case.heads.value_dim)
    return np.asarray(ref.astype(jnp.float32)), rows


def _as_f32(x) -> np.ndarray:
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


# ----------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------


def _kernel_fn(case: KernelCase, sm_scale: float):
    return lambda q, k, v, table, cu, kv: ragged_paged_attention(
        q, k, v, table, cu, kv, sm_scale=sm_scale, sliding_window=case.sliding_window,
        num_kv_splits=case.num_kv_splits, value_dim=case.heads.value_dim)


def _xla_fn(case: KernelCase, sm_scale: float, query_width: int | None):
    return lambda q, k, v, table, cu, kv: xla_ragged_paged_attention(
        q, k, v, table, cu, kv, sm_scale=sm_scale, query_width=query_width, sliding_window=case.sliding_window,
        value_dim=case.heads.value_dim)


def over_page_sets(fn):
    """One jitted call that runs ``fn`` once per page set (distinct inputs, so nothing is deduplicated)."""
    return jax.jit(lambda q, k, v, tables, cu, kv: tuple(fn(q, k, v, t, cu, kv) for t in tables))


def _args(inputs: CaseInputs) -> tuple:
    return (inputs.q, inputs.k_cache, inputs.v_cache, inputs.block_tables, inputs.cu_q_lens, inputs.kv_lens)


def time_per_call(fn_over_sets, inputs: CaseInputs, warmup: int, repeats: int) -> list[float]:
    """Seconds per attention call, one sample per repeat (each after the last finished), after warm-up."""
    for _ in range(warmup):
        jax.block_until_ready(fn_over_sets(*_args(inputs)))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn_over_sets(*_args(inputs)))
        times.append((time.perf_counter() - t) / len(inputs.block_tables))
    return times


def xla_temp_bytes(case: KernelCase) -> int:
    """Rough peak of the XLA path: each sequence's gathered K and V in the cache dtype and in float32."""
    h = case.heads
    ctx = bucket(max(-(-kv // case.block_size) for kv in case.kv_lens)) * case.block_size
    return h.cache_arrays * bucket(case.batch) * ctx * h.num_kv_heads * h.head_dim * (2 + 4 + 4)


# ----------------------------------------------------------------------------------------------------------
# One case, the sweep, the CLI
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunOptions:
    dtype: object
    timing: bool
    warmup: int = 3
    repeats: int = 20
    bandwidth_bytes_per_s: float | None = None
    xla_memory_limit_bytes: int = 40 << 30
    page_sets: int | None = None  # None: enough disjoint page sets to defeat the L2 (timing only)


def run_case(case: KernelCase, opts: RunOptions, seed: int = 0) -> dict:
    """Check one case (kernel and XLA path against the reference), then time it if it passed."""
    h = case.heads
    itemsize = jnp.dtype(opts.dtype).itemsize
    sm_scale = h.head_dim ** -0.5
    result = {
        "name": case.name, "kind": case.kind, "model_shape": h.name, "num_q_heads": h.num_q_heads,
        "num_kv_heads": h.num_kv_heads, "head_dim": h.head_dim, "value_dim": h.value_dim, "batch": case.batch,
        "num_tokens": case.num_tokens, "max_q_len": max(case.q_lens), "max_kv_len": max(case.kv_lens),
        "total_kv_tokens": sum(case.kv_lens), "block_size": case.block_size,
        "sliding_window": case.sliding_window, "num_kv_splits": case.num_kv_splits,
        "dtype": jnp.dtype(opts.dtype).name, "bytes": bytes_moved(case, itemsize),
        "kv_bytes": kv_bytes(case, itemsize), "flops": attention_flops(case),
        "status": "ERROR", "correctness": None, "timing": None, "error": None,
    }
    set_bytes = kv_bytes(case, itemsize)
    num_sets = min(MAX_PAGE_SETS, max(1, -(-ROTATION_BYTES // max(set_bytes, 1)))) if opts.timing else 1
    num_sets = opts.page_sets or num_sets
    xla_fits = xla_temp_bytes(case) <= opts.xla_memory_limit_bytes
    try:
        inputs = build_inputs(case, opts.dtype, num_sets, seed)
        seqs = checked_sequences(case)
        ref, rows = _reference_rows(case, inputs, seqs, sm_scale)
        # The compiled functions that are timed are the ones checked (set 0's output is compared).
        kernel_fn = over_page_sets(_kernel_fn(case, sm_scale))
        kernel_out = _as_f32(kernel_fn(*_args(inputs))[0])
        kernel_check = compare_outputs(kernel_out[rows], ref, opts.dtype, kernel_out[case.num_tokens:])
        xla_fn, xla_check, xla_note = None, None, "XLA path would exceed --xla-memory-limit-gb"
        if xla_fits:
            try:  # the XLA path is the baseline: its failure is recorded, the kernel's case goes on
                xla_fn = over_page_sets(_xla_fn(case, sm_scale, inputs.query_width))
                xla_out = _as_f32(xla_fn(*_args(inputs))[0])
                xla_check, xla_note = compare_outputs(xla_out[rows], ref, opts.dtype, xla_out[case.num_tokens:]), None
            except Exception as e:
                xla_fn, xla_note = None, f"{type(e).__name__}: {e}"[:500]
        result["correctness"] = {"checked_seqs": seqs, "kernel": kernel_check.to_json(),
                                 "xla": xla_check.to_json() if xla_check else None, "xla_skipped": xla_note}
        result["status"] = "PASS" if kernel_check.ok else "FAIL"
        if kernel_check.ok and opts.timing:
            result["timing"] = _timing(opts, inputs, kernel_fn, xla_fn if xla_check and xla_check.ok else None,
                                       result["bytes"])
    except Exception as e:  # one broken case must not end the sweep: record it and go on
        result["status"] = "ERROR"
        result["error"] = f"{type(e).__name__}: {e}"[:2000]
    return result


def _timing(opts: RunOptions, inputs: CaseInputs, kernel_fn, xla_fn, nbytes: int) -> dict:
    kernel_times = time_per_call(kernel_fn, inputs, opts.warmup, opts.repeats)
    kernel_s = statistics.median(kernel_times)
    timing = {"page_sets": len(inputs.block_tables), "repeats": opts.repeats, "kernel_s": kernel_s,
              "kernel_s_min": min(kernel_times), "kernel_s_max": max(kernel_times),
              "achieved_gb_per_s": nbytes / kernel_s / 1e9, "xla_s": None, "speedup_vs_xla": None,
              "floor_s": None, "bandwidth_fraction": None}
    if opts.bandwidth_bytes_per_s:
        timing["floor_s"] = nbytes / opts.bandwidth_bytes_per_s
        timing["bandwidth_fraction"] = timing["floor_s"] / kernel_s
    if xla_fn is not None:
        try:
            xla_s = statistics.median(time_per_call(xla_fn, inputs, opts.warmup, opts.repeats))
            timing.update(xla_s=xla_s, speedup_vs_xla=xla_s / kernel_s)
        except Exception as e:  # e.g. out of memory: the kernel's numbers stand
            timing["xla_error"] = f"{type(e).__name__}: {e}"[:500]
    return timing


def _row(r: dict) -> list:
    c, t = r["correctness"], r["timing"] or {}
    status = r["status"] if not r["error"] else f"{r['status']}: {r['error'][:40]}"
    if c and not c["kernel"]["ok"]:
        status = f"FAIL: {c['kernel']['reason'][:40]}"
    xla_ok = "-" if not c or not c["xla"] else ("ok" if c["xla"]["ok"] else "FAIL")
    us = lambda s: s * 1e6 if s is not None else "-"
    pct = t.get("bandwidth_fraction")
    return [r["name"], status, c["kernel"]["max_abs_err"] if c else "-", xla_ok,
            us(t.get("kernel_s")), t.get("achieved_gb_per_s", "-"),
            f"{pct:.0%}" if pct is not None else "-", us(t.get("xla_s")),
            t["speedup_vs_xla"] if t.get("speedup_vs_xla") else "-"]


def _write_partial(path: str | None, payload: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")


def run(args) -> dict:
    on_gpu = jax.default_backend() == "gpu"
    case_set = args.cases if args.cases != "auto" else ("gpu" if on_gpu else "cpu")
    dtype = jnp.dtype(args.dtype if args.dtype != "auto" else ("bfloat16" if on_gpu else "float32"))
    timing = {"auto": jax.default_backend() != "cpu", "on": True, "off": False}[args.timing]
    cases = CASE_SETS[case_set]()[: args.max_cases]
    bw = hardware.measure_bandwidth() if timing else None
    opts = RunOptions(dtype=dtype, timing=timing, warmup=args.warmup, repeats=args.repeats,
                      bandwidth_bytes_per_s=bw.bytes_per_s if bw else None,
                      xla_memory_limit_bytes=int(args.xla_memory_limit_gb * (1 << 30)),
                      page_sets=args.page_sets)
    payload = {"benchmark": "kernels", "kernel": "ragged_paged_attention", "machine": hardware.machine_info(),
               "case_set": case_set, "dtype": dtype.name, "timing_meaningful": timing,
               "timing_note": None if timing else "correctness only: interpret mode / CPU is not for speed",
               "bandwidth": bw.to_json() if bw else None, "tolerances": TOLERANCES[dtype.name],
               "planned_cases": len(cases), "results": []}
    t0 = time.perf_counter()
    for i, case in enumerate(cases):
        if args.time_budget_s is not None and time.perf_counter() - t0 > args.time_budget_s:
            payload["results"].append({"name": case.name, "status": "SKIPPED", "error": "time budget",
                                       "correctness": None, "timing": None})
            continue
        r = run_case(case, opts, seed=i)
        payload["results"].append(r)
        print(f"[{i + 1}/{len(cases)}] {' | '.join(str(v) if not isinstance(v, float) else f'{v:.4g}' for v in _row(r))}",
              flush=True)
        _write_partial(args.output, payload)  # partial results survive a timeout
    payload["elapsed_s"] = time.perf_counter() - t0
    payload["counts"] = {s: sum(r["status"] == s for r in payload["results"])
                         for s in ("PASS", "FAIL", "ERROR", "SKIPPED")}
    title = (f"ragged paged attention — {payload['machine']['device']}, {dtype.name}, cases {case_set}; "
             + (f"bandwidth {bw.bytes_per_s / 1e9:.0f} GB/s ({bw.probe})" if bw else payload["timing_note"]))
    report.print_table(title, ["case", "kernel check", "max abs err", "XLA check", "kernel µs", "GB/s", "% BW",
                               "XLA µs", "speedup"], [_row(r) for r in payload["results"] if "kind" in r])
    print("counts: " + ", ".join(f"{k} {v}" for k, v in payload["counts"].items()))
    report.write_json(args.output, payload)
    if args.strict and (payload["counts"]["FAIL"] or payload["counts"]["ERROR"]):
        raise SystemExit(1)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--cases", default="auto", choices=["auto", *CASE_SETS],
                   help="case set; auto: gpu on a GPU, cpu (tiny, float32) elsewhere")
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--timing", default="auto", choices=["auto", "on", "off"],
                   help="auto: time on accelerators only (interpret mode on CPU only checks correctness)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--max-cases", type=int, default=None)
    p.add_argument("--time-budget-s", type=float, default=None, help="start no new case after this many seconds")
    p.add_argument("--xla-memory-limit-gb", type=float, default=40.0,
                   help="skip the XLA path where its gathered K/V would exceed this")
    p.add_argument("--page-sets", type=int, default=None,
                   help="disjoint page sets cycled through when timing (default: enough to exceed 512 MB, <= 8)")
    p.add_argument("--strict", action="store_true", help="exit 1 if any case fails or errors")
    p.add_argument("--output", default=None, help="write the results as JSON here")
