"""KV-cache events of the block manager (no model, no JAX): what is stored, evicted, truncated and cleared, and
a fuzz that rebuilds the cached-hash set from the events alone after every operation."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxinfer.core.block_manager import BlockManager
from jaxinfer.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventRecorder, replay
from jaxinfer.core.sequence import Sequence
from jaxinfer.sampling_params import SamplingParams

BS = 4


def _seq(i, tokens, salt=None):
    return Sequence(i, f"r{i}", 0, tokens, SamplingParams(), seed=0, arrival_time=float(i), cache_salt=salt)


def _bm(num_blocks=16):
    rec = KVEventRecorder()
    return BlockManager(num_blocks, BS, events=rec), rec


def _admit(bm, seq, computed=None):
    cached = bm.find_cached_prefix(seq)
    assert bm.admit(seq, cached, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens if computed is None else computed
    bm.cache_computed_blocks(seq)
    return len(cached)


def test_recorder_take_empties_it():
    rec = KVEventRecorder()
    rec.append(AllBlocksCleared())
    assert len(rec) == 1 and rec.take() == [AllBlocksCleared()]
    assert len(rec) == 0 and not rec and rec.take() == [] and rec.num_recorded == 1


def test_no_recorder_no_events_and_same_behaviour():
    bm = BlockManager(16, BS)
    a = _seq(0, list(range(10)))
    _admit(bm, a)
    assert bm.events is None and len(bm.cached) == 2


def test_consecutive_new_blocks_are_one_stored_event_with_their_tokens():
    bm, rec = _bm()
    a = _seq(0, list(range(10)))
    _admit(bm, a)
    assert rec.take() == [BlockStored(tuple(a.block_hashes[:2]), None, tuple(range(8)), BS)]
    # a sequence that hits both blocks and computes a third: stored with the second as parent
    b = _seq(1, list(range(13)))
    assert _admit(bm, b) == 2
    assert rec.take() == [BlockStored((b.block_hashes[2],), b.block_hashes[1], tuple(range(8, 12)), BS)]
    assert replay([BlockStored(tuple(a.block_hashes[:2]), None, (), BS)] +
                  [BlockStored((b.block_hashes[2],), None, (), BS)]) == set(bm.cached)


def test_chunked_prefill_stores_each_chunk_once():
    bm, rec = _bm()
    a = _seq(0, list(range(13)))
    _admit(bm, a, computed=5)
    assert rec.take() == [BlockStored((a.block_hashes[0],), None, (0, 1, 2, 3), BS)]
    a.num_computed_tokens = 13
    bm.cache_computed_blocks(a)
    bm.cache_computed_blocks(a)  # again: nothing new
    assert rec.take() == [BlockStored(tuple(a.block_hashes[1:3]), a.block_hashes[0], tuple(range(4, 12)), BS)]


def test_a_hash_cached_by_another_block_is_not_stored_again():
    """Two sequences admitted together compute the same first block; only the first to finish stores it, and
    the second's later blocks are stored with that block's hash as their parent."""
    bm, rec = _bm()
    a, b = _seq(0, list(range(6))), _seq(1, list(range(4)) + [50, 51, 52, 53, 54])
    for s in (a, b):
        assert bm.admit(s, bm.find_cached_prefix(s), s.num_tokens)
    for s in (a, b):
        s.num_computed_tokens = s.num_tokens
        bm.cache_computed_blocks(s)
    assert a.block_hashes[0] == b.block_hashes[0]
    assert rec.take() == [BlockStored((a.block_hashes[0],), None, (0, 1, 2, 3), BS),
                          BlockStored((b.block_hashes[1],), b.block_hashes[0], (50, 51, 52, 53), BS)]


def test_eviction_removes_the_evicted_hashes():
    bm, rec = _bm(num_blocks=3)  # 2 usable blocks
    x = _seq(0, list(range(8)))
    _admit(bm, x)
    bm.free_sequence(x)
    stored = rec.take()
    y = _seq(1, list(range(50, 58)))
    assert _admit(bm, y) == 0
    events = rec.take()
    assert isinstance(events[0], BlockRemoved)  # both evicted by one allocation (in LRU order: tail first)
    assert sorted(events[0].block_hashes) == sorted(x.block_hashes)
    assert isinstance(events[1], BlockStored)
    assert replay(stored + events) == set(bm.cached) == set(y.block_hashes)


def test_truncate_into_a_cached_block_removes_it():
    bm, rec = _bm()
    a = _seq(0, list(range(8)))
    _admit(bm, a)
    h = a.block_hashes[1]
    rec.take()
    bm.truncate(a, 6)
    assert rec.take() == [BlockRemoved((h,))] and h not in bm.cached


def test_reset_refused_while_blocks_are_in_use_then_clears_everything():
    bm, rec = _bm()
    a = _seq(0, list(range(9)))
    _admit(bm, a)
    rec.take()
    before = dict(bm.cached)
    assert bm.reset_prefix_cache() is False
    assert bm.cached == before and rec.take() == []
    bm.free_sequence(a)
    assert bm.reset_prefix_cache() is True
    assert rec.take() == [AllBlocksCleared()]
    assert not bm.cached and all(h is None for h in bm.block_hash)
    assert _admit(bm, _seq(1, list(range(9)))) == 0  # nothing hits any more
    bm.check_invariants()


families = [[f * 100 + j for j in range(40)] for f in range(4)]
ops = st.lists(st.tuples(st.sampled_from(["admit", "chunk", "append", "free", "truncate", "reset"]),
                         st.integers(0, 7), st.integers(1, 13)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, num_blocks=st.integers(2, 24))
def test_events_rebuild_the_cached_set_after_every_operation(ops, num_blocks):
    bm, rec = _bm(num_blocks)
    rebuilt: set[bytes] = set()
    live: list[Sequence] = []
    for i, (op, a, n) in enumerate(ops):
        if op in ("admit", "chunk"):
            seq = _seq(i, families[a % 4][: n + a])
            if bm.admit(seq, bm.find_cached_prefix(seq), seq.num_tokens):
                seq.num_computed_tokens = seq.num_tokens if op == "admit" else seq.num_tokens // 2
                bm.cache_computed_blocks(seq)
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
            except RuntimeError:
                continue
            del seq.token_ids[keep:]
            seq.num_computed_tokens = min(seq.num_computed_tokens, keep)
        elif op == "free" and live:
            bm.free_sequence(live.pop(a % len(live)))
        elif op == "reset":
            assert bm.reset_prefix_cache() == (not live or all(not s.block_ids for s in live))
        replay(rec.take(), rebuilt)
        assert rebuilt == set(bm.cached)
        bm.check_invariants()
