"""The XLA attention path against the kernel module's plain-jnp reference, on mixed prefill/decode batches,
with block tables padded to their full width (as the engine lays them out). Every case is checked both ways:
by the XLA loops and by the C++ kernels the CPU uses (``cpu_kernel``: single queries and short query runs by the
paged attention kernel, longer runs by the ragged attention kernel)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.model.attention import num_query_blocks, xla_ragged_paged_attention
from pallas_kernels.ragged_paged_attention import ragged_paged_attention_reference

SHORT_QUERIES = pytest.mark.parametrize("cpu_kernel", [False, True], ids=["xla-loop", "cpu-kernel"])


def _case(seed, q_lens, kv_extra, hq=4, hkv=2, d=16, bs=4, num_blocks=64, pad_seqs=2, pad_tokens=5, extra_cols=3):
    rng = np.random.default_rng(seed)
    kv_lens = [q + e for q, e in zip(q_lens, kv_extra)]
    perm = rng.permutation(np.arange(1, num_blocks))
    mb = max(-(-k // bs) for k in kv_lens) + extra_cols  # wider than any context: the table's full width
    tables = np.zeros((len(q_lens) + pad_seqs, mb), np.int32)
    used = 0
    for i, k in enumerate(kv_lens):
        n = -(-k // bs)
        tables[i, :n] = perm[used : used + n]
        used += n
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    cu = np.concatenate([cu, np.full(pad_seqs, cu[-1], np.int32)])
    T = int(cu[-1]) + pad_tokens
    q = jnp.asarray(rng.normal(size=(T, hq, d)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(num_blocks, bs, hkv, d)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(num_blocks, bs, hkv, d)), jnp.float32)
    return q, k, v, jnp.asarray(tables), jnp.asarray(cu), jnp.asarray(kv_lens + [0] * pad_seqs, jnp.int32)


def _check(got, q, k, v, tables, cu, kv, window):
    want = ragged_paged_attention_reference(q, k, v, tables, cu, kv, sm_scale=0.25, sliding_window=window)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    assert np.all(np.asarray(got)[int(cu[-1]):] == 0)


CASES = [
    ([7, 3, 1, 1, 1], [0, 9, 20, 3, 0]),  # two chunks then decodes
    ([1, 9, 1], [30, 5, 1]),  # a run between decodes
    ([1, 1, 1, 1], [4, 17, 0, 8]),  # decode only
    ([5, 12], [0, 3]),  # runs only
    ([70, 2, 1], [0, 33, 9]),  # a run of several query blocks
]


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("q_lens, kv_extra", CASES)
@SHORT_QUERIES
def test_mixed_step_matches_reference(q_lens, kv_extra, window, cpu_kernel):
    q, k, v, tables, cu, kv = _case(len(q_lens), q_lens, kv_extra)
    got = xla_ragged_paged_attention(q, k, v, tables, cu, kv, cpu_kernel=cpu_kernel,
                                     sm_scale=0.25, query_width=None, sliding_window=window,
                                     prefill_q_block=16, prefill_k_block=8)
    _check(got, q, k, v, tables, cu, kv, window)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("q_lens, kv_extra", [c for c in CASES if max(c[0]) <= 12])
@SHORT_QUERIES
def test_short_query_step_matches_reference(q_lens, kv_extra, window, cpu_kernel):
    """A step whose runs are at most W queries (verification of W - 1 drafts) through the short-query loop."""
    q, k, v, tables, cu, kv = _case(len(q_lens), q_lens, kv_extra)
    got = xla_ragged_paged_attention(q, k, v, tables, cu, kv, cpu_kernel=cpu_kernel,
                                     sm_scale=0.25, query_width=max(q_lens) + 1,
                                     sliding_window=window)
    _check(got, q, k, v, tables, cu, kv, window)


@pytest.mark.parametrize("window", [None, 11])
@pytest.mark.parametrize("chunk_bytes", [1, 4 * 3072, 1 << 30])  # chunks of 1 block, of 4, one chunk
def test_decodes_visit_long_contexts_in_chunks_exactly(chunk_bytes, window):
    q_lens, kv_extra = [1, 1, 1, 1], [70, 3, 0, 45]  # up to 18 blocks of 4: many chunks, some empty
    q, k, v, tables, cu, kv = _case(7, q_lens, kv_extra, num_blocks=64)
    got = xla_ragged_paged_attention(q, k, v, tables, cu, kv, sm_scale=0.25, query_width=1, sliding_window=window,
                                     decode_chunk_bytes=chunk_bytes)
    _check(got, q, k, v, tables, cu, kv, window)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("q_block, k_block", [(1, 4), (4, 8), (3, 12), (16, 1 << 10)])  # ragged, skipping, one block
def test_query_blocks_are_exact(q_block, k_block, window):
    q_lens, kv_extra = [13, 16, 1, 1], [0, 21, 5, 0]  # a fresh prompt, a chunk after a prefix, two decodes
    q, k, v, tables, cu, kv = _case(11, q_lens, kv_extra, num_blocks=64)
    got = xla_ragged_paged_attention(q, k, v, tables, cu, kv, sm_scale=0.25, sliding_window=window,
                                     prefill_q_block=q_block, prefill_k_block=k_block)
    _check(got, q, k, v, tables, cu, kv, window)


def test_query_block_bound_holds_for_the_worst_layout():
    """Every run of two queries (the most partial blocks per token) still fits the static bound."""
    q_lens = [2] * 8 + [1] * 3
    q, k, v, tables, cu, kv = _case(3, q_lens, [1] * len(q_lens), num_blocks=64, pad_tokens=0, pad_seqs=0)
    assert num_query_blocks(q.shape[0], len(q_lens), 64) >= 8
    got = xla_ragged_paged_attention(q, k, v, tables, cu, kv, sm_scale=0.25, prefill_q_block=64)
    _check(got, q, k, v, tables, cu, kv, None)


def _poison(k, v, tables, skipped):
    """K/V where a spare block is NaN and block-table entries ``skipped`` [S, MB] point at it: a computed
    block with NaN values poisons the output (0 x NaN = NaN), so a finite, correct output proves those
    blocks were never visited, not merely masked."""
    spare = sorted(set(range(1, k.shape[0])) - set(np.asarray(tables).ravel().tolist()))[0]
    nan = jnp.full(k.shape[1:], jnp.nan, k.dtype)
    return k.at[spare].set(nan), v.at[spare].set(nan), jnp.where(jnp.asarray(skipped), spare, tables)


@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.parametrize("q_lens, kv_extra, width", [
    ([1, 1, 1], [30, 41, 37], 1),  # decodes; kv_lens 31, 42, 38: 8, 11, 10 blocks of 4
    ([3, 5, 1], [28, 37, 37], 8),  # two sequences verifying drafts, one decode
])
@SHORT_QUERIES
def test_short_query_chunks_no_query_needs_are_never_visited(window, q_lens, kv_extra, width, cpu_kernel):
    """The table's full width past every context, and with a sliding window the blocks before every query's
    window: those chunks are never computed."""
    q, k, v, tables, cu, kv = _case(5, q_lens, kv_extra, num_blocks=64, pad_seqs=0, extra_cols=0)
    wide = jnp.pad(tables, ((0, 0), (0, 5)))
    block_start = 4 * np.arange(wide.shape[1])[None, :]
    skipped = np.broadcast_to(block_start >= 4 * tables.shape[1], wide.shape)
    if window is not None:  # keys before 23 (31 - 9 + 1) or 20 (28 - 9 + 1) are outside every window: blocks 0-4
        skipped = skipped | (block_start + 4 <= 20)
    k2, v2, wide = _poison(k, v, wide, skipped)
    one_block = 3 * 4 * 2 * 16 * 4  # bytes of one gathered block column: chunks of one block
    got = xla_ragged_paged_attention(q, k2, v2, wide, cu, kv, cpu_kernel=cpu_kernel,
                                     sm_scale=0.25, query_width=width,
                                     sliding_window=window, decode_chunk_bytes=one_block)
    want = ragged_paged_attention_reference(q, k, v, tables, cu, kv, sm_scale=0.25, sliding_window=window)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


@SHORT_QUERIES
def test_a_slot_that_sees_nothing_does_not_widen_the_visited_range(cpu_kernel):
    """A draft row sitting a proposal round out has one query and kv_len 0: it sees no key, yields zeros,
    and does not pull the first visited chunk back to the start of the context."""
    q_lens, kv_extra = [1, 1, 1], [30, 41, 0]
    q, k, v, tables, cu, kv = _case(5, q_lens, kv_extra, num_blocks=64, pad_seqs=0, extra_cols=0)
    kv = kv.at[2].set(0)
    block_start = 4 * np.arange(tables.shape[1])[None, :]
    skipped = np.broadcast_to(block_start + 4 <= 31 - 9 + 1, tables.shape)  # before both live windows
    k2, v2, tables2 = _poison(k, v, tables, skipped)
    got = xla_ragged_paged_attention(q, k2, v2, tables2, cu, kv, cpu_kernel=cpu_kernel,
                                     sm_scale=0.25, query_width=1, sliding_window=9,
                                     decode_chunk_bytes=3 * 4 * 2 * 16 * 4)
    want = ragged_paged_attention_reference(q[:2], k, v, tables[:2], cu[:3], kv[:2], sm_scale=0.25, sliding_window=9)
    np.testing.assert_allclose(np.asarray(got)[:2], np.asarray(want), atol=1e-5, rtol=1e-5)
    assert np.all(np.asarray(got)[2:] == 0)


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("q_block, k_block", [(4, 8), (16, 4)])
@SHORT_QUERIES
def test_query_blocks_never_visit_keys_no_query_of_the_block_sees(q_block, k_block, window, cpu_kernel):
    """Keys past a block's last query (the causal half and the table's padding) and before its first query's
    window are never computed: blocks poisoned there leave the output exact."""
    q_lens, kv_extra = [13, 16, 1], [0, 21, 5]
    q, k, v, tables, cu, kv = _case(11, q_lens, kv_extra, num_blocks=64, pad_seqs=0, extra_cols=0)
    wide = jnp.pad(tables, ((0, 0), (0, 6)))  # keys 40..63: past every query
    skipped = np.broadcast_to(np.arange(wide.shape[1])[None, :] >= tables.shape[1], wide.shape).copy()
    if window is not None:  # sequence 1's queries sit at 21..36: keys before 15 are outside every window,
        keys = max(k_block, 4)  # and whole key blocks before the one holding key 15 are never visited
        skipped[1, : (21 - window + 1) // keys * keys // 4] = True
    k2, v2, wide = _poison(k, v, wide, skipped)
    got = xla_ragged_paged_attention(q, k2, v2, wide, cu, kv, cpu_kernel=cpu_kernel,
                                     sm_scale=0.25, sliding_window=window,
                                     prefill_q_block=q_block, prefill_k_block=k_block,
                                     decode_chunk_bytes=4 * 2 * 16 * 4)  # the decode slot: one-block chunks
    want = ragged_paged_attention_reference(q, k, v, tables, cu, kv, sm_scale=0.25, sliding_window=window)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("q_lens, kv_extra, width", [(*c, None) for c in CASES] +  # mixed steps
                         [(*c, max(c[0]) + 1) for c in CASES if max(c[0]) <= 12])  # short-query steps
def test_soft_capped_scores_match_reference(q_lens, kv_extra, width, window):
    """Gemma 2's cap * tanh(score / cap), in both loops (mixed steps and short-query steps): the reference's
    capped softmax. A capped call never takes the C++ kernels, which do not cap (asked for, they are skipped)."""
    q, k, v, tables, cu, kv = _case(len(q_lens), q_lens, kv_extra)
    got = xla_ragged_paged_attention(q, k, v, tables, cu, kv, cpu_kernel=True, sm_scale=0.25, query_width=width,
                                     sliding_window=window, prefill_q_block=16, prefill_k_block=8, soft_cap=0.9)
    want = ragged_paged_attention_reference(q, k, v, tables, cu, kv, sm_scale=0.25, sliding_window=window,
                                            soft_cap=0.9)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    uncapped = ragged_paged_attention_reference(q, k, v, tables, cu, kv, sm_scale=0.25, sliding_window=window)
    assert np.abs(np.asarray(uncapped) - np.asarray(want)).max() > 1e-2  # the cap changes the result


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("q_lens, kv_extra, width", [(*c, None) for c in CASES] +  # mixed steps
                         [(*c, max(c[0]) + 1) for c in CASES if max(c[0]) <= 12])  # short-query steps
def test_attention_sinks_match_reference(q_lens, kv_extra, width, window):
    """GPT-OSS's per-head sink logits in both loops (mixed and short-query steps): the reference's softmax with
    one more term per head. The C++ kernels have no sinks, so a call with sinks never takes them."""
    q, k, v, tables, cu, kv = _case(len(q_lens) + 7, q_lens, kv_extra)
    sinks = jnp.asarray(np.random.default_rng(3).normal(0, 2, q.shape[1]), jnp.float32)
    got = xla_ragged_paged_attention(q, k, v, tables, cu, kv, cpu_kernel=True, sm_scale=0.25, query_width=width,
                                     sliding_window=window, prefill_q_block=16, prefill_k_block=8, sinks=sinks)
    want = ragged_paged_attention_reference(q, k, v, tables, cu, kv, sm_scale=0.25, sliding_window=window,
                                            sinks=sinks)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    assert np.all(np.asarray(got)[int(cu[-1]):] == 0)
    plain = ragged_paged_attention_reference(q, k, v, tables, cu, kv, sm_scale=0.25, sliding_window=window)
    assert np.abs(np.asarray(plain) - np.asarray(want)).max() > 1e-2  # the sinks change the result


@pytest.mark.parametrize("query_width", [None, 1])
@SHORT_QUERIES
def test_latent_rows_match_reference(query_width, cpu_kernel):
    """MLA's latent rows (v_cache=None): the values are the first 12 of the 16 lanes of each key row; one MQA head
    read by 8 query heads; the result has the value lanes only."""
    q_lens, kv_extra = ([7, 1, 12, 1], [0, 9, 3, 20]) if query_width is None else ([1, 1, 1], [4, 17, 30])
    q, k, _, tables, cu, kv = _case(13, q_lens, kv_extra, hq=8, hkv=1)
    got = xla_ragged_paged_attention(q, k, None, tables, cu, kv, cpu_kernel=cpu_kernel, sm_scale=0.25,
                                     query_width=query_width, value_dim=12, prefill_q_block=8, prefill_k_block=8)
    want = ragged_paged_attention_reference(q, k, None, tables, cu, kv, sm_scale=0.25, value_dim=12)
    assert got.shape == (q.shape[0], 8, 12)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    dense_v = ragged_paged_attention_reference(q, k, k, tables, cu, kv, sm_scale=0.25)  # the whole row as values
    np.testing.assert_allclose(np.asarray(got), np.asarray(dense_v)[..., :12], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="latent rows"):
        xla_ragged_paged_attention(q, k, None, tables, cu, kv, sm_scale=0.25)
