"""``jaxinfer env`` through ``jaxinfer.cli.main``: the text and ``--json`` reports, the variables that are set with
their declared meaning, and a report that still comes out when things are missing (no compiler, no cache
directory, kernels switched off, a malformed variable)."""

from __future__ import annotations

import json

import jax
import jaxlib
import pytest

from jaxinfer import cli, envs
from jaxinfer.cpu import ffi as cpu_ffi
from jaxinfer.cpu.ffi import build


@pytest.fixture(autouse=True)
def _kernels_loaded():
    assert cpu_ffi.load()  # in the suite's cache root, before a test moves the root elsewhere


def _run(capsys, *args) -> str:
    assert cli.main(["env", *args]) == 0
    return capsys.readouterr().out


def test_text_report(capsys, monkeypatch):
    monkeypatch.setenv("JAXINFER_CPU_AMX", "0")
    monkeypatch.setenv("JAXINFER_TYPO", "1")
    out = _run(capsys)
    for heading in ("Versions", "Platform", "Attention backend", "C++ CPU kernels", "Caches",
                    "Environment (JAXINFER_*)"):
        assert heading in out
    assert f"jax:                   {jax.__version__}" in out and f"jaxlib:                {jaxlib.__version__}" in out
    assert "auto picks:            cpu" in out  # kernels load on this machine (CI has a compiler)
    assert "loaded:                yes" in out and "matvec_f32" in out and "off (JAXINFER_CPU_AMX=0)" in out
    assert str(envs.cache_root()) in out
    assert "JAXINFER_CPU_AMX=0" in out and envs.CPU_AMX.meaning in out
    assert "JAXINFER_TYPO=1  (not a jaxinfer variable: a typo?)" in out


def test_json_report(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("JAXINFER_CACHE_DIR", str(tmp_path))
    (tmp_path / "executables").mkdir()
    (tmp_path / "executables" / "a.bin").write_bytes(b"x" * 1000)
    report = json.loads(_run(capsys, "--json"))
    assert set(report) == {"versions", "platform", "attention_backend", "cpu_kernels", "cache", "environment"}
    assert report["versions"]["jax"] == jax.__version__ and report["versions"]["python"]
    assert report["platform"]["jax_backend"] == "cpu" and report["platform"]["num_devices"] >= 1
    assert report["attention_backend"] == {"auto": "cpu", "choices": ["auto", "pallas", "xla", "cpu"]}
    kernels = report["cpu_kernels"]
    assert kernels["loaded"] and kernels["reason"] is None and kernels["compiler"]
    assert kernels["kernels"] == list(build.TARGETS) and kernels["amx"] == build.amx_loaded()
    cache = report["cache"]
    assert cache["root"] == str(tmp_path) and cache["compilation_cache_enabled"] is True
    assert cache["executables"] == {"dir": str(tmp_path / "executables"), "exists": True, "files": 1, "bytes": 1000}
    assert cache["cpu_kernels"]["exists"] is False  # the kernels loaded from the suite's root; none built here
    rows = {row["name"]: row for row in report["environment"]["set"]}
    assert rows["JAXINFER_CACHE_DIR"]["parsed"] == str(tmp_path)
    assert rows["JAXINFER_CACHE_DIR"]["meaning"] == envs.CACHE_DIR.meaning


def test_nothing_missing_makes_it_fail(capsys, monkeypatch, tmp_path):
    """No compiler, kernels not loadable, an absent cache root: the report says so, and auto picks xla."""
    reason = "no C++ compiler found (set CXX, or install g++ / clang++)"
    monkeypatch.setattr(build, "_compiler", lambda: None)
    monkeypatch.setattr(build, "loaded", lambda: False)
    for module in (build, cpu_ffi):
        monkeypatch.setattr(module, "unavailable_reason", lambda: reason)
    monkeypatch.setenv("JAXINFER_CACHE_DIR", str(tmp_path / "absent"))
    report = json.loads(_run(capsys, "--json"))
    assert report["attention_backend"]["auto"] == "xla"
    assert report["cpu_kernels"]["compiler"] is None and report["cpu_kernels"]["reason"] == reason
    assert not report["cpu_kernels"]["loaded"] and report["cpu_kernels"]["library"] is None
    assert report["cache"]["root_exists"] is False and report["cache"]["executables"]["files"] == 0
    out = _run(capsys)
    assert "none found (set CXX" in out and f"no: {reason}" in out and "(absent)" in out
    assert not (tmp_path / "absent").exists()  # reporting creates nothing


def test_switched_off_and_a_malformed_variable(capsys, monkeypatch):
    monkeypatch.setenv("JAXINFER_CPU_KERNELS", "0")
    report = json.loads(_run(capsys, "--json"))
    assert report["attention_backend"]["auto"] == "xla"
    assert report["cpu_kernels"]["reason"] == "JAXINFER_CPU_KERNELS=0" and report["cpu_kernels"]["amx"] is False
    monkeypatch.setenv("JAXINFER_CPU_KERNELS", "maybe")
    monkeypatch.setenv("JAXINFER_COMPILATION_CACHE", "sometimes")
    report = json.loads(_run(capsys, "--json"))  # still a report: the sections that read it carry the error
    assert "is not a boolean" in report["attention_backend"]["error"]
    assert "is not a boolean" in report["cpu_kernels"]["error"]
    assert "is not a boolean" in report["cache"]["compilation_cache_enabled"]
    rows = {row["name"]: row for row in report["environment"]["set"]}
    assert "JAXINFER_CPU_KERNELS='maybe' is not a boolean" in rows["JAXINFER_CPU_KERNELS"]["error"]
    out = _run(capsys)
    assert "error: ValueError: JAXINFER_CPU_KERNELS='maybe' is not a boolean" in out
    assert "JAXINFER_CPU_KERNELS=maybe  ERROR:" in out
