"""Tests for the ragged paged-attention Pallas kernel (interpret mode on CPU) and its reference.

The kernel is fuzzed against the plain-jnp reference on permuted, poisoned page layouts; the
reference itself is checked against dense causal attention written out in numpy; every compiled
configuration is also lowered for CUDA (Triton) to catch what interpret mode accepts.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pallas_kernels import gpu_target
from pallas_kernels.paged_attention_launch import (
    default_block_q,
    default_heads_per_program,
    default_launch,
    default_num_kv_splits,
)
from pallas_kernels.ragged_paged_attention import ragged_paged_attention, ragged_paged_attention_reference

# jax >= 0.11 warns on every Triton lowering; the Triton backend is still the one we want.
pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")

BLOCK_SIZE = 16
NUM_SLOTS = 4  # sequence slots S (unused ones are padding)
NUM_TOKENS = 128  # T
MAX_BLOCKS = 12  # MB: contexts up to 192 keys
NUM_BLOCKS = 64  # N: 48 at most in use, the rest poisoned


@dataclasses.dataclass(frozen=True)
class Config:
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None
    num_kv_splits: int | None = 1
    kv_pages_per_step: int | None = None
    block_q: int | None = None
    soft_cap: float | None = None  # Gemma 2's attention logit soft-capping
    sinks: bool = False  # GPT-OSS's per-head logit in the denominator (random, per head)
    value_dim: int | None = None  # latent rows (MLA): one cache, values = the keys' first value_dim lanes
    heads_per_program: int | None = None


# A pairwise cover of: GQA ratio 1/2/4/8 and non-power-of-two 3/7, MQA; head_dim 64/80/96/128;
# sliding window on/off; split-K off/2/3/4; one and several pages per KV step; tile sizes.
CONFIGS = [
    Config(4, 4, 64),
    Config(4, 2, 80, sliding_window=24, num_kv_splits=2, kv_pages_per_step=1),
    Config(8, 2, 96, num_kv_splits=3, kv_pages_per_step=4),
    Config(8, 1, 128, sliding_window=40, block_q=4),
    Config(16, 2, 64, sliding_window=17, num_kv_splits=4),
    Config(6, 2, 80, kv_pages_per_step=1, block_q=16),
    Config(7, 1, 64, num_kv_splits=2),
    Config(4, 1, 96, sliding_window=33, block_q=8),
    Config(2, 2, 128, num_kv_splits=3, block_q=64),
    Config(8, 4, 256, sliding_window=20, soft_cap=1.5),  # Gemma: head_dim 256, a window, capped scores
    Config(4, 2, 64, num_kv_splits=2, soft_cap=0.7),
    Config(8, 2, 64, sliding_window=16, sinks=True),  # GPT-OSS: sinks, on a window
    Config(4, 1, 64, num_kv_splits=3, sinks=True),  # split-K: the sink counted once, by split 0
    Config(7, 1, 64, heads_per_program=4),  # 2 head blocks per kv head, the second one 3 of 4 heads
    Config(8, 2, 64, heads_per_program=2, num_kv_splits=2, block_q=8),
    # MLA's latent rows: K = [latent, rope key], V = the latent; the q . k dot in two parts
    Config(16, 1, 80, value_dim=64),  # 64 + 16 lanes, all 16 heads in one program
    Config(32, 1, 80, value_dim=64, heads_per_program=8, num_kv_splits=3),  # 4 head blocks, split-K
    Config(12, 1, 48, value_dim=40, heads_per_program=4, kv_pages_per_step=1),  # 40 + 8 lanes, both padded
    Config(8, 2, 80, value_dim=64, sliding_window=19, num_kv_splits=2),  # GQA over latent rows, a window
]


@dataclasses.dataclass(frozen=True)
class Batch:
    q_lens: tuple[int, ...]  # per slot; 0 = padding slot
    context_lens: tuple[int, ...]  # tokens before the new queries; kv_len = context + q_len
    seed: int


@st.composite
def batches(draw):
    budget = NUM_TOKENS
    q_lens, context_lens = [], []
    active = draw(st.lists(st.booleans(), min_size=NUM_SLOTS, max_size=NUM_SLOTS))
    active[draw(st.integers(0, NUM_SLOTS - 1))] = True
    for is_active in active:
        if not is_active or budget == 0:
            q_lens.append(0)
            context_lens.append(0)
            continue
        q_len = draw(st.one_of(st.just(1), st.integers(1, min(64, budget))))
        budget -= q_len
        q_lens.append(q_len)
        context_lens.append(draw(st.integers(0, MAX_BLOCKS * BLOCK_SIZE - q_len)))
    return Batch(tuple(q_lens), tuple(context_lens), draw(st.integers(0, 2**31 - 1)))


def build_inputs(cfg: Config, batch: Batch, dtype=np.float32):
    """Random q and paged K/V on shuffled blocks, as (kernel inputs, reference inputs).

    Everything no valid output may read is NaN: padding rows of q, unused blocks, the tails of last
    pages (for both). Keys older than every query's window are NaN for the kernel only; the
    reference sees their clean values, which must not matter either.
    """
    rng = np.random.default_rng(batch.seed)
    hq, hkv, d = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
    q_lens = np.array(batch.q_lens, np.int32)
    kv_lens = np.where(q_lens > 0, q_lens + np.array(batch.context_lens, np.int32), 0)
    cu_q_lens = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)

    q = rng.standard_normal((NUM_TOKENS, hq, d)).astype(np.float32)
    q[cu_q_lens[-1]:] = np.nan  # padding tokens
    k = rng.standard_normal((NUM_BLOCKS, BLOCK_SIZE, hkv, d)).astype(np.float32)
    v = rng.standard_normal((NUM_BLOCKS, BLOCK_SIZE, hkv, d)).astype(np.float32)

    shuffled = list(rng.permutation(NUM_BLOCKS))
    block_tables = np.zeros((NUM_SLOTS, MAX_BLOCKS), np.int32)
    live = np.zeros((NUM_BLOCKS, BLOCK_SIZE), bool)
    out_of_window = np.zeros((NUM_BLOCKS, BLOCK_SIZE), bool)
    for s in range(NUM_SLOTS):
        num_pages = -(-int(kv_lens[s]) // BLOCK_SIZE)
        block_tables[s, :num_pages] = [shuffled.pop() for _ in range(num_pages)]
        first_query_pos = int(kv_lens[s]) - int(q_lens[s])
        for j in range(int(kv_lens[s])):
            page, slot = block_tables[s, j // BLOCK_SIZE], j % BLOCK_SIZE
            live[page, slot] = True
            if cfg.sliding_window is not None and j <= first_query_pos - cfg.sliding_window:
                out_of_window[page, slot] = True
    spare = shuffled or [0]
    for s in range(NUM_SLOTS):  # padded table entries point at poisoned blocks
        num_pages = -(-int(kv_lens[s]) // BLOCK_SIZE)
        block_tables[s, num_pages:] = rng.choice(spare, MAX_BLOCKS - num_pages)
    k[~live] = np.nan
    v[~live] = np.nan
    as_v = (lambda x: None) if cfg.value_dim is not None else (lambda x: x.astype(dtype))  # latent: no V cache
    metadata = dict(block_tables=block_tables, cu_q_lens=cu_q_lens,
                    kv_lens=kv_lens.astype(np.int32))
    reference_inputs = dict(q=q.astype(dtype), k_cache=k.astype(dtype), v_cache=as_v(v), **metadata)
    k[out_of_window] = np.nan
    v[out_of_window] = np.nan
    kernel_inputs = dict(reference_inputs, k_cache=k.astype(dtype), v_cache=as_v(v))
    return kernel_inputs, reference_inputs


def sinks_of(cfg: Config):
    """The per-head sinks of a config (None: off): large enough to take much of each row's mass."""
    if not cfg.sinks:
        return None
    return jnp.asarray(np.random.default_rng(cfg.num_q_heads).normal(0, 2, cfg.num_q_heads), jnp.float32)


def kernel_kwargs(cfg: Config):
    return dict(sm_scale=cfg.head_dim**-0.5, sliding_window=cfg.sliding_window, soft_cap=cfg.soft_cap,
                sinks=sinks_of(cfg), value_dim=cfg.value_dim, heads_per_program=cfg.heads_per_program,
                num_kv_splits=cfg.num_kv_splits, kv_pages_per_step=cfg.kv_pages_per_step,
                block_q=cfg.block_q)


def run_both(cfg: Config, kernel_inputs, reference_inputs):
    out = ragged_paged_attention(**kernel_inputs, **kernel_kwargs(cfg))
    out = np.asarray(out.astype(jnp.float32))
    ref = np.asarray(ragged_paged_attention_reference(
        **reference_inputs, sm_scale=cfg.head_dim**-0.5, sliding_window=cfg.sliding_window, soft_cap=cfg.soft_cap,
        sinks=sinks_of(cfg), value_dim=cfg.value_dim).astype(jnp.float32))
    return out, ref


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@settings(max_examples=40, deadline=None)
@given(batch=batches())
def test_kernel_matches_reference_fp32(cfg, batch):
    kernel_inputs, reference_inputs = build_inputs(cfg, batch)
    out, ref = run_both(cfg, kernel_inputs, reference_inputs)
    assert out.shape == ref.shape == (NUM_TOKENS, cfg.num_q_heads, cfg.value_dim or cfg.head_dim)
    assert np.isfinite(ref).all()
    assert np.isfinite(out).all()
    num_valid = int(kernel_inputs["cu_q_lens"][-1])
    np.testing.assert_array_equal(out[num_valid:], 0.0)  # padding tokens
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: d.__name__)
def test_kernel_matches_reference_half_precision(dtype):
    cfg = Config(8, 2, 128, num_kv_splits=2)
    batch = Batch(q_lens=(1, 37, 0, 5), context_lens=(150, 20, 0, 0), seed=3)
    kernel_inputs, reference_inputs = build_inputs(cfg, batch, dtype=dtype)
    assert ragged_paged_attention(**kernel_inputs, **kernel_kwargs(cfg)).dtype == dtype
    out, ref = run_both(cfg, kernel_inputs, reference_inputs)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, atol=2e-2, rtol=2e-2)


def test_auto_split_for_long_decode_matches_reference():
    cfg = Config(4, 2, 64, num_kv_splits=None)
    num_blocks, max_blocks = 80, 64  # one sequence slot with room for 1024 keys
    block_q = default_block_q(num_tokens=8, num_seqs=1, group=2)
    assert default_num_kv_splits(num_tokens=8, num_seqs=1, num_kv_heads=2,
                                 max_context=max_blocks * BLOCK_SIZE, block_q=block_q) > 1
    rng = np.random.default_rng(0)
    kv_len = 1000
    q = rng.standard_normal((8, 4, 64)).astype(np.float32)
    q[1:] = np.nan
    k = rng.standard_normal((num_blocks, BLOCK_SIZE, 2, 64)).astype(np.float32)
    v = rng.standard_normal((num_blocks, BLOCK_SIZE, 2, 64)).astype(np.float32)
    block_tables = rng.permutation(num_blocks)[:max_blocks][None].astype(np.int32)
    inputs = dict(q=q, k_cache=k, v_cache=v, block_tables=block_tables,
                  cu_q_lens=np.array([0, 1], np.int32), kv_lens=np.array([kv_len], np.int32))
    out, ref = run_both(cfg, inputs, inputs)
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(out[1:], 0.0)


def test_default_block_q_policy():
    assert default_block_q(64, 64, 1) == 16  # decode, MHA: M = 16 rows (Triton's minimum)
    assert default_block_q(64, 64, 8) == 2  # decode, GQA 8: 2 tokens x 8 heads
    assert default_block_q(2048, 16, 1) == 128  # prefill, MHA: M capped at 128
    assert default_block_q(2048, 16, 7) == 16  # prefill, GQA 7 -> 8 padded heads


def test_per_gpu_configuration():
    """Hopper (and no GPU target) keep M up to 128 rows and 64 keys per step for 16-bit q; Ampere-class GPUs
    cap M x Dp at 128 x 128, step 32 keys and use 8 warps from 64 x 128 (what gpu-compile found spill-free)."""
    assert default_block_q(64, 2, 8, head_dim=256, capability=90) == 16  # 128 rows
    assert default_block_q(64, 2, 8, head_dim=256, capability=80) == 8  # 64 rows x 256
    assert default_block_q(2048, 1, 1, head_dim=128, capability=80) == 128
    assert default_launch(128, 128, 2, 90) == (64, 8)
    assert default_launch(64, 128, 2, 90) == (64, 4)
    assert default_launch(64, 128, 2, None) == (64, 4)  # interpret mode / no GPU target: Hopper's
    assert default_launch(64, 128, 4, 90) == (32, 4)  # float32 q
    assert default_launch(64, 128, 2, 80) == (32, 8)
    assert default_launch(16, 128, 2, 80) == (32, 4)
    assert default_launch(16, 128, 2, 89) == (32, 4)  # Ada: mma.sync like Ampere


def test_latent_rows_configuration():
    """MLA's 512-lane accumulator: at most 32 rows (x 512) on every GPU and 8 warps on Hopper even at 16 rows
    (what gpu-compile found spill-free); the heads of one latent row split into head blocks when they overflow."""
    assert default_heads_per_program(16, 512, 90) == 16  # V2-Lite: all 16 heads in one program
    assert default_heads_per_program(128, 512, 90) == 32  # V3: 4 head blocks
    assert default_heads_per_program(128, 512, 80) == 32
    assert default_heads_per_program(8, 128, 90) == 8  # plain GQA: the whole group, as before
    assert default_heads_per_program(7, 128, None) == 8
    assert default_block_q(512, 16, 16, head_dim=512, capability=90) == 2  # 2 tokens x 16 heads = 32 rows
    assert default_block_q(8, 8, 128, head_dim=512, capability=90) == 1
    assert default_launch(16, 512, 2, 90) == (64, 8)
    assert default_launch(32, 512, 2, 80) == (32, 8)


@pytest.mark.parametrize("kind, capability", [("NVIDIA A100-SXM4-80GB", 80), ("NVIDIA H200", 90),
                                              ("NVIDIA L4", 89), ("NVIDIA H100 80GB HBM3", 90)])
def test_compile_target_comes_from_the_abstract_mesh(kind, capability):
    """A compile without a GPU names its target by the abstract mesh's device kind (as Pallas's lowering reads it)."""
    device = jax.sharding.AbstractDevice(device_kind=kind, num_cores=100, platform="gpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)):
        assert gpu_target.gpu_compute_capability() == capability
    assert gpu_target.gpu_compute_capability() is None  # this machine has no GPU


def test_default_num_kv_splits_policy():
    assert default_num_kv_splits(64, 64, 8, 16384, 16) == 1  # many sequences: grid already full
    assert default_num_kv_splits(1, 1, 8, 256, 16) == 1  # short contexts: nothing to split
    assert 1 < default_num_kv_splits(1, 1, 8, 16384, 16) <= 16


def dense_causal_attention(q, k, v, sm_scale, sliding_window=None, soft_cap=None, sinks=None):
    """One sequence, contiguous K/V, in float64 numpy loops: q [L_q, Hq, D], k/v [L, Hkv, D]; ``sinks`` [Hq]:
    one more term ``exp(sink)`` in each softmax's denominator."""
    q_len, num_q_heads, _ = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = num_q_heads // num_kv_heads
    out = np.zeros((*q.shape[:2], v.shape[-1]), np.float64)
    for h in range(num_q_heads):
        for i in range(q_len):
            pos = kv_len - q_len + i
            lo = 0 if sliding_window is None else max(0, pos - sliding_window + 1)
            keys = k[lo:pos + 1, h // group].astype(np.float64)
            scores = keys @ q[i, h].astype(np.float64) * sm_scale
            if soft_cap is not None:
                scores = soft_cap * np.tanh(scores / soft_cap)
            top = scores.max() if sinks is None else max(scores.max(), sinks[h])
            weights = np.exp(scores - top)
            denom = weights.sum() + (0.0 if sinks is None else np.exp(sinks[h] - top))
            out[i, h] = weights @ v[lo:pos + 1, h // group] / denom
    return out


@pytest.mark.parametrize("sliding_window, soft_cap, with_sinks, value_dim", [
    (None, None, False, None), (21, None, False, None), (None, 0.8, False, None), (21, None, True, None),
    (None, None, False, 24)])  # latent rows: the values are the keys' first 24 lanes
def test_reference_matches_dense_attention(sliding_window, soft_cap, with_sinks, value_dim):
    rng = np.random.default_rng(1)
    kv_len, q_len, hq, hkv, d, num_blocks = 70, 9, 4, 2, 32, 10
    q = rng.standard_normal((q_len, hq, d)).astype(np.float32)
    k = rng.standard_normal((kv_len, hkv, d)).astype(np.float32)
    v = rng.standard_normal((kv_len, hkv, d)).astype(np.float32)
    if value_dim is not None:
        v = k[..., :value_dim]
    sinks = rng.normal(0, 2, hq).astype(np.float32) if with_sinks else None
    expected = dense_causal_attention(q, k, v, d**-0.5, sliding_window, soft_cap, sinks)

    pages = rng.permutation(num_blocks)[:5]  # 70 keys -> 5 pages of 16, scattered
    k_cache = np.full((num_blocks, BLOCK_SIZE, hkv, d), np.nan, np.float32)
    v_cache = np.full((num_blocks, BLOCK_SIZE, hkv, v.shape[-1]), np.nan, np.float32)
    for j in range(kv_len):
        k_cache[pages[j // BLOCK_SIZE], j % BLOCK_SIZE] = k[j]
        v_cache[pages[j // BLOCK_SIZE], j % BLOCK_SIZE] = v[j]
    q_padded = np.concatenate([q, np.full((3, hq, d), np.nan, np.float32)])
    block_tables = np.stack([np.concatenate([pages, [0, 0]]), np.zeros(7)]).astype(np.int32)
    got = np.asarray(ragged_paged_attention_reference(
        q_padded, k_cache, None if value_dim else v_cache, block_tables, np.array([0, q_len, q_len], np.int32),
        np.array([kv_len, 0], np.int32), sm_scale=d**-0.5, sliding_window=sliding_window, soft_cap=soft_cap,
        sinks=None if sinks is None else jnp.asarray(sinks), value_dim=value_dim))
    assert got.shape == (q_len + 3, hq, value_dim or d)
    np.testing.assert_allclose(got[:q_len], expected, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(got[q_len:], 0.0)


def _shapes(t, hq, hkv, d, n, mb, s, dtype):
    cache = jax.ShapeDtypeStruct((n, BLOCK_SIZE, hkv, d), dtype)
    return (jax.ShapeDtypeStruct((t, hq, d), dtype), cache, cache,
            jax.ShapeDtypeStruct((s, mb), jnp.int32), jax.ShapeDtypeStruct((s + 1,), jnp.int32),
            jax.ShapeDtypeStruct((s,), jnp.int32))


def _lower_for_cuda(shapes, **kwargs):
    """Runs the real Triton lowering on CPU; jax >= 0.11 asks which GPU to target (an H200 here)."""
    fn = functools.partial(ragged_paged_attention, interpret=False, **kwargs)
    h200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=h200)
    with jax.sharding.use_abstract_mesh(mesh):
        lowered = jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
    assert "triton" in lowered.as_text().lower()


@pytest.mark.parametrize("num_kv_splits", [1, 4])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=lambda d: d.__name__)
def test_cross_lowers_for_cuda(dtype, head_dim, num_kv_splits):
    _lower_for_cuda(_shapes(64, 8, 2, head_dim, 64, 32, 8, dtype), sm_scale=head_dim**-0.5,
                    num_kv_splits=num_kv_splits)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_fuzzed_configs_cross_lower_for_cuda(cfg):
    q, k, v, *rest = _shapes(NUM_TOKENS, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, NUM_BLOCKS, MAX_BLOCKS,
                             NUM_SLOTS, jnp.float32)
    _lower_for_cuda((q, k, None if cfg.value_dim else v, *rest), **kernel_kwargs(cfg))


@pytest.mark.parametrize("shape", [
    dict(t=1, hq=32, hkv=8, d=128, n=4096, mb=512, s=1),  # batch-1 decode, 8k context: split-K
    dict(t=64, hq=32, hkv=32, d=128, n=4096, mb=128, s=64),  # decode batch, MHA
    dict(t=2048, hq=28, hkv=4, d=128, n=4096, mb=256, s=16),  # chunked prefill, GQA 7
    dict(t=256, hq=14, hkv=2, d=64, n=1024, mb=64, s=8),  # Qwen2.5-0.5B-like
], ids=lambda s: "t{t}-hq{hq}-hkv{hkv}-d{d}".format(**s))
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: d.__name__)
def test_model_shapes_cross_lower_for_cuda(shape, dtype):
    _lower_for_cuda(_shapes(**shape, dtype=dtype), sm_scale=0.1, sliding_window=4096)


@pytest.mark.parametrize("heads, splits", [(16, 1), (128, 1), (16, 4)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=lambda d: d.__name__)
def test_latent_rows_cross_lower_for_cuda(dtype, heads, splits):
    """DeepSeek's real rows: 512 latent + 64 rope lanes, one cache, V2-Lite's 16 and V3's 128 heads."""
    q, cache, _, *rest = _shapes(64, heads, 1, 576, 256, 32, 8, dtype)
    _lower_for_cuda((q, cache, None, *rest), sm_scale=0.1, value_dim=512, num_kv_splits=splits)


@pytest.mark.parametrize("change, message", [
    (dict(q=np.zeros((4, 8), np.float32)), "q must be"),
    (dict(v_cache=np.zeros((8, 16, 1, 32), np.float32)), "v_cache shape"),
    (dict(q=np.zeros((4, 4, 32), np.float16)), "share a dtype"),
    (dict(q=np.zeros((4, 3, 32), np.float32)), "multiple of Hkv"),
    (dict(q=np.zeros((4, 4, 16), np.float32)), "head_dim of q"),
    (dict(kv_lens=np.zeros((3,), np.int32)), "need S"),
    (dict(cu_q_lens=np.zeros((3,), np.float32)), "integer"),
    (dict(sm_scale=-1.0), "sm_scale"),
    (dict(sliding_window=0), "sliding_window"),
    (dict(block_q=3), "block_q"),
    (dict(block_q=4), "block_q"),  # 4 tokens x 2 heads < 16 rows
    (dict(kv_pages_per_step=3), "kv_pages_per_step"),
    (dict(num_kv_splits=0), "num_kv_splits"),
    (dict(heads_per_program=3), "heads_per_program"),
    (dict(v_cache=None), "give value_dim"),
    (dict(value_dim=16), "latent rows only"),
    (dict(v_cache=None, value_dim=32), "value_dim must be"),
    (dict(q=np.zeros((4, 4, 288), np.float32), k_cache=np.zeros((8, 16, 2, 288), np.float32),
          v_cache=np.zeros((8, 16, 2, 288), np.float32)), "head_dim 288 > 256"),
    (dict(q=np.zeros((4, 4, 1088), np.float32), k_cache=np.zeros((8, 16, 2, 1088), np.float32), v_cache=None,
          value_dim=1024), "at most 512"),
])
def test_rejects_bad_arguments(change, message):
    args = dict(q=np.zeros((4, 4, 32), np.float32), k_cache=np.zeros((8, 16, 2, 32), np.float32),
                v_cache=np.zeros((8, 16, 2, 32), np.float32),
                block_tables=np.zeros((2, 4), np.int32), cu_q_lens=np.array([0, 2, 4], np.int32),
                kv_lens=np.array([2, 2], np.int32), sm_scale=0.1)
    args.update(change)
    with pytest.raises(ValueError, match=message):
        ragged_paged_attention(**args)


# ----------------------------------------------------------------------------------------------
# FP8 KV cache (kv_cache_dtype="fp8"): e4m3 K/V, float q
# ----------------------------------------------------------------------------------------------


def _fp8_shapes(t, hq, hkv, d, n, mb, s, dtype):
    q, cache, _, *rest = _shapes(t, hq, hkv, d, n, mb, s, dtype)
    fp8 = jax.ShapeDtypeStruct(cache.shape, jnp.float8_e4m3fn)
    return (q, fp8, fp8, *rest)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=lambda d: d.__name__)
def test_fp8_cache_matches_reference(dtype):
    cfg = Config(8, 2, 64, num_kv_splits=2)
    batch = Batch(q_lens=(1, 37, 0, 5), context_lens=(150, 20, 0, 0), seed=5)
    kernel_inputs, reference_inputs = build_inputs(cfg, batch, dtype=dtype)
    for inputs in (kernel_inputs, reference_inputs):
        for name in ("k_cache", "v_cache"):
            inputs[name] = jnp.asarray(inputs[name]).astype(jnp.float8_e4m3fn)
    out = ragged_paged_attention(**kernel_inputs, **kernel_kwargs(cfg))
    assert out.dtype == dtype
    out, ref = run_both(cfg, kernel_inputs, reference_inputs)
    assert np.isfinite(out).all()
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(out, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: d.__name__)
def test_fp8_cache_cross_lowers_for_cuda(dtype):
    _lower_for_cuda(_fp8_shapes(64, 8, 2, 128, 64, 32, 8, dtype), sm_scale=0.1, num_kv_splits=2)
    _lower_for_cuda(_fp8_shapes(1, 32, 8, 128, 4096, 512, 1, dtype), sm_scale=0.1)


def test_fp8_cache_needs_fp8_for_both_caches():
    q = np.zeros((4, 4, 32), np.float32)
    k = jnp.zeros((8, 16, 2, 32), jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="share a dtype"):
        ragged_paged_attention(q, k, np.zeros((8, 16, 2, 32), np.float32), np.zeros((2, 4), np.int32),
                               np.array([0, 2, 4], np.int32), np.array([2, 2], np.int32), sm_scale=0.1)


@pytest.mark.parametrize("cfg", [Config(16, 1, 576, value_dim=512),  # DeepSeek-V2-Lite's layer
                                 Config(128, 1, 576, value_dim=512, num_kv_splits=2)],  # V3's 128 heads, split-K
                         ids=["v2-lite", "v3"])
def test_latent_rows_at_deepseek_shapes_match_reference(cfg):
    """The real latent row (512 + 64 lanes) through the automatic launch (head blocks for V3's 128 heads)."""
    batch = Batch(q_lens=(1, 5, 0, 1), context_lens=(40, 20, 0, 7), seed=11)
    kernel_inputs, reference_inputs = build_inputs(cfg, batch)
    out, ref = run_both(cfg, kernel_inputs, reference_inputs)
    assert out.shape == (NUM_TOKENS, cfg.num_q_heads, 512)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)
