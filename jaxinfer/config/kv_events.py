"""The ``kv_events_config`` dict of ``LLM(...)`` / ``jaxinfer serve --kv-events-config JSON``, validated into a
frozen KVEventsConfig with vLLM's fields and defaults (vLLM's ``KVEventsConfig``), so a vLLM command line's
JSON works unchanged:

* ``enable_kv_cache_events`` (False): publish the prefix cache's stores, evictions and resets;
* ``publisher`` ("zmq" when enabled, else "null"): "zmq" publishes on a ZeroMQ PUB socket, "null" nowhere;
* ``endpoint`` ("tcp://*:5557"): the PUB socket's address, bound when it has a wildcard (``*``, ``::``) or is
  ``ipc://`` / ``inproc://``, connected to otherwise (a subscriber that binds); the TCP port is offset by the
  engine's ``data_parallel_rank`` (one port per replica; port 0 lets the OS choose);
* ``replay_endpoint`` (None): a ROUTER socket (always bound, offset the same way) that answers a request for
  the batches from a sequence number on, out of the last ``buffer_steps`` (10000) batches;
* ``hwm`` (100000): ZeroMQ's high-water mark of the PUB socket (messages a slow subscriber may queue);
* ``max_queue_size`` (100000): batches waiting for the publisher thread before ``publish`` blocks;
* ``topic`` (""): the first frame of every message (subscribers filter on it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

PUBLISHERS = ("null", "zmq")
_TRANSPORTS = ("tcp://", "ipc://", "inproc://")


@dataclasses.dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None  # None: "zmq" when enabled, else "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self):
        if not isinstance(self.enable_kv_cache_events, bool):
            raise ValueError(f"kv_events_config['enable_kv_cache_events'] must be a bool, got "
                             f"{self.enable_kv_cache_events!r}")
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        if self.publisher not in PUBLISHERS:
            raise ValueError(f"kv_events_config['publisher'] must be one of {PUBLISHERS}, got {self.publisher!r}")
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is None and name == "replay_endpoint":
                continue
            if not isinstance(value, str) or not value.startswith(_TRANSPORTS):
                raise ValueError(f"kv_events_config['{name}'] must be a ZeroMQ address starting with one of "
                                 f"{_TRANSPORTS}, got {value!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"kv_events_config['{name}'] must be an int >= 0, got {value!r}")
        if not isinstance(self.topic, str):
            raise ValueError(f"kv_events_config['topic'] must be a string, got {self.topic!r}")

    @property
    def enabled(self) -> bool:
        """True when events are recorded and published somewhere."""
        return self.enable_kv_cache_events and self.publisher != "null"

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "KVEventsConfig":
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ValueError(f"kv_events_config must be a dict (JSON object), got {type(d).__name__}")
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise ValueError(f"kv_events_config: unknown key(s) {unknown}; valid: {valid}")
        return cls(**d)
