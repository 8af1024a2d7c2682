"""``jaxinfer.envs``: every JAXINFER_* variable declared once, parsed when asked (monkeypatch takes effect at once),
defaults, clear errors for bad values, the one cache root (JAXINFER_CACHE_DIR, then XDG_CACHE_HOME, then
~/.cache), and every reader in the code going through it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jaxinfer import envs
from jaxinfer.cpu import host_allocator
from jaxinfer.cpu.ffi import build
from jaxinfer.loading import model_source
from jaxinfer.runner import compile_cache

ROOT = Path(__file__).resolve().parents[1]
BOOLS = [v for v in envs.ENV_VARS if v.kind == "bool"]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for var in envs.ENV_VARS:
        monkeypatch.delenv(var.name, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)


def test_every_variable_is_declared_once_with_a_type_default_and_meaning():
    names = [v.name for v in envs.ENV_VARS]
    assert len(names) == len(set(names)) and all(n.startswith("JAXINFER_") for n in names)
    for var in envs.ENV_VARS:
        assert var.kind in envs.KINDS and var.meaning and var.read_by
        assert envs.declared(var.name) is var
    with pytest.raises(KeyError, match="not a declared"):
        envs.declared("JAXINFER_NOPE")


def test_every_jaxinfer_variable_in_the_code_is_declared():
    """Each JAXINFER_<NAME> that the Python code, the bench scripts or the tests mention is declared here
    (the C++ macro prefix JAXINFER_ of the kernels' sources is not a variable)."""
    declared = {v.name for v in envs.ENV_VARS}
    found = set()
    for folder in ("jaxinfer", "bench", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh") and path.is_file():
                found |= set(re.findall(r"\bJAXINFER_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    assert found - {"JAXINFER_NOPE", "JAXINFER_TYPO"} <= declared, found - declared


def test_no_reader_parses_a_declared_variable_itself():
    for path in (ROOT / "jaxinfer").rglob("*.py"):
        if path.name == "envs.py":
            continue
        text = path.read_text()
        assert not re.search(r"environ(\.get)?\(?\[?[\"']JAXINFER_", text), path
        assert not re.search(r"getenv\([\"']JAXINFER_", text), path


def test_defaults_when_unset_and_when_empty(monkeypatch):
    for var in envs.ENV_VARS:
        assert envs.get(var.name) == var.default and not var.is_set()
        monkeypatch.setenv(var.name, "  ")  # empty counts as unset
        assert envs.get(var.name) == var.default and not var.is_set()
    assert envs.set_variables() == []
    assert envs.compilation_cache_enabled() and envs.cpu_kernels_enabled() and envs.cpu_amx_enabled()
    assert envs.cpu_malloc_tuning_enabled() and envs.default_model_override() is None


@pytest.mark.parametrize("var", BOOLS, ids=[v.name for v in BOOLS])
@pytest.mark.parametrize("text, value", [("1", True), ("true", True), ("Yes", True), (" ON ", True),
                                         ("0", False), ("false", False), ("NO", False), ("off", False)])
def test_booleans(monkeypatch, var, text, value):
    monkeypatch.setenv(var.name, text)
    assert var.get() is value and envs.get(var.name) is value
    assert var in envs.set_variables()


@pytest.mark.parametrize("var", BOOLS, ids=[v.name for v in BOOLS])
def test_a_bad_boolean_is_a_clear_error(monkeypatch, var):
    monkeypatch.setenv(var.name, "maybe")
    with pytest.raises(ValueError, match=rf"{var.name}='maybe' is not a boolean: set it to 1 or 0"):
        var.get()


def test_each_accessor_reads_its_variable_when_asked(monkeypatch, tmp_path):
    pairs = [("JAXINFER_COMPILATION_CACHE", envs.compilation_cache_enabled, compile_cache.cache_enabled_by_env),
             ("JAXINFER_CPU_KERNELS", envs.cpu_kernels_enabled, lambda: not build.switched_off()),
             ("JAXINFER_CPU_AMX", envs.cpu_amx_enabled, None),
             ("JAXINFER_CPU_MALLOC_TUNING", envs.cpu_malloc_tuning_enabled, None)]
    for name, accessor, reader in pairs:
        for text, value in (("0", False), ("1", True)):
            monkeypatch.setenv(name, text)  # no import-time caching: the next call sees it
            assert accessor() is value
            if reader is not None:
                assert reader() is value
    monkeypatch.setenv("JAXINFER_CPU_MALLOC_TUNING", "off")
    assert host_allocator.keep_freed_memory_in_heap() is False
    monkeypatch.setenv("JAXINFER_CPU_KERNELS", "no")
    assert build.unavailable_reason() == "JAXINFER_CPU_KERNELS=0" and not build.loaded()


def test_paths_and_ints(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXINFER_DEFAULT_MODEL", "~/models/m")
    assert envs.default_model_override() == Path.home() / "models" / "m"
    monkeypatch.setenv("JAXINFER_DEFAULT_MODEL", str(tmp_path))  # no config.json there
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        model_source.default_model_dir()
    monkeypatch.setenv("JAXINFER_SUITE_BUDGET_S", "900")
    assert envs.get("JAXINFER_SUITE_BUDGET_S") == 900
    monkeypatch.setenv("JAXINFER_SUITE_BUDGET_S", "9m")
    with pytest.raises(ValueError, match=r"JAXINFER_SUITE_BUDGET_S='9m' is not an integer"):
        envs.get("JAXINFER_SUITE_BUDGET_S")


def test_the_one_cache_root(monkeypatch, tmp_path):
    assert envs.cache_root() == Path.home() / ".cache" / "jaxinfer"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert envs.cache_root() == tmp_path / "xdg" / "jaxinfer"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # the XDG spec: relative paths are ignored
    assert envs.cache_root() == Path.home() / ".cache" / "jaxinfer"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("JAXINFER_CACHE_DIR", str(tmp_path / "mine"))  # the explicit root wins
    assert envs.cache_root() == tmp_path / "mine"
    monkeypatch.setenv("JAXINFER_CACHE_DIR", "")
    assert envs.cache_root() == tmp_path / "xdg" / "jaxinfer"


def test_both_caches_live_under_the_one_root(monkeypatch, tmp_path):
    """The compilation cache and the built C++ kernels share the root: with only XDG_CACHE_HOME set, both
    follow it (the kernels' build directory used to ignore it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.default_cache_dir() == tmp_path / "jaxinfer"
    assert build._cache_root() == tmp_path / "jaxinfer" / "cpu_ffi"
    assert compile_cache.ExecutableCache(compile_cache.default_cache_dir()).directory == \
        tmp_path / "jaxinfer" / "executables"


def test_undeclared_variables_are_reported(monkeypatch):
    monkeypatch.setenv("JAXINFER_TYPO", "1")
    assert envs.undeclared_set_variables() == ["JAXINFER_TYPO"]


def test_the_readme_table_is_generated_from_the_declarations():
    table = envs.markdown_table()
    assert table.count("\n") == len(envs.ENV_VARS) + 1
    assert table in (ROOT / "README.md").read_text()
