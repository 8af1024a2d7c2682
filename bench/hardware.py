"""Measured ceilings of the machine the benchmark runs on: memory bandwidth, and what a decode step must read.

Bandwidth is measured in the same run as the benchmark it scales. Several read-dominated probes run (a jitted
reduction, a jitted copy, a numpy copy); the fastest one is "the measured bandwidth", so every ratio quoted
against it is conservative.
"""

from __future__ import annotations

import dataclasses
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ModelConfig
from jaxinfer.env_report import cpu_model, package_version
from jaxinfer.model.attention import resolve_attention_backend


@dataclasses.dataclass(frozen=True)
class Bandwidth:
    bytes_per_s: float
    probe: str
    probes: dict

    def to_json(self) -> dict:
        return {"bytes_per_s": self.bytes_per_s, "gb_per_s": self.bytes_per_s / 1e9, "probe": self.probe,
                "probes_gb_per_s": {k: v / 1e9 for k, v in self.probes.items()}}


def _best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_bandwidth(num_bytes: int | None = None, repeats: int = 5) -> Bandwidth:
    """Best achieved bandwidth (bytes/s) over a few probes on an array far larger than the caches."""
    on_cpu = jax.default_backend() == "cpu"
    num_bytes = num_bytes or ((512 << 20) if on_cpu else (4 << 30))
    n = num_bytes // 4
    x = jnp.ones((n,), jnp.float32)
    reduce_fn = jax.jit(lambda a: jnp.sum(a))
    copy_fn = jax.jit(lambda a: a + 1.0)
    probes = {
        "jax_sum_read": num_bytes / _best_time(lambda: reduce_fn(x).block_until_ready(), repeats),
        "jax_copy_read_write": 2 * num_bytes / _best_time(lambda: copy_fn(x).block_until_ready(), repeats),
    }
    if on_cpu:
        a = np.ones(n, np.float32)
        b = np.empty_like(a)
        probes["numpy_copy_read_write"] = 2 * num_bytes / _best_time(lambda: np.copyto(b, a), repeats)
    best = max(probes, key=probes.get)
    return Bandwidth(probes[best], best, probes)


def decode_bytes_per_step(cfg: ModelConfig, dtype, batch_size: int, mean_context: float) -> int:
    """Bytes a decode step must read at least: every weight once (the embedding table only as the LM head
    when tied; one row per token otherwise; of an MoE layer's routed experts at most ``batch x top-k``)
    plus every sequence's K/V."""
    itemsize = jnp.dtype(dtype).itemsize
    weights = cfg.num_params - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    if cfg.is_moe:  # the experts no token can be routed to are not read
        untouched = cfg.num_experts - min(cfg.num_experts, batch_size * cfg.num_experts_per_tok)
        weights -= sum(map(cfg.layer_is_moe, range(cfg.num_layers))) * untouched * cfg.expert_params
    kv = batch_size * mean_context * cfg.kv_cache_bytes_per_token(1)  # K and V, or MLA's latent row
    return int((weights + kv) * itemsize)


def machine_info() -> dict:
    """Where a number was measured: devices, CPU, and the versions of jax, its backend and torch."""
    import os

    dev = jax.devices()[0]
    return {
        "platform": jax.default_backend(),
        "device": getattr(dev, "device_kind", str(dev)),
        "num_devices": jax.device_count(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "jax_version": jax.__version__,
        "jaxlib_version": package_version("jaxlib"),
        "backend_version": getattr(dev.client, "platform_version", None),
        "torch_version": package_version("torch"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def pure_layer_attention_backend() -> str:
    """The attention backend of the benches that call the model functions directly: the engine's default on a
    CPU (the C++ kernels where they load), XLA's attention elsewhere."""
    return resolve_attention_backend("auto", "cpu") if jax.default_backend() == "cpu" else "xla"
