"""A KV-events subscriber and replay client for the tests, on loopback only (what a router's side does).

The subscriber binds a SUB socket on a free 127.0.0.1 port; the publisher is given that address and, as it has
no wildcard, connects to it (vLLM's rule). A PUB socket drops what no subscriber has asked for yet, and a SUB
socket sends its subscription only when its own thread uses it, so ``wait_connected`` waits for the ZeroMQ
handshake (a socket monitor), then has the SUB socket process it, before the publisher's first batch.
"""

from __future__ import annotations

import time

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class Subscriber:
    def __init__(self, topic: bytes = b"", port: int = 0):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self._monitor = self.sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.sub.bind(f"tcp://127.0.0.1:{port}")  # 0: a free port
        self.endpoint = self.sub.getsockopt_string(zmq.LAST_ENDPOINT)

    def wait_connected(self, timeout: float = 30.0) -> None:
        """Until a publisher has connected and finished the handshake (then a moment for the subscription)."""
        if not self._monitor.poll(int(timeout * 1000)):
            raise TimeoutError(f"no publisher connected to {self.endpoint} within {timeout} s")
        self._monitor.recv_multipart()
        self.sub.poll(0)  # the SUB socket attaches the connection and sends its subscription in this thread
        time.sleep(0.2)  # for the publisher to read it

    def recv(self, timeout: float = 10.0) -> tuple[bytes, int, bytes]:
        if not self.sub.poll(int(timeout * 1000)):
            raise TimeoutError("no KV-events message")
        topic, seq, payload = self.sub.recv_multipart()
        return topic, int.from_bytes(seq, "big"), payload

    def drain(self, idle: float = 0.5) -> list[tuple[bytes, int, bytes]]:
        """Every message that arrives until none came for ``idle`` seconds."""
        got = []
        while self.sub.poll(int(idle * 1000)):
            topic, seq, payload = self.sub.recv_multipart()
            got.append((topic, int.from_bytes(seq, "big"), payload))
        return got

    def replay(self, endpoint: str, start: int, timeout: float = 10.0) -> list[tuple[bytes, int, bytes]]:
        """Ask the publisher's ROUTER for the batches from ``start`` on (a DEALER, as vLLM's clients do)."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(endpoint)
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            got = []
            while True:
                if not dealer.poll(int(timeout * 1000)):
                    raise TimeoutError("no replay answer")
                frames = dealer.recv_multipart()
                assert frames[0] == b"", frames
                if frames[2] == END_SEQ:
                    assert frames[1:] == [b"", END_SEQ, b""], frames
                    return got
                got.append((frames[1], int.from_bytes(frames[2], "big"), frames[3]))
        finally:
            dealer.close(linger=0)

    def close(self) -> None:
        self.sub.disable_monitor()
        self._monitor.close(linger=0)
        self.sub.close(linger=0)
        self.ctx.term()


def decode(payload: bytes) -> tuple[float, list[dict], int]:
    """(ts, events, data_parallel_rank) of one payload."""
    ts, events, rank = msgpack.unpackb(payload)
    return ts, events, rank


def rebuild(payloads, cached: set[bytes] | None = None) -> set[bytes]:
    """The cached block hashes a subscriber knows after these payloads (from the wire format alone)."""
    cached = set() if cached is None else cached
    for payload in payloads:
        for e in decode(payload)[1]:
            if e["type"] == "BlockStored":
                cached.update(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                cached.difference_update(e["block_hashes"])
            elif e["type"] == "AllBlocksCleared":
                cached.clear()
    return cached
