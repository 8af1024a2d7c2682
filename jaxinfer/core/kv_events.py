"""KV-cache events: what the prefix cache stored, evicted and cleared, as vLLM names them. No JAX here.

A router that routes on cache contents (vLLM's ``--kv-events-config``: llm-d's precise prefix scorer,
Dynamo's KV router, vllm-router's ``kv_aware``) rebuilds each replica's set of cached blocks from three
events:

* ``BlockStored``: consecutive full blocks of one sequence entered the prefix cache; ``parent_block_hash``
  is the hash of the block before the first (None at the start of a prompt) and ``token_ids`` the tokens of
  all the listed blocks, concatenated;
* ``BlockRemoved``: these hashes left the cache (evicted for a new allocation, or a truncated block);
* ``AllBlocksCleared``: the whole cache was forgotten (``BlockManager.reset_prefix_cache``).

The block manager appends events to a ``KVEventRecorder`` when it was given one (None: no events, no cost);
the engine takes them after each step and publishes them as one ``KVEventBatch``
(``jaxinfer.kv_events_publisher``, which also writes the wire format).
"""

from __future__ import annotations

import dataclasses

MEDIUM_GPU = "GPU"  # vLLM's name for the device's own KV cache, whatever the device


@dataclasses.dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str = MEDIUM_GPU


@dataclasses.dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[bytes, ...]
    medium: str = MEDIUM_GPU


@dataclasses.dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclasses.dataclass(frozen=True)
class KVEventBatch:
    """The events of one engine step: ``ts`` in seconds since the epoch (``time.time()``), the replica's
    ``data_parallel_rank``."""

    ts: float
    events: tuple[KVCacheEvent, ...]
    data_parallel_rank: int = 0


class KVEventRecorder:
    """Collects the block manager's events until the engine takes them (one engine thread: no locks)."""

    def __init__(self) -> None:
        self._events: list[KVCacheEvent] = []
        self.num_recorded = 0

    def append(self, event: KVCacheEvent) -> None:
        self._events.append(event)
        self.num_recorded += 1

    def __len__(self) -> int:
        return len(self._events)

    def take(self) -> list[KVCacheEvent]:
        """Every event recorded since the last call, oldest first."""
        events, self._events = self._events, []
        return events


def replay(events, cached: set[bytes] | None = None) -> set[bytes]:
    """The set of cached block hashes that ``events`` leave, starting from ``cached`` (what a subscriber
    rebuilds; the tests check it against ``BlockManager.cached``)."""
    cached = set() if cached is None else cached
    for e in events:
        if isinstance(e, BlockStored):
            cached.update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            cached.difference_update(e.block_hashes)
        elif isinstance(e, AllBlocksCleared):
            cached.clear()
    return cached
