"""KV-cache events from a running engine, read the way a cache-aware router reads them: a ZMQ subscriber on
loopback rebuilds the prefix cache's block set from the events alone and must find exactly the block manager's
``cached`` after a mixed workload with shared prefixes and evictions; sequence numbers run from 0 without a
gap; every BlockStored's hashes chain from its parent over its token ids; ``reset_prefix_cache`` clears the
set; replay returns the live batches byte for byte; the async engine resets on its thread and closes the
publisher when it stops."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.core.block_manager import chain_hash

kv = pytest.importorskip("tests.kv_events_client")

BS = 16
TOPIC = b"kv-events"
ENGINE = dict(compilation="lazy", max_model_len=128, max_num_seqs=4, num_kv_blocks=20, block_size=BS, seed=0)
GEN = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


class Stream:
    """Everything the subscriber received so far, in order."""

    def __init__(self, sub):
        self.sub = sub
        self.messages: list[tuple[bytes, int, bytes]] = []

    def drain(self) -> list[tuple[bytes, int, bytes]]:
        new = self.sub.drain(idle=0.5)
        self.messages += new
        return new

    def rebuilt(self) -> set[bytes]:
        return kv.rebuild(p for _, _, p in self.messages)


def _engine(sub, **kwargs) -> LLM:
    events = {"enable_kv_cache_events": True, "endpoint": sub.endpoint, "replay_endpoint": "tcp://127.0.0.1:0",
              "topic": TOPIC.decode()}
    llm = LLM(kv_events_config=events, **ENGINE, **kwargs)
    sub.wait_connected()
    return llm


@pytest.fixture(scope="module")
def served():
    sub = kv.Subscriber(TOPIC)
    llm = _engine(sub)
    yield llm, Stream(sub)
    llm.close()
    sub.close()


def _workload(seed: int) -> list[dict]:
    """Three tenants with their own 40-56 token prefix, interleaved, plus prompts shorter than a block."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 256, size=int(rng.integers(40, 57))).tolist() for _ in range(3)]
    prompts = []
    for k in range(4):
        for prefix in prefixes:
            prompts.append({"prompt_token_ids": prefix + rng.integers(0, 256, size=int(rng.integers(3, 30))).tolist()})
        prompts.append({"prompt_token_ids": rng.integers(0, 256, size=int(rng.integers(2, 15))).tolist()})
    return prompts


def _check_stored_events_chain(messages) -> None:
    for _, _, payload in messages:
        for e in kv.decode(payload)[1]:
            if e["type"] != "BlockStored":
                continue
            assert e["block_size"] == BS and e["medium"] == "GPU" and e["lora_id"] is None
            assert len(e["token_ids"]) == BS * len(e["block_hashes"])
            parent = e["parent_block_hash"]
            for i, h in enumerate(e["block_hashes"]):
                assert len(h) == 32 and chain_hash(parent, e["token_ids"][i * BS : (i + 1) * BS], None) == h
                parent = h


def test_events_rebuild_the_cached_blocks_after_a_mixed_workload(served):
    llm, stream = served
    engine = llm.llm_engine
    t0 = time.time()
    for seed in (0, 1):  # the second round hits the prefixes the first left, and evicts others
        llm.generate(_workload(seed), GEN, use_tqdm=False)
    new = stream.drain()
    bm = engine.block_manager
    assert bm.num_evictions > 0 and bm.hit_tokens > 0
    assert [seq for _, seq, _ in new] == list(range(len(new)))  # consecutive from 0: nothing lost
    assert all(topic == TOPIC for topic, _, _ in new)
    kinds = {e["type"] for _, _, p in new for e in kv.decode(p)[1]}
    assert kinds == {"BlockStored", "BlockRemoved"}
    for _, _, payload in new:
        ts, events, rank = kv.decode(payload)
        assert t0 - 1 <= ts <= time.time() and rank == 0 and events
    _check_stored_events_chain(new)
    assert bm.cached and stream.rebuilt() == set(bm.cached)
    stats = engine.stats()["kv_events"]
    assert stats["enabled"] and stats["batches_published"] == stats["batches_sent"] == len(new)
    assert stats["events_published"] == sum(len(kv.decode(p)[1]) for _, _, p in new)


def test_reset_prefix_cache_is_refused_while_running_then_clears_all(served):
    llm, stream = served
    engine = llm.llm_engine
    engine.add_request("busy", {"prompt_token_ids": list(range(40))}, GEN)
    engine.step()
    cached = set(engine.block_manager.cached)
    assert llm.reset_prefix_cache() is False and set(engine.block_manager.cached) == cached
    while engine.has_unfinished_requests():
        engine.step()
    assert llm.reset_prefix_cache() is True
    new = stream.drain()
    assert kv.decode(new[-1][2])[1] == [{"type": "AllBlocksCleared"}]
    assert stream.rebuilt() == set() == set(engine.block_manager.cached)
    llm.generate(_workload(2), GEN, use_tqdm=False)  # the stream goes on after a reset
    stream.drain()
    seqs = [seq for _, seq, _ in stream.messages]
    assert seqs == list(range(len(seqs)))
    assert stream.rebuilt() == set(engine.block_manager.cached) != set()


def test_replay_returns_the_live_batches(served):
    llm, stream = served
    replay_endpoint = llm.llm_engine.kv_events_publisher.replay_endpoint
    assert stream.sub.replay(replay_endpoint, 0) == stream.messages  # fewer than buffer_steps batches so far
    tail = stream.messages[-3:]
    assert stream.sub.replay(replay_endpoint, tail[0][1]) == tail


def test_async_engine_resets_on_its_thread_and_closes_the_publisher(served):
    from jaxinfer.server import AsyncLLMEngine

    llm, stream = served
    engine = AsyncLLMEngine(llm.llm_engine)
    engine.start()

    async def main():
        outs = [o async for o in engine.generate({"prompt_token_ids": list(range(50))}, GEN, "a")]
        assert outs[-1].finished
        return await engine.reset_prefix_cache()

    try:
        assert asyncio.run(main()) is True
    finally:
        engine.shutdown()
    new = stream.drain()
    assert kv.decode(new[-1][2])[1] == [{"type": "AllBlocksCleared"}]
    assert stream.rebuilt() == set()
    assert llm.llm_engine.kv_events_publisher is None  # closed when the engine thread stopped
    assert llm.llm_engine.stats()["kv_events"]["enabled"] is False


def test_async_scheduling_publishes_the_same_way():
    sub = kv.Subscriber(TOPIC)
    llm = _engine(sub, async_scheduling=True)
    stream = Stream(sub)
    try:
        assert llm.llm_engine.async_scheduling
        llm.generate(_workload(3), GEN, use_tqdm=False)
        stream.drain()
        bm = llm.llm_engine.block_manager
        assert bm.num_evictions > 0
        assert [seq for _, seq, _ in stream.messages] == list(range(len(stream.messages)))
        _check_stored_events_chain(stream.messages)
        assert stream.rebuilt() == set(bm.cached) != set()
    finally:
        llm.close()
        sub.close()
