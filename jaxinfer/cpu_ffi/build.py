"""Compile the C++ kernels (``matvec.cc``, ``gemm.cc``, ``paged_attention.cc``) once per machine into one shared library and
register their handlers with XLA:CPU.

The library lives in ``$JAXINFER_CACHE_DIR/cpu_ffi/<hash>/`` (default ``~/.cache/jaxinfer``), the hash
covering the sources, the compiler command, jaxlib's version and the CPU (``-march=native`` code runs only
where it was built), so a change to any of them builds afresh; concurrent processes each build into a
temporary name and rename it into place. ``JAXINFER_CPU_KERNELS=0`` turns the kernels off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax

HERE = Path(__file__).parent
SOURCES = (HERE / "matvec.cc", HERE / "gemm.cc", HERE / "paged_attention.cc")
HEADERS = (HERE / "kernel_common.h",)
TARGETS = ("jaxinfer_matvec_f32", "jaxinfer_matvec_int8", "jaxinfer_matvec_e4m3", "jaxinfer_gemm_f32",
           "jaxinfer_gemm_int8", "jaxinfer_gemm_e4m3", "jaxinfer_paged_attention_f32", "jaxinfer_paged_attention_e4m3")
ENV_SWITCH = "JAXINFER_CPU_KERNELS"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _command(compiler: str, output: Path) -> list[str]:
    return [compiler, "-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-DNDEBUG",
            "-isystem", jax.ffi.include_dir(), *map(str, SOURCES), "-o", str(output)]


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return "\n".join(sorted({ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))}))


def _cache_root() -> Path:
    return Path(os.environ.get("JAXINFER_CACHE_DIR", Path.home() / ".cache" / "jaxinfer")) / "cpu_ffi"


def switched_off() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


@functools.cache
def _build() -> tuple[Path | None, str]:
    """(path of the built library, "") or (None, why not)."""
    import jaxlib

    compiler = _compiler()
    if compiler is None:
        return None, "no C++ compiler found (set CXX, or install g++ / clang++)"
    h = hashlib.sha256()
    sources = [p.read_bytes() for p in SOURCES + HEADERS]
    for part in (*sources, " ".join(_command(compiler, Path("x"))).encode(), jaxlib.__version__.encode(),
                 platform.machine().encode(), _cpu_flags().encode()):
        h.update(part)
        h.update(b"\0")
    directory = _cache_root() / h.hexdigest()[:16]
    library = directory / "libjaxinfer_cpu.so"
    if library.is_file():
        return library, ""
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        done = subprocess.run(_command(compiler, partial), capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            return None, f"compiling {', '.join(p.name for p in SOURCES)} failed:\n{done.stderr[-2000:]}"
        os.replace(partial, library)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"compiling {', '.join(p.name for p in SOURCES)} failed: {e}"
    finally:
        partial.unlink(missing_ok=True)
    return library, ""


@functools.cache
def _register() -> str:
    """"" once the handlers are registered with XLA:CPU, else why they are not."""
    library, reason = _build()
    if library is None:
        return reason
    try:
        lib = ctypes.cdll.LoadLibrary(str(library))
        for name in TARGETS:
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
    except Exception as e:  # a library built for another jaxlib or CPU, or an unloadable one
        return f"loading {library} failed: {e}"
    return ""


def unavailable_reason() -> str | None:
    """None when the kernels can be used in this process (building and registering them now if needed),
    else why not."""
    if switched_off():
        return f"{ENV_SWITCH}=0"
    if "cpu" not in {d.platform for d in jax.devices("cpu")}:
        return "no CPU backend"
    reason = _register()
    return reason or None


def available() -> bool:
    """True if the kernels can be used in this process: switched on, built (now, the first time: a few
    seconds) and registered. A build failure is warned about once, and False is returned."""
    reason = unavailable_reason()
    if reason is not None and not switched_off():
        _warn_once(reason)
    return reason is None


@functools.cache
def _warn_once(reason: str) -> None:
    warnings.warn(f"jaxinfer: the C++ CPU kernels are unavailable, using XLA's matmuls instead: {reason}",
                  stacklevel=3)


def fingerprint() -> str:
    """What executables traced in this process depend on: "off", or the built library's name (part of the
    compilation-cache key, so executables with and without the kernels never mix). Off unless the default
    backend is the CPU (the engine uses the kernels only there)."""
    if jax.default_backend() != "cpu" or not available():
        return "off"
    return _build()[0].parent.name


def require() -> None:
    """Build and register the kernels now if needed; RuntimeError saying why if they cannot be used."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"the C++ CPU kernels are unavailable: {reason}")
