"""Publishing KV-cache events as vLLM does: vLLM's wire format on a ZeroMQ PUB socket, with a replay buffer.

Wire format (what vLLM's ``ZmqEventPublisher`` sends, so subscribers written for vLLM read it unchanged):
every message is three frames ``(topic, seq, payload)``; ``seq`` is the batch's sequence number (8 bytes,
big-endian, 0 for the first batch), ``payload`` the msgpack array ``[ts, events, data_parallel_rank]``, each
event a map tagged by ``"type"``::

    {"type": "BlockStored", "block_hashes": [bytes, ...], "parent_block_hash": bytes | None,
     "token_ids": [int, ...], "block_size": int, "lora_id": None, "medium": "GPU", "lora_name": None}
    {"type": "BlockRemoved", "block_hashes": [bytes, ...], "medium": "GPU"}
    {"type": "AllBlocksCleared"}

Block hashes are the block manager's 32-byte SHA-256 digests (``jaxinfer.core.block_manager.chain_hash``).

Replay (``replay_endpoint``): a ROUTER socket. A client (DEALER, or REQ for one reply) sends
``(b"", start_seq)`` with ``start_seq`` 8 bytes big-endian; the publisher answers every batch still buffered
(the last ``buffer_steps``) from ``start_seq`` on as ``(b"", topic, seq, payload)`` and ends with
``(b"", b"", -1 as 8 signed bytes, b"")``.

``ZmqEventPublisher.publish`` (the engine thread) only enqueues; one background thread owns the sockets,
numbers and encodes the batches, sends them and answers replay requests. ``close`` sends what is queued and
closes the sockets. pyzmq and msgpack come with the ``server`` extra and are imported when a publisher is made.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from typing import Any

from jaxinfer.config.kv_events import KVEventsConfig
from jaxinfer.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

logger = logging.getLogger("jaxinfer")

END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the last frame of a replay answer
_REPLAY_POLL_S = 0.02  # with a replay socket, how often an idle publisher thread looks for requests
_CLOSE_LINGER_MS = 1000  # on close, how long queued messages may take to reach connected subscribers


def _require(name: str):
    try:
        return __import__(name)
    except ImportError as exc:
        raise ImportError(f"KV-cache events need pyzmq and msgpack ({name} is missing): "
                          "pip install 'jaxinfer[server]'") from exc


# ----------------------------------------------------------------------------------------------- encoding
def _event_map(event) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        return {"type": "BlockStored", "block_hashes": list(event.block_hashes),
                "parent_block_hash": event.parent_block_hash, "token_ids": [int(t) for t in event.token_ids],
                "block_size": event.block_size, "lora_id": None, "medium": event.medium, "lora_name": None}
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(event.block_hashes), "medium": event.medium}
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV-cache event: {event!r}")


def encode_batch(batch: KVEventBatch) -> bytes:
    """The msgpack payload of one batch, byte for byte what vLLM's encoder writes for the same events."""
    msgpack = _require("msgpack")
    return msgpack.packb([float(batch.ts), [_event_map(e) for e in batch.events], int(batch.data_parallel_rank)],
                         use_bin_type=True)


# ---------------------------------------------------------------------------------------------- endpoints
def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """One address per replica, as vLLM offsets them: a TCP port plus the rank (port 0 stays 0: the OS
    chooses), ``inproc://name`` gets ``_dp{rank}``; ipc paths are left as they are."""
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{data_parallel_rank}"
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        if not port.isdigit():
            raise ValueError(f"KV-events endpoint {endpoint!r}: a tcp address needs a numeric port")
        return endpoint if int(port) == 0 else f"{base}:{int(port) + data_parallel_rank}"
    return endpoint


def is_bind_endpoint(endpoint: str) -> bool:
    """Wildcard addresses and ipc / inproc ones are bound; any other address is connected to (a subscriber
    or proxy there binds), as vLLM decides."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def require_packages() -> None:
    """ImportError saying how to install pyzmq and msgpack, where either is missing."""
    _require("zmq")
    _require("msgpack")


def make_publisher(config: KVEventsConfig, data_parallel_rank: int = 0) -> "ZmqEventPublisher | None":
    """The publisher ``config`` asks for, or None when events are off (publisher "null")."""
    return ZmqEventPublisher(config, data_parallel_rank) if config.enabled else None


# ---------------------------------------------------------------------------------------------- publisher
class ZmqEventPublisher:
    """PUB socket plus optional ROUTER replay socket, both owned by one background thread."""

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0):
        require_packages()
        zmq = self._zmq = _require("zmq")
        self.config = config
        self.data_parallel_rank = data_parallel_rank
        self._topic = config.topic.encode()
        self._queue: queue.Queue = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: collections.deque = collections.deque(maxlen=config.buffer_steps)  # (seq, payload)
        self.num_batches_sent = 0
        self.num_events_sent = 0
        self.num_replay_requests = 0
        self._closed = False
        # Sockets are made and bound here, so a taken port fails the engine's start, then handed to the thread
        # (starting a thread is the memory barrier ZeroMQ asks for when a socket changes threads).
        self._ctx = zmq.Context()
        self._pub = self._replay = None
        try:
            self._pub = self._ctx.socket(zmq.PUB)
            self._pub.setsockopt(zmq.SNDHWM, config.hwm)
            endpoint = offset_endpoint_port(config.endpoint, data_parallel_rank)
            if is_bind_endpoint(endpoint):
                self.endpoint = self._bind(self._pub, endpoint)
            else:
                self._ipv6(self._pub, endpoint)
                self._pub.connect(endpoint)
                self.endpoint = endpoint
            self.replay_endpoint = None
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self.replay_endpoint = self._bind(self._replay,
                                                  offset_endpoint_port(config.replay_endpoint, data_parallel_rank))
        except Exception:
            self._close_sockets(linger=0)
            raise
        self._thread = threading.Thread(target=self._run, name="jaxinfer-kv-events", daemon=True)
        self._thread.start()
        logger.info("KV-cache events: publishing on %s (topic %r)%s", self.endpoint, config.topic,
                    f", replay on {self.replay_endpoint}" if self.replay_endpoint else "")

    def _ipv6(self, sock, endpoint: str) -> None:
        if "[" in endpoint or "::" in endpoint:
            sock.setsockopt(self._zmq.IPV6, 1)

    def _bind(self, sock, endpoint: str) -> str:
        """Bind and return the address bound (the port the OS chose for a tcp port 0)."""
        self._ipv6(sock, endpoint)
        sock.bind(endpoint)
        if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
            return sock.getsockopt_string(self._zmq.LAST_ENDPOINT)
        return endpoint

    # ------------------------------------------------------------------------------ the engine's side
    def publish(self, batch: KVEventBatch) -> None:
        """Queue ``batch`` for sending (blocks only while ``max_queue_size`` batches wait)."""
        if self._closed:
            raise RuntimeError("the KV-events publisher is closed")
        self._queue.put(batch)

    def close(self, timeout: float = 5.0) -> None:
        """Send every queued batch, then close the sockets and stop the thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("KV-cache events: the publisher thread did not stop within %.1f s", timeout)

    def stats(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint,
                "batches_sent": self.num_batches_sent, "events_sent": self.num_events_sent,
                "replay_requests": self.num_replay_requests, "queued": self._queue.qsize()}

    # ------------------------------------------------------------------------------ the thread's side
    def _run(self) -> None:
        try:
            while True:
                if self._replay is not None and self._replay.poll(0):
                    self._guarded(self._serve_replay)
                try:
                    batch = self._queue.get(timeout=_REPLAY_POLL_S if self._replay is not None else None)
                except queue.Empty:
                    continue
                if batch is None:
                    return
                self._guarded(self._send, batch)
        finally:
            self._close_sockets(linger=_CLOSE_LINGER_MS)

    @staticmethod
    def _guarded(fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a bad batch or request must not stop the publisher
            logger.exception("KV-cache events: %s failed", fn.__name__)

    def _send(self, batch: KVEventBatch) -> None:
        payload = encode_batch(batch)
        seq = self.num_batches_sent
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self.num_batches_sent += 1
        self.num_events_sent += len(batch.events)

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("KV-cache events: ignored a replay request of %d frame(s); expected "
                           "(b'', start_seq as 8 bytes big-endian)", len(frames) - 1)
            return
        client, empty, start = frames
        start_seq = int.from_bytes(start, "big")
        self.num_replay_requests += 1
        for seq, payload in self._buffer:
            if seq >= start_seq:
                self._replay.send_multipart((client, empty, self._topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, empty, b"", END_SEQ, b""))

    def _close_sockets(self, linger: int) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=linger)
        self._ctx.term()
