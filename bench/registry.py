"""The ``jaxinfer-bench`` experiments: subcommand name -> the bench module that implements it.

Pure data (it imports no bench module), so that both the CLI, which loads every module to build its
subcommands, and ``phase1``, which only asks which experiments exist, read one table without importing
each other. The order is the order of ``jaxinfer-bench --help``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXPERIMENTS = {
    "latency": "bench.latency",
    "compare": "bench.compare",
    "kernels": "bench.kernels",
    "spec": "bench.spec",
    "serve": "bench.serve",
    "prefix": "bench.prefix",
    "serve-model": "bench.serve_model",
    "startup": "bench.startup",
    "host-loop": "bench.host_loop",
    "router": "bench.router",
    "paged": "bench.paged",
    "phase1": "bench.phase1",
    "tp": "bench.tp",
    "moe": "bench.moe",
    "quant": "bench.quant",
    "kv-bytes": "bench.kv_bytes",
    "gate-up": "bench.gate_up",
    "gpu-compile": "bench.gpu_compile.cli",
    "clients": "bench.clients.cli",
    "structured": "bench.structured.cli",
    "structured-masks": "bench.structured.mask_cost",
}


def load(name: str) -> ModuleType:
    """The module of experiment ``name`` (it has ``add_arguments(parser)`` and ``run(args)``)."""
    return importlib.import_module(EXPERIMENTS[name])
