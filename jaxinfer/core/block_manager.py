"""The block manager: a pool of fixed-size KV blocks with ref counts and a prefix cache. No JAX here.

Block 0 is reserved (padding tokens write there) and never handed out. Every other block is either owned
(ref count > 0) or free. Free blocks sit in an LRU (an insertion-ordered dict: O(1) append, pop-oldest and
removal); allocation takes the oldest. With prefix caching on, a *full* block is registered under a hash
that chains its parent block's hash with its own token ids and the request's ``cache_salt``
(SHA-256, so collisions are not a practical concern). A freed block keeps its hash and stays findable
until the LRU evicts it, so blocks held only by the cache count as free.

With an event recorder (``jaxinfer.core.kv_events``), every hash that enters the cache (``BlockStored``,
consecutive newly cached blocks of one sequence together), every hash that leaves it (``BlockRemoved``: an
eviction, a truncated block) and a reset (``AllBlocksCleared``) is recorded, so a subscriber can rebuild
``cached``'s keys from the events alone.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from typing import Iterable

from jaxinfer.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventRecorder
from jaxinfer.core.sequence import Sequence

NULL_BLOCK = 0


def chain_hash(parent: bytes | None, token_ids: Iterable[int], salt: str | None) -> bytes:
    h = hashlib.sha256()
    h.update(parent or b"root")
    h.update(b"|salt:" + (salt or "").encode())
    ids = list(token_ids)
    h.update(struct.pack(f"<{len(ids)}q", *ids))
    return h.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 events: KVEventRecorder | None = None):
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV blocks (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # hash -> block id
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        # Prefix-cache statistics (tokens).
        self.query_tokens = 0
        self.hit_tokens = 0
        self.miss_tokens = {"shorter_than_block": 0, "evicted": 0, "never_seen": 0}
        self.num_evictions = 0
        self._ever_cached: set[bytes] = set()  # to tell "evicted" misses from "never seen" ones
        # Full blocks that an admitted sequence is about to compute: hash -> seq_id. A sequence whose next
        # missing block is pending waits for it instead of computing the same prefix twice.
        self.pending: dict[bytes, int] = {}
        self.events = events  # KV-cache events for subscribers (None: none recorded)

    # ----------------------------------------------------------------- queries
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def update_hashes(self, seq: Sequence) -> None:
        """Extend ``seq.block_hashes`` to cover every full block of its known tokens (pending ones excluded)."""
        bs = self.block_size
        while (len(seq.block_hashes) + 1) * bs <= len(seq.token_ids):
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(chain_hash(parent, seq.token_ids[i * bs : (i + 1) * bs], seq.cache_salt))

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix of ``seq`` (never covering its last token)."""
        if not self.enable_prefix_caching:
            return []
        self.update_hashes(seq)
        max_blocks = (seq.num_tokens - 1) // self.block_size  # the last token is always computed
        hits = []
        for h in seq.block_hashes[:max_blocks]:
            block = self.cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    # ------------------------------------------------------------- mutations
    def admit(self, seq: Sequence, cached_blocks: list[int], num_tokens: int) -> bool:
        """Give a waiting ``seq`` its cached prefix blocks plus fresh blocks for ``num_tokens`` tokens.

        All or nothing: returns False (and changes nothing) when the pool cannot supply them.
        """
        fresh = self.blocks_needed(num_tokens) - len(cached_blocks)
        evictable_hits = sum(1 for b in cached_blocks if self.ref_counts[b] == 0)
        if fresh > self.num_free_blocks - evictable_hits:
            return False
        for b in cached_blocks:
            if self.ref_counts[b] == 0:
                del self.free[b]
            self.ref_counts[b] += 1
        seq.block_ids = list(cached_blocks)
        self._allocate(seq, fresh)
        if self.enable_prefix_caching:
            for h in seq.block_hashes[len(cached_blocks) :]:
                if h not in self.cached:
                    self.pending.setdefault(h, seq.seq_id)
        return True

    def waits_for_pending(self, seq: Sequence, num_hit_blocks: int) -> bool:
        """True when another running sequence is computing the first block ``seq`` misses."""
        if num_hit_blocks >= len(seq.block_hashes) or num_hit_blocks * self.block_size >= seq.num_tokens - 1:
            return False
        owner = self.pending.get(seq.block_hashes[num_hit_blocks])
        return owner is not None and owner != seq.seq_id

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Make ``seq`` own enough blocks for ``num_tokens`` tokens; False if the pool is short."""
        need = self.blocks_needed(num_tokens) - len(seq.block_ids)
        if need > self.num_free_blocks:
            return False
        self._allocate(seq, need)
        return True

    def _allocate(self, seq: Sequence, count: int) -> None:
        evicted = []
        for _ in range(max(count, 0)):
            block, _ = self.free.popitem(last=False)
            old = self.block_hash[block]
            if old is not None:
                self.num_evictions += 1
                if self.cached.get(old) == block:
                    del self.cached[old]
                    evicted.append(old)
                self.block_hash[block] = None
            self.ref_counts[block] = 1
            seq.block_ids.append(block)
        if evicted and self.events is not None:
            self.events.append(BlockRemoved(tuple(evicted)))

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register the hashes of ``seq``'s blocks whose tokens all have K/V computed."""
        if not self.enable_prefix_caching:
            return
        self.update_hashes(seq)
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_hashes), len(seq.block_ids))
        stored: list[int] = []  # indices of the blocks newly cached by this call
        for i in range(seq.num_registered_blocks, full):  # the blocks before were registered already
            block, h = seq.block_ids[i], seq.block_hashes[i]
            if self.block_hash[block] is None and h not in self.cached:
                self.block_hash[block] = h
                self.cached[h] = block
                self._ever_cached.add(h)
                stored.append(i)
            if self.pending.get(h) == seq.seq_id:
                del self.pending[h]
        seq.num_registered_blocks = max(seq.num_registered_blocks, full)
        if stored and self.events is not None:
            self._record_stored(seq, stored)

    def _record_stored(self, seq: Sequence, stored: list[int]) -> None:
        """One ``BlockStored`` per run of consecutive block indices (a block already cached elsewhere splits
        a run: it is not stored again)."""
        bs, start = self.block_size, 0
        for k in range(1, len(stored) + 1):
            if k == len(stored) or stored[k] != stored[k - 1] + 1:
                first, last = stored[start], stored[k - 1]
                self.events.append(BlockStored(
                    block_hashes=tuple(seq.block_hashes[first : last + 1]),
                    parent_block_hash=seq.block_hashes[first - 1] if first > 0 else None,
                    token_ids=tuple(seq.token_ids[first * bs : (last + 1) * bs]),
                    block_size=bs,
                ))
                start = k

    def free_sequence(self, seq: Sequence) -> None:
        """Drop ``seq``'s references; its tail blocks go to the LRU first so they are evicted first."""
        for h in seq.block_hashes:
            if self.pending.get(h) == seq.seq_id:
                del self.pending[h]
        for block in reversed(seq.block_ids):
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0, f"block {block} freed twice"
            if self.ref_counts[block] == 0:
                if self.block_hash[block] is None:
                    self.free[block] = None
                    self.free.move_to_end(block, last=False)  # uncached blocks are reused first
                else:
                    self.free[block] = None
        seq.block_ids = []
        seq.num_registered_blocks = 0

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Release the blocks beyond what ``num_tokens`` tokens need (rejected speculative tokens)."""
        keep = self.blocks_needed(num_tokens)
        if num_tokens % self.block_size and keep <= len(seq.block_ids):
            # The last kept block is now partial: its content will change, so it must leave the cache.
            last = seq.block_ids[keep - 1]
            h = self.block_hash[last]
            if h is not None:
                if self.ref_counts[last] > 1:
                    raise RuntimeError(f"cannot truncate into block {last}: it is shared (copy-on-write needed)")
                self.block_hash[last] = None
                if self.cached.get(h) == last:
                    del self.cached[h]
                    if self.events is not None:
                        self.events.append(BlockRemoved((h,)))
        del seq.block_hashes[num_tokens // self.block_size :]
        seq.num_registered_blocks = min(seq.num_registered_blocks, num_tokens // self.block_size)
        extra = seq.block_ids[keep:]
        seq.block_ids = seq.block_ids[:keep]
        for block in reversed(extra):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free[block] = None
                self.free.move_to_end(block, last=False)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash (vLLM's ``reset_prefix_cache``: after new weights, or between benchmark
        runs). Only when no sequence holds a block — every usable block is free; otherwise False and nothing
        changes."""
        if self.num_free_blocks != self.num_usable_blocks:
            return False
        self.block_hash = [None] * self.num_blocks
        self.cached.clear()
        self.pending.clear()  # held by running sequences only: already empty
        if self.events is not None:
            self.events.append(AllBlocksCleared())
        return True

    def record_query(self, seq: Sequence, num_hit_tokens: int) -> None:
        """Account a first admission: its prompt tokens, the cache hits, and why the rest missed."""
        self.query_tokens += seq.num_tokens
        self.hit_tokens += num_hit_tokens
        missed = seq.num_tokens - num_hit_tokens
        if not self.enable_prefix_caching or missed == 0:
            return
        first_missing = num_hit_tokens // self.block_size
        if seq.num_tokens - 1 < self.block_size or first_missing >= len(seq.block_hashes):
            self.miss_tokens["shorter_than_block"] += missed
        elif seq.block_hashes[first_missing] in self._ever_cached:
            self.miss_tokens["evicted"] += missed
        else:
            self.miss_tokens["never_seen"] += missed

    def check_invariants(self) -> None:
        """Assert the pool's bookkeeping is consistent (used by tests)."""
        assert self.ref_counts[NULL_BLOCK] == 0 and NULL_BLOCK not in self.free
        for b in range(1, self.num_blocks):
            assert self.ref_counts[b] >= 0
            assert (self.ref_counts[b] == 0) == (b in self.free), f"block {b}: ref {self.ref_counts[b]}"
        for h, b in self.cached.items():
            assert self.block_hash[b] == h
