"""The on-disk cache of compiled executables, so a restarted engine loads instead of compiling.

An entry is a compiled XLA executable serialized by JAX (``jax.experimental.serialize_executable``) with
its argument and result tree structures. Loading one skips Python tracing, lowering and XLA's compilation
all together (JAX's own persistent cache keys on the lowered program, so it saves the compilation but not
the tracing and lowering that precede it: about a quarter of a second per executable of the embedded
model, seconds for 7B shapes).

The key of an entry is a SHA-256 over everything that determines the executable: a description of the
function and its static arguments given by the caller (model config, backend, shape...), the abstract
arguments (shapes, dtypes, shardings), the source code of the packages that trace it (``jaxinfer``,
``pallas_kernels``, ``sharding``), the jax and jaxlib versions, the devices (platform, kind, count), the
host CPU (XLA:CPU compiles for its features) and ``XLA_FLAGS``. A different model, dtype, configuration,
code or jax version therefore never loads a stale entry; an entry that fails to load is recompiled and
rewritten.

Where: under ``executables/`` in the cache root (``jaxinfer.envs.cache_root``: ``$JAXINFER_CACHE_DIR``, else
``$XDG_CACHE_HOME/jaxinfer``, else ``~/.cache/jaxinfer``); ``LLM(compilation_cache_dir=...)`` moves it;
``LLM(enable_compilation_cache=False)`` or ``JAXINFER_COMPILATION_CACHE=0`` turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import platform
import tempfile
import warnings
from pathlib import Path
from typing import Any

import jax

from jaxinfer import envs
from jaxinfer.cpu import ffi as cpu_ffi

_PACKAGES = ("jaxinfer", "pallas_kernels", "sharding")
_FORMAT = 1


def default_cache_dir() -> Path:
    """The cache root of ``jaxinfer.envs.cache_root`` (the executables live under ``executables/`` in it)."""
    return envs.cache_root()


def cache_enabled_by_env() -> bool:
    """``JAXINFER_COMPILATION_CACHE`` (``jaxinfer.envs``)."""
    return envs.compilation_cache_enabled()


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """SHA-256 of the Python sources of the packages whose code is traced into executables."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _host_fingerprint() -> str:
    cpu = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        cpu = "\n".join(sorted({ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))}))
    except OSError:
        pass
    return f"{platform.machine()}|{platform.processor()}|{cpu}"


def _environment() -> str:
    import jaxlib

    devices = jax.devices()
    return "|".join([f"format={_FORMAT}", jax.__version__, jaxlib.__version__, devices[0].platform,
                      devices[0].device_kind, str(len(devices)), str(jax.process_count()),
                      os.environ.get("XLA_FLAGS", ""), source_fingerprint(), _host_fingerprint(),
                      f"cpu_kernels={cpu_ffi.fingerprint()}"])


def execution_devices(args: Any) -> list:
    """The devices an executable compiled for ``args`` runs on, in its device-assignment order: the mesh of
    the first NamedSharding among the arguments, else the default device."""
    for x in jax.tree_util.tree_leaves(args):
        sharding = getattr(x, "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        if mesh is not None and hasattr(mesh, "devices"):
            return list(mesh.devices.flat)
    return jax.devices()[:1]


def _describe_args(args: Any) -> str:
    leaves, treedef = jax.tree_util.tree_flatten(args)
    parts = [str(treedef)]
    for x in leaves:
        sharding = getattr(x, "sharding", None)
        parts.append(f"{getattr(x, 'shape', None)}:{getattr(x, 'dtype', type(x).__name__)}:{sharding}")
    return "\n".join(parts)


class ExecutableCache:
    """Serialized compiled executables in one directory, one file per key."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory) / "executables"

    def key(self, description: str, args: Any) -> str:
        h = hashlib.sha256()
        for part in (_environment(), description, _describe_args(args)):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def load(self, key: str, devices: list | None = None):
        """The compiled executable stored under ``key``, loaded onto ``devices`` (the devices it runs on, in
        the order of its device assignment; default: the first device), or None (absent, or unreadable:
        then removed)."""
        from jax.experimental import serialize_executable

        path = self.directory / f"{key}.bin"
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        try:
            payload, in_tree, out_tree = pickle.loads(blob)
            return serialize_executable.deserialize_and_load(payload, in_tree, out_tree,
                                                             execution_devices=devices or jax.devices()[:1])
        except Exception as e:  # a truncated file or an incompatible runtime: recompile and rewrite
            warnings.warn(f"jaxinfer: ignoring an unreadable cached executable {path.name}: {e}", stacklevel=2)
            path.unlink(missing_ok=True)
            return None

    def store(self, key: str, compiled) -> bool:
        """Serialize ``compiled`` under ``key`` (atomically); False if this backend cannot serialize it."""
        from jax.experimental import serialize_executable

        try:
            blob = pickle.dumps(serialize_executable.serialize(compiled))
        except Exception as e:
            warnings.warn(f"jaxinfer: cannot serialize an executable for the compilation cache: {e}", stacklevel=2)
            return False
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, self.directory / f"{key}.bin")
        return True
