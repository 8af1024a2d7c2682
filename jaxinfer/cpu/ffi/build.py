"""Compile the C++ kernels (``matvec.cc``, ``gemm.cc``, ``gemm_amx.cc``, ``paged_attention.cc``,
``ragged_attention.cc``) once per machine into one shared library and register their handlers with XLA:CPU.

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
SOURCES = (HERE / "matvec.cc", HERE / "gemm.cc", HERE / "gemm_amx.cc", HERE / "paged_attention.cc",
           HERE / "ragged_attention.cc")
HEADERS = (HERE / "kernel_common.h",)
TARGETS = ("jaxinfer_matvec_f32", "jaxinfer_matvec_int8", "jaxinfer_matvec_e4m3", "jaxinfer_gemm_f32",
           "jaxinfer_gemm_int8", "jaxinfer_gemm_e4m3", "jaxinfer_gemm_amx_int8", "jaxinfer_gemm_amx_e4m3",
           "jaxinfer_paged_attention_f32", "jaxinfer_paged_attention_e4m3", "jaxinfer_ragged_attention_f32",
           "jaxinfer_ragged_attention_e4m3")
ENV_SWITCH = "JAXINFER_CPU_KERNELS"
AMX_SWITCH = "JAXINFER_CPU_AMX"


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
    """"" once the handlers are registered with XLA:CPU, else why they are not."""
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


@functools.cache
def _cpu_has_amx() -> bool:
    return bool(_library().jaxinfer_amx_available())


def amx_available() -> bool:
    """True if the kernels are available and this CPU and OS let the process use AMX tiles (Intel Sapphire
    Rapids and later; Linux grants the permission on request), unless ``JAXINFER_CPU_AMX=0``."""
    if os.environ.get(AMX_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return available() and _cpu_has_amx()


def fingerprint() -> str:
    """What executables traced in this process depend on: "off", or the built library's name (part of the
    compilation-cache key, so executables with and without the kernels never mix). Off unless the default
    backend is the CPU (the engine uses the kernels only there)."""
    if jax.default_backend() != "cpu" or not available():
        return "off"
    return _build()[0].parent.name + ("-amx" if amx_available() else "")


def require() -> None:
    """Build and register the kernels now if needed; RuntimeError saying why if they cannot be used."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"the C++ CPU kernels are unavailable: {reason}")
