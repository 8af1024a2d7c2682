"""``jaxinfer env``: what this machine and process give jaxinfer, for bug reports (the idea of vLLM's
``collect_env``).

It reports the versions (jaxinfer, jax, jaxlib, numpy, Python), the platform and JAX's devices, the attention
backend ``"auto"`` resolves to here, the C++ CPU kernels (switched on, the compiler found, built and loaded or
why not, AMX), the cache root with the compilation cache and the built kernels in it (and their sizes), and
every ``JAXINFER_*`` variable that is set, with its declared meaning (``jaxinfer.envs``). Resolving ``"auto"``
builds and loads the kernels if they are not built yet, as an engine start would.

Nothing here may fail: each section is collected on its own, and a section that raises (no compiler, no
cache directory, a malformed variable) reports its error instead of stopping the report. ``collect()`` returns
the report as a dict (``--json`` prints it), ``format_text(report)`` the human-readable form.
"""

from __future__ import annotations

import json
import os
import platform as platform_module
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

OTHER_VARIABLES = ("JAX_PLATFORMS", "XLA_FLAGS", "CXX", "XDG_CACHE_HOME")  # not ours, but they change what runs


def _safe(section: Callable[[], dict]) -> dict:
    try:
        return section()
    except Exception as e:  # a report must come out whatever is missing
        return {"error": f"{type(e).__name__}: {e}"}


def package_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or None."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _versions() -> dict:
    import jax
    import jaxlib
    import numpy

    return {"jaxinfer": package_version("jaxinfer"), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "numpy": numpy.__version__, "python": platform_module.python_version()}


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform_module.processor() or "unknown"


def _platform() -> dict:
    import jax

    devices = [{"id": d.id, "platform": d.platform, "kind": d.device_kind} for d in jax.devices()]
    return {"os": platform_module.platform(), "machine": platform_module.machine(), "cpu": cpu_model(),
            "cpu_count": os.cpu_count(), "jax_backend": jax.default_backend(), "num_devices": len(devices),
            "devices": devices}


def _attention_backend() -> dict:
    import jax

    from jaxinfer.config.engine import ATTENTION_BACKENDS
    from jaxinfer.model.attention import resolve_attention_backend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a failed kernel build: the kernels section says why
        auto = resolve_attention_backend("auto", jax.default_backend())
    return {"auto": auto, "choices": list(ATTENTION_BACKENDS)}


def _compiler_version(compiler: str) -> str | None:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0] if out.returncode == 0 and lines else None


def _cpu_kernels() -> dict:
    from jaxinfer import envs
    from jaxinfer.cpu.ffi import build

    compiler = build.compiler()
    info: dict[str, Any] = {"switched_on": envs.cpu_kernels_enabled(), "compiler": None, "compiler_version": None}
    if compiler is not None:
        import shutil

        info["compiler"] = shutil.which(compiler) or compiler
        info["compiler_version"] = _compiler_version(compiler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reason = build.unavailable_reason()  # loads them if they are not loaded yet (never inside a trace)
    info["loaded"] = reason is None
    info["reason"] = reason
    library = build.library_path()
    info["library"] = str(library) if library is not None else None
    info["kernels"] = list(build.TARGETS) if reason is None else []
    info["amx_switched_on"] = envs.cpu_amx_enabled()
    info["amx"] = reason is None and build.amx_loaded()
    return info


def _tree_size(path: Path) -> tuple[int, int]:
    """(files, bytes) under ``path`` (0, 0 when it does not exist)."""
    files = size = 0
    if path.is_dir():
        for p in path.rglob("*"):
            try:
                if p.is_file():
                    files += 1
                    size += p.stat().st_size
            except OSError:
                continue
    return files, size


def _cache() -> dict:
    from jaxinfer import envs

    root = envs.cache_root()
    out: dict[str, Any] = {"root": str(root), "root_exists": root.is_dir()}
    try:
        out["compilation_cache_enabled"] = envs.compilation_cache_enabled()
    except ValueError as e:
        out["compilation_cache_enabled"] = f"error: {e}"
    for name, sub in (("executables", "executables"), ("cpu_kernels", "cpu_ffi")):
        files, size = _tree_size(root / sub)
        out[name] = {"dir": str(root / sub), "exists": (root / sub).is_dir(), "files": files, "bytes": size}
    return out


def _variables() -> dict:
    from jaxinfer import envs

    rows = []
    for var in envs.set_variables():
        row: dict[str, Any] = {"name": var.name, "value": var.raw(), "type": var.kind, "meaning": var.meaning}
        try:
            value = var.get()
            row["parsed"] = str(value) if isinstance(value, Path) else value
        except ValueError as e:
            row["error"] = str(e)
        rows.append(row)
    other = {name: os.environ[name] for name in OTHER_VARIABLES if os.environ.get(name)}
    return {"set": rows, "undeclared": envs.undeclared_set_variables(), "other": other}


def collect() -> dict:
    """The whole report as a JSON-serialisable dict (one key per section)."""
    return {"versions": _safe(_versions), "platform": _safe(_platform),
            "attention_backend": _safe(_attention_backend), "cpu_kernels": _safe(_cpu_kernels),
            "cache": _safe(_cache), "environment": _safe(_variables)}


def _size_text(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _lines(title: str, section: dict, fields: list[tuple[str, Callable[[dict], Any]]]) -> list[str]:
    out = [title]
    if "error" in section:
        return out + [f"  error: {section['error']}"]
    for label, get in fields:
        try:
            value = get(section)
        except Exception as e:  # a field a partial section lacks
            value = f"unknown ({type(e).__name__})"
        out.append(f"  {label + ':':<22} {value}")
    return out


def _yes(b) -> str:
    return "yes" if b is True else "no" if b is False else str(b)


def _on(b) -> str:
    return "on" if b is True else "off" if b is False else str(b)


def format_text(report: dict) -> str:
    """The report for people: one block per section."""
    v, p, a = report["versions"], report["platform"], report["attention_backend"]
    k, c, e = report["cpu_kernels"], report["cache"], report["environment"]
    lines = _lines("Versions", v, [(name, lambda s, n=name: s.get(n) or "not installed")
                                   for name in ("jaxinfer", "jax", "jaxlib", "numpy", "python")])
    lines += _lines("Platform", p, [
        ("os", lambda s: s["os"]), ("cpu", lambda s: f"{s['cpu']} ({s['cpu_count']} cores)"),
        ("jax backend", lambda s: s["jax_backend"]),
        ("devices", lambda s: ", ".join(f"{d['platform']}:{d['id']} ({d['kind']})" for d in s["devices"]))])
    lines += _lines("Attention backend", a, [
        ("auto picks", lambda s: s["auto"]), ("choices", lambda s: ", ".join(s["choices"]))])
    lines += _lines("C++ CPU kernels", k, [
        ("switched on", lambda s: _yes(s["switched_on"])),
        ("compiler", lambda s: f"{s['compiler']} ({s['compiler_version'] or 'version unknown'})"
         if s["compiler"] else "none found (set CXX, or install g++ / clang++)"),
        ("loaded", lambda s: "yes" if s["loaded"] else f"no: {s['reason']}"),
        ("library", lambda s: s["library"] or "-"),
        ("kernels", lambda s: ", ".join(n.removeprefix("jaxinfer_") for n in s["kernels"]) or "-"),
        ("AMX", lambda s: "active" if s["amx"] else "off (JAXINFER_CPU_AMX=0)" if not s["amx_switched_on"]
         else "not usable on this CPU / OS" if s["loaded"] else "-")])

    def where(d):
        return f"{d['dir']} ({d['files']} files, {_size_text(d['bytes'])})" if d["exists"] else f"{d['dir']} (absent)"

    lines += _lines("Caches", c, [
        ("root", lambda s: s["root"] + ("" if s["root_exists"] else " (absent)")),
        ("compilation cache", lambda s: f"{_on(s['compilation_cache_enabled'])}, {where(s['executables'])}"),
        ("built kernels", lambda s: where(s["cpu_kernels"]))])
    lines.append("Environment (JAXINFER_*)")
    if "error" in e:
        lines.append(f"  error: {e['error']}")
    else:
        for row in e["set"]:
            state = f"  ERROR: {row['error']}" if "error" in row else ""
            lines.append(f"  {row['name']}={row['value']}{state}")
            lines.append(f"      {row['meaning']}")
        if not e["set"]:
            lines.append("  (none set)")
        for name in e["undeclared"]:
            lines.append(f"  {name}={os.environ.get(name, '')}  (not a jaxinfer variable: a typo?)")
        for name, value in e["other"].items():
            lines.append(f"  other: {name}={value}")
    return "\n".join(lines)


def main(as_json: bool = False, out=None) -> int:
    """Print the report (``as_json``: as one JSON object) to ``out`` (default stdout)."""
    out = sys.stdout if out is None else out
    report = collect()
    print(json.dumps(report, indent=2) if as_json else format_text(report), file=out)
    return 0
