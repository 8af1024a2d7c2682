"""Compile the C++ kernels (``matvec.cc``, ``gemm.cc``, ``gemm_amx.cc``, ``paged_attention.cc``,
``ragged_attention.cc``) once per machine into one shared library and register their handlers with XLA:CPU.

The library lives in ``<cache root>/cpu_ffi/<hash>/`` (``jaxinfer.envs.cache_root``: ``$JAXINFER_CACHE_DIR``,
else ``$XDG_CACHE_HOME/jaxinfer``, else ``~/.cache/jaxinfer``), the hash covering the sources, the compiler
command, jaxlib's version and the CPU (``-march=native`` code runs only where it was built), so a change to any
of them builds afresh; concurrent processes each build into a temporary name and rename it into place.
``JAXINFER_CPU_KERNELS=0`` turns the kernels off.

Building and loading happen only when asked, outside any trace: ``load()`` (the engine calls it when a CPU
engine starts), ``available()`` / ``unavailable_reason()`` (the same, for load-time callers), or an eager call of
a kernel. Code that runs while a function is traced asks ``loaded()`` only, which never builds anything.
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

from jaxinfer import envs

HERE = Path(__file__).parent
SOURCES = (HERE / "matvec.cc", HERE / "gemm.cc", HERE / "gemm_amx.cc", HERE / "paged_attention.cc",
           HERE / "ragged_attention.cc")
HEADERS = (HERE / "kernel_common.h",)
TARGETS = ("jaxinfer_matvec_f32", "jaxinfer_matvec_int8", "jaxinfer_matvec_e4m3", "jaxinfer_matvec_bf16",
           "jaxinfer_gemm_f32",
           "jaxinfer_gemm_int8", "jaxinfer_gemm_e4m3", "jaxinfer_gemm_amx_int8", "jaxinfer_gemm_amx_e4m3",
           "jaxinfer_paged_attention_f32", "jaxinfer_paged_attention_e4m3", "jaxinfer_ragged_attention_f32",
           "jaxinfer_ragged_attention_e4m3")
ENV_SWITCH = envs.CPU_KERNELS.name
AMX_SWITCH = envs.CPU_AMX.name


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


_FLAGS = ("-O3", "-march=native", "-std=c++17", "-fPIC", "-DNDEBUG")


def _compile_commands(compiler: str, output: Path) -> tuple[list[list[str]], list[str]]:
    """One command per source (they run side by side), writing ``<output>.<i>.o``, then the link into
    ``output``."""
    objects = [output.with_name(f"{output.name}.{i}.o") for i in range(len(SOURCES))]
    compiles = [[compiler, *_FLAGS, "-isystem", jax.ffi.include_dir(), "-c", str(src), "-o", str(obj)]
                for src, obj in zip(SOURCES, objects)]
    return compiles, [compiler, "-shared", *map(str, objects), "-o", str(output)]


def _run_all(commands: list[list[str]], timeout: float) -> str:
    """"" once every command succeeded (started together), else the first failure's stderr."""
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in commands]
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            err = f"timed out after {timeout} s\n{err}"
        if p.returncode != 0:
            errors.append(f"{p.args[0]} exited with status {p.returncode}\n{err}")
    return errors[0] if errors else ""


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return "\n".join(sorted({ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))}))


def _cache_root() -> Path:
    return envs.cache_root() / "cpu_ffi"


def switched_off() -> bool:
    """``JAXINFER_CPU_KERNELS=0`` (``jaxinfer.envs``): the global off switch, read on every call."""
    return not envs.cpu_kernels_enabled()


def compiler() -> str | None:
    """The C++ compiler the kernels are built with (``$CXX``, ``c++``, ``g++`` or ``clang++``), or None."""
    return _compiler()


@functools.cache
def _build() -> tuple[Path | None, str]:
    """(path of the built library, "") or (None, why not)."""
    import jaxlib

    compiler = _compiler()
    if compiler is None:
        return None, "no C++ compiler found (set CXX, or install g++ / clang++)"
    h = hashlib.sha256()
    sources = [p.read_bytes() for p in SOURCES + HEADERS]
    compiles, link = _compile_commands(compiler, Path("x"))
    for part in (*sources, repr((compiles, link)).encode(), jaxlib.__version__.encode(),
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
    compiles, link = _compile_commands(compiler, partial)
    try:
        error = _run_all(compiles, timeout=300) or _run_all([link], timeout=120)
        if error:
            return None, f"compiling {', '.join(p.name for p in SOURCES)} failed:\n{error[-2000:]}"
        os.replace(partial, library)
    except OSError as e:
        return None, f"compiling {', '.join(p.name for p in SOURCES)} failed: {e}"
    finally:
        partial.unlink(missing_ok=True)
        for obj in partial.parent.glob(partial.name + ".*.o"):
            obj.unlink(missing_ok=True)
    return library, ""


@functools.cache
def _library() -> ctypes.CDLL:
    return ctypes.cdll.LoadLibrary(str(_build()[0]))


@functools.cache
def _register() -> str:
    """"" once the handlers are registered with XLA:CPU, else why they are not (builds the library first)."""
    library, reason = _build()
    if library is None:
        return reason
    try:
        lib = _library()
        for name in TARGETS:
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
    except Exception as e:  # a library built for another jaxlib or CPU, or an unloadable one
        return f"loading {library} failed: {e}"
    return ""


def _registered() -> bool:
    """Whether ``_register`` already ran in this process and succeeded (never runs it)."""
    return _register.cache_info().currsize > 0 and _register() == ""


def unavailable_reason() -> str | None:
    """None when the kernels can be used in this process (building and registering them now if needed),
    else why not. Never call it inside a jit trace: use ``loaded()`` there."""
    if switched_off():
        return f"{ENV_SWITCH}=0"
    if "cpu" not in {d.platform for d in jax.devices("cpu")}:
        return "no CPU backend"
    reason = _register()
    return reason or None


def load() -> bool:
    """Build the kernels (the first time on this machine: a few seconds; then a cached library) and register
    them with XLA:CPU now, outside any trace; True if they are usable in this process. Quiet: a failure is
    reported by ``unavailable_reason()``. The engine calls it when a CPU engine starts; JAX users calling the
    jitted model functions directly call it (or ``jaxinfer.model.attention.resolve_attention_backend``) before
    tracing, else the traced functions keep their XLA formulations."""
    return unavailable_reason() is None


def loaded() -> bool:
    """Whether the kernels are registered in this process and switched on: what trace-time code asks (it
    never builds or loads anything)."""
    return not switched_off() and _registered()


def available() -> bool:
    """``load()``, warning once when a build fails (not when they are switched off)."""
    reason = unavailable_reason()
    if reason is not None and not switched_off():
        _warn_once(reason)
    return reason is None


@functools.cache
def _warn_once(reason: str) -> None:
    warnings.warn(f"jaxinfer: the C++ CPU kernels are unavailable, using pure XLA instead: {reason}",
                  stacklevel=3)


@functools.cache
def _cpu_has_amx() -> bool:
    return bool(_library().jaxinfer_amx_available())


def amx_loaded() -> bool:
    """Trace-time: the kernels are loaded (``loaded()``) and this CPU and OS let the process use AMX tiles,
    unless ``JAXINFER_CPU_AMX=0``."""
    return envs.cpu_amx_enabled() and loaded() and _cpu_has_amx()


def amx_available() -> bool:
    """True if the kernels are available (loading them now if needed, like ``available()``) and this CPU and
    OS let the process use AMX tiles (Intel Sapphire Rapids and later; Linux grants the permission on
    request), unless ``JAXINFER_CPU_AMX=0``."""
    if not envs.cpu_amx_enabled():
        return False
    return available() and _cpu_has_amx()


def fingerprint() -> str:
    """What executables traced in this process depend on: "off", or the loaded library's name (part of the
    compilation-cache key, so executables with and without the kernels never mix). Off unless the default
    backend is the CPU (the engine uses the kernels only there) and the kernels are loaded; never builds."""
    if jax.default_backend() != "cpu" or not loaded():
        return "off"
    return _build()[0].parent.name + ("-amx" if amx_loaded() else "")


def library_path() -> Path | None:
    """The shared library the loaded kernels come from, or None when they are not loaded."""
    return _build()[0] if loaded() else None


def _is_traced(arrays) -> bool:
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def require(*arrays) -> None:
    """Make sure the kernels can be called with ``arrays``: loaded already, or loaded now when none of them is
    a tracer (an eager call: outside any trace). RuntimeError saying why they cannot be used, and inside a
    trace when they were never loaded (call ``load()`` first)."""
    if loaded():
        return
    if _is_traced(arrays) and not switched_off():
        raise RuntimeError("the C++ CPU kernels are not loaded in this process, and they are never built inside "
                           "a jit trace: call jaxinfer.cpu.ffi.load() before tracing")
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"the C++ CPU kernels are unavailable: {reason}")


def ensure_loaded_for(*arrays) -> bool:
    """Whether a product or attention call with ``arrays`` may use the kernels: ``loaded()``, or for an eager
    call (no tracer among ``arrays``) ``available()`` (building and loading them now, the first time)."""
    if loaded():
        return True
    return not _is_traced(arrays) and not switched_off() and available()
