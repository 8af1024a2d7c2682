"""One engine over several processes (``jax.distributed``): process 0 leads, the others replay its calls.

Multi-host JAX is one SPMD program: every process must launch the same compiled executables, in the same
order, on the same global inputs. The engine's host side (requests, scheduler, block manager) runs on
process 0 only; before each device call — a step, or choosing the next tokens — process 0 broadcasts which
planned executable it runs and its host inputs (the packed step batch, the sampling metadata), and every
other process (``LLMEngine.follow()``) runs the same executable on the same inputs. Params and the KV
cache are global sharded arrays, so each process holds and updates its own shards; the outputs are
replicated and only process 0 reads them.

The broadcast is ``jax.experimental.multihost_utils.broadcast_one_to_all`` of one int32 buffer: a header
(operation, key index, payload length) and the payload's arrays flattened into it (float32 and uint32 by
their bits). Buffers come in a few fixed sizes, each compiled once at start (``warm_up``), so broadcasting
compiles nothing after start. With one process every call here is a no-op.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

OP_RUN, OP_STOP = 1, 2
_HEADER = 3  # op, key index, payload length (int32 words)
_SIZES = tuple(4 ** k * 1024 for k in range(1, 8))  # 4K ... 16M words: every payload fits one of them


def is_leader() -> bool:
    return jax.process_index() == 0


def multi_process() -> bool:
    return jax.process_count() > 1


def _broadcast(buffer: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(buffer))


def _size_class(words: int) -> int:
    for size in _SIZES:
        if size >= words:
            return size
    raise ValueError(f"a payload of {words} int32 words exceeds the largest broadcast buffer ({_SIZES[-1]})")


def pack_arrays(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays' bytes as one int32 vector (each array's itemsize must be 4)."""
    parts = [np.ascontiguousarray(a).reshape(-1).view(np.int32) for a in arrays]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def unpack_arrays(words: np.ndarray, like: list[Any]) -> list[np.ndarray]:
    """Inverse of ``pack_arrays`` given the arrays' shapes and dtypes (``like``: anything with both)."""
    out, i = [], 0
    for a in like:
        n = int(np.prod(a.shape))
        out.append(words[i : i + n].view(np.dtype(a.dtype)).reshape(a.shape).copy())
        i += n
    return out


class Channel:
    """Process 0 publishes each device call; the other processes receive and replay them."""

    def publish(self, key_index: int, arrays: list[np.ndarray]) -> None:
        """On the leader: tell the followers to run planned executable ``key_index`` on ``arrays``."""
        if not multi_process():
            return
        payload = pack_arrays(arrays)
        self._send(OP_RUN, key_index, payload)

    def stop(self) -> None:
        """On the leader: release the followers (their ``follow`` returns)."""
        if multi_process():
            self._send(OP_STOP, 0, np.zeros(0, np.int32))

    def _send(self, op: int, key_index: int, payload: np.ndarray) -> None:
        header = np.asarray([op, key_index, payload.size], np.int32)
        buffer = np.zeros(_size_class(_HEADER), np.int32)
        buffer[:_HEADER] = header
        _broadcast(buffer)  # the header first (fixed size): the followers learn the payload's size class
        if payload.size:
            body = np.zeros(_size_class(payload.size), np.int32)
            body[: payload.size] = payload
            _broadcast(body)

    def follow(self, run: Callable[[int, np.ndarray], None]) -> None:
        """On a follower: replay the leader's calls (``run(key_index, payload words)``) until it stops."""
        while True:
            header = _broadcast(np.zeros(_size_class(_HEADER), np.int32))[:_HEADER]
            op, key_index, size = (int(x) for x in header)
            if op == OP_STOP:
                return
            words = _broadcast(np.zeros(_size_class(size), np.int32))[:size] if size else np.zeros(0, np.int32)
            run(key_index, words)

    @staticmethod
    def warm_up(max_payload_words: int) -> None:
        """Compile the broadcast of every buffer size up to the largest payload the plan can produce, on
        every process, in the same order."""
        if multi_process():
            for size in _SIZES:
                if size <= _size_class(max(max_payload_words, _HEADER)):
                    _broadcast(np.zeros(size, np.int32))


def host_values(*arrays) -> tuple:
    """Replicated outputs as numpy (one transfer for all; the local copy when an array spans processes)."""
    if all(getattr(x, "is_fully_addressable", True) for x in arrays):
        return tuple(np.asarray(x) for x in jax.device_get(arrays))
    return tuple(np.asarray(x.addressable_data(0)) for x in arrays)
