"""Property-based fuzz of the block manager and unit tests of its prefix cache (no model, no JAX)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxinfer.core.block_manager import BlockManager, chain_hash
from jaxinfer.core.sequence import Sequence
from jaxinfer.sampling_params import SamplingParams

BS = 4


def _seq(i, tokens, salt=None):
    return Sequence(i, f"r{i}", 0, tokens, SamplingParams(), seed=0, arrival_time=float(i), cache_salt=salt)


def _admit(bm, seq):
    cached = bm.find_cached_prefix(seq)
    ok = bm.admit(seq, cached, seq.num_tokens)
    if ok:
        seq.num_computed_tokens = seq.num_tokens
        bm.cache_computed_blocks(seq)
    return ok, len(cached)


ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "append", "fork", "free", "truncate"]),
        st.integers(0, 7),  # which live sequence / which prefix family
        st.integers(1, 13),  # a length
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, num_blocks=st.integers(2, 24), caching=st.booleans())
def test_random_operations_keep_invariants(ops, num_blocks, caching):
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching)
    families = [[f * 100 + j for j in range(40)] for f in range(4)]  # shared prefixes
    live: list[Sequence] = []
    next_id = 0
    for op, a, n in ops:
        if op == "admit":
            seq = _seq(next_id, families[a % 4][: n + a])
            next_id += 1
            if _admit(bm, seq)[0]:
                live.append(seq)
        elif op == "fork" and live:
            parent = live[a % len(live)]
            seq = _seq(next_id, parent.token_ids[: max(1, parent.num_tokens - n % 3)])
            next_id += 1
            if _admit(bm, seq)[0]:
                live.append(seq)
        elif op == "append" and live:
            seq = live[a % len(live)]
            if bm.grow(seq, seq.num_tokens + n):
                seq.token_ids += [7] * n
                seq.num_computed_tokens = seq.num_tokens
                bm.cache_computed_blocks(seq)
        elif op == "truncate" and live:
            seq = live[a % len(live)]
            keep = max(1, seq.num_tokens - n)
            try:
                bm.truncate(seq, keep)
            except RuntimeError as e:  # truncating into a block shared through the cache: refused intact
                assert "shared" in str(e)
                continue
            del seq.token_ids[keep:]
            seq.num_computed_tokens = keep
            seq.block_hashes = seq.block_hashes[: keep // BS]
        elif op == "free" and live:
            bm.free_sequence(live.pop(a % len(live)))
        bm.check_invariants()
        owned = [b for s in live for b in s.block_ids]
        # a block is owned by several sequences only when shared through the cache, and then its
        # ref count says so
        for b in set(owned):
            assert bm.ref_counts[b] == owned.count(b)
        assert 0 not in owned
        assert bm.num_free_blocks + len(set(owned)) == num_blocks - 1
    for seq in live:
        bm.free_sequence(seq)
    bm.check_invariants()
    assert bm.num_free_blocks == num_blocks - 1
    assert not bm.pending


def test_prefix_hit_and_last_token_recomputed():
    bm = BlockManager(16, BS)
    a = _seq(0, list(range(10)))
    assert _admit(bm, a) == (True, 0)
    b = _seq(1, list(range(10)) + [99])
    ok, hits = _admit(bm, b)
    assert ok and hits == 2  # 8 of 11 tokens (two full blocks)
    assert b.block_ids[:2] == a.block_ids[:2]
    full_hit = _seq(2, list(range(8)))  # exactly two full cached blocks
    ok, hits = _admit(bm, full_hit)
    assert ok and hits == 1  # the last token is always recomputed, so the 2nd block is not taken
    assert bm.hit_tokens == 0  # record_query is the scheduler's job
    bm.check_invariants()


def test_cache_salt_isolates_tenants():
    bm = BlockManager(16, BS)
    assert _admit(bm, _seq(0, list(range(12)), salt="tenant-a"))[0]
    assert _admit(bm, _seq(1, list(range(12)), salt="tenant-b"))[1] == 0
    assert _admit(bm, _seq(2, list(range(12)), salt="tenant-a"))[1] == 2


def test_freed_blocks_stay_cached_until_evicted_lru():
    bm = BlockManager(5, BS)  # 4 usable blocks
    a = _seq(0, list(range(8)))
    _admit(bm, a)
    bm.free_sequence(a)
    assert bm.num_free_blocks == 4  # cached but free
    assert _admit(bm, _seq(1, list(range(8)) + [5]))[1] == 2  # still hits after being freed
    bm2 = BlockManager(3, BS)  # 2 usable blocks
    x = _seq(0, list(range(8)))
    _admit(bm2, x)
    bm2.free_sequence(x)
    y = _seq(1, [50, 51, 52, 53, 54, 55, 56, 57])  # needs both blocks: evicts x's
    assert _admit(bm2, y) == (True, 0)
    assert bm2.num_evictions == 2
    bm2.free_sequence(y)
    assert _admit(bm2, _seq(2, list(range(8)) + [1]))[1] == 0


def test_chain_hash_depends_on_parent_tokens_and_salt():
    h1 = chain_hash(None, [1, 2, 3, 4], None)
    assert chain_hash(None, [1, 2, 3, 4], None) == h1
    assert chain_hash(h1, [1, 2, 3, 4], None) != h1
    assert chain_hash(None, [1, 2, 3, 5], None) != h1
    assert chain_hash(None, [1, 2, 3, 4], "s") != h1
