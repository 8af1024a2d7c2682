"""KV-events config, wire format and ZMQ publisher (no engine, no JAX): the encoder against bytes vLLM's own
msgspec classes wrote, vLLM decoding our payload (when $JAXINFER_VLLM_PYTHON names a Python with vllm), and a
subscriber and a replay client on loopback."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.kv_events import KVEventsConfig
from jaxinfer.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from jaxinfer.kv_events_publisher import is_bind_endpoint, make_publisher, offset_endpoint_port

msgpack = pytest.importorskip("msgpack")

BATCH = KVEventBatch(1.5, (BlockStored((b"\x01" * 4,), None, (1, 2), 2), BlockRemoved((b"\x02",)),
                           AllBlocksCleared()), 0)
# vLLM 0.32's msgspec encoder on KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[b"\x01" * 4],
# parent_block_hash=None, token_ids=[1, 2], block_size=2, lora_id=None, medium="GPU", lora_name=None),
# BlockRemoved(block_hashes=[b"\x02"], medium="GPU"), AllBlocksCleared()], data_parallel_rank=0)
VLLM_BYTES = (
    b"\x93\xcb?\xf8\x00\x00\x00\x00\x00\x00\x93"
    b"\x88\xa4type\xabBlockStored\xacblock_hashes\x91\xc4\x04\x01\x01\x01\x01\xb1parent_block_hash\xc0"
    b"\xa9token_ids\x92\x01\x02\xaablock_size\x02\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\xc0"
    b"\x83\xa4type\xacBlockRemoved\xacblock_hashes\x91\xc4\x01\x02\xa6medium\xa3GPU"
    b"\x81\xa4type\xb0AllBlocksCleared"
    b"\x00"
)


# ------------------------------------------------------------------------------------------------ config
def test_config_defaults_are_vllms():
    c = KVEventsConfig.from_dict(None)
    assert (c.enable_kv_cache_events, c.publisher, c.endpoint, c.replay_endpoint, c.buffer_steps, c.hwm,
            c.max_queue_size, c.topic) == (False, "null", "tcp://*:5557", None, 10_000, 100_000, 100_000, "")
    assert not c.enabled
    on = KVEventsConfig.from_dict({"enable_kv_cache_events": True})
    assert on.publisher == "zmq" and on.enabled
    assert not KVEventsConfig.from_dict({"enable_kv_cache_events": True, "publisher": "null"}).enabled


@pytest.mark.parametrize("bad, match", [
    ({"enable_kv_cache_events": True, "endpiont": "tcp://*:1"}, r"unknown key\(s\) \['endpiont'\]"),
    ({"publisher": "kafka"}, "publisher"),
    ({"endpoint": "localhost:5557"}, "endpoint"),
    ({"replay_endpoint": 5558}, "replay_endpoint"),
    ({"buffer_steps": -1}, "buffer_steps"),
    ({"hwm": True}, "hwm"),
    ({"enable_kv_cache_events": "yes"}, "enable_kv_cache_events"),
    ({"topic": 3}, "topic"),
])
def test_config_refuses_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        KVEventsConfig.from_dict(bad)
    with pytest.raises(ValueError, match=match):
        EngineConfig(kv_events_config=bad)  # validated when the engine config is made


@pytest.mark.parametrize("rank", [-1, True, "1", 1.0])
def test_data_parallel_rank_must_be_a_non_negative_int(rank):
    with pytest.raises(ValueError, match="data_parallel_rank"):
        EngineConfig(data_parallel_rank=rank)


def test_endpoints_are_offset_by_rank_and_bound_or_connected_as_vllm_does():
    assert offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint_port("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint_port("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    assert offset_endpoint_port("tcp://*:0", 2) == "tcp://*:0"
    assert offset_endpoint_port("inproc://kv", 2) == "inproc://kv_dp2"
    assert offset_endpoint_port(None, 2) is None
    assert is_bind_endpoint("tcp://*:5557") and is_bind_endpoint("tcp://[::]:5557")
    assert is_bind_endpoint("ipc:///tmp/kv") and is_bind_endpoint("inproc://kv")
    assert not is_bind_endpoint("tcp://127.0.0.1:5557") and not is_bind_endpoint("tcp://router:5557")


# ------------------------------------------------------------------------------------------- wire format
def test_encoder_writes_vllms_bytes():
    from jaxinfer.kv_events_publisher import encode_batch

    assert encode_batch(BATCH) == VLLM_BYTES


VLLM_DECODE = """
import json, sys
from msgspec.msgpack import Decoder
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
batch = Decoder(type=KVEventBatch).decode(sys.stdin.buffer.read())
out = {"ts": batch.ts, "rank": batch.data_parallel_rank, "events": []}
for e in batch.events:
    d = {"type": type(e).__name__}
    if isinstance(e, BlockStored):
        d.update(hashes=[h.hex() for h in e.block_hashes], parent=e.parent_block_hash and e.parent_block_hash.hex(),
                 tokens=e.token_ids, block_size=e.block_size, medium=e.medium, lora_id=e.lora_id)
    elif isinstance(e, BlockRemoved):
        d.update(hashes=[h.hex() for h in e.block_hashes], medium=e.medium)
    out["events"].append(d)
print(json.dumps(out))
"""


def test_vllm_decodes_our_payload():
    python = os.environ.get("JAXINFER_VLLM_PYTHON")
    if not python:
        pytest.skip("set JAXINFER_VLLM_PYTHON to a Python with vllm installed to decode with vLLM's own classes")
    from jaxinfer.kv_events_publisher import encode_batch

    h1, h2, h3 = bytes(range(32)), bytes(range(1, 33)), bytes(range(2, 34))
    batch = KVEventBatch(1733300000.25, (BlockStored((h1, h2), None, tuple(range(32)), 16),
                                         BlockStored((h3,), h2, tuple(range(32, 48)), 16),
                                         BlockRemoved((h1, h3)), AllBlocksCleared()), 3)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", ""), "VLLM_TARGET_DEVICE": "cpu",
           "PYTHONPATH": ""}
    proc = subprocess.run([python, "-c", VLLM_DECODE], input=encode_batch(batch), capture_output=True, env=env,
                          timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    got = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert got["ts"] == 1733300000.25 and got["rank"] == 3
    assert got["events"] == [
        {"type": "BlockStored", "hashes": [h1.hex(), h2.hex()], "parent": None, "tokens": list(range(32)),
         "block_size": 16, "medium": "GPU", "lora_id": None},
        {"type": "BlockStored", "hashes": [h3.hex()], "parent": h2.hex(), "tokens": list(range(32, 48)),
         "block_size": 16, "medium": "GPU", "lora_id": None},
        {"type": "BlockRemoved", "hashes": [h1.hex(), h3.hex()], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ]


# --------------------------------------------------------------------------------------------- publisher
@pytest.fixture
def client():
    from tests import kv_events_client

    return kv_events_client


def test_publisher_numbers_batches_and_replays_them(client):
    sub = client.Subscriber(b"kv")
    base, port = sub.endpoint.rsplit(":", 1)
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"{base}:{int(port) - 2}",  # rank 2: port + 2
                            replay_endpoint="tcp://127.0.0.1:0", topic="kv", buffer_steps=3)
    pub = make_publisher(config, data_parallel_rank=2)
    from jaxinfer.kv_events_publisher import encode_batch

    batches = [KVEventBatch(float(i), (BlockRemoved((bytes([i]),)),), 2) for i in range(5)]
    try:
        assert pub.endpoint == sub.endpoint and pub.replay_endpoint.startswith("tcp://127.0.0.1:")
        sub.wait_connected()
        for b in batches:
            pub.publish(b)
        for i, b in enumerate(batches):
            assert sub.recv() == (b"kv", i, encode_batch(b))
        assert client.decode(encode_batch(batches[1])) == (1.0, [{"type": "BlockRemoved", "block_hashes": [b"\x01"],
                                                                 "medium": "GPU"}], 2)
        # only the last buffer_steps (3) batches are kept
        assert [seq for _, seq, _ in sub.replay(pub.replay_endpoint, 0)] == [2, 3, 4]
        assert sub.replay(pub.replay_endpoint, 4) == [(b"kv", 4, encode_batch(batches[4]))]
        assert sub.replay(pub.replay_endpoint, 9) == []
        stats = pub.stats()
        assert (stats["batches_sent"], stats["events_sent"], stats["replay_requests"]) == (5, 5, 3)
    finally:
        pub.close()
        sub.close()
    pub.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish(batches[0])


def test_close_sends_what_is_queued(client):
    sub = client.Subscriber()
    pub = make_publisher(KVEventsConfig(enable_kv_cache_events=True, endpoint=sub.endpoint))
    try:
        sub.wait_connected()
        for i in range(50):
            pub.publish(KVEventBatch(float(i), (AllBlocksCleared(),)))
        pub.close()
        assert [seq for _, seq, _ in sub.drain()] == list(range(50))
    finally:
        pub.close()
        sub.close()


def test_wildcard_endpoint_binds_and_a_taken_port_fails_at_once(client):
    pub = make_publisher(KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://*:0"))
    try:
        port = int(pub.endpoint.rsplit(":", 1)[1])
        assert port > 0
        with pytest.raises(client.zmq.ZMQError):
            make_publisher(KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://*:{port}"))
    finally:
        pub.close()
    assert make_publisher(KVEventsConfig(enable_kv_cache_events=False)) is None
