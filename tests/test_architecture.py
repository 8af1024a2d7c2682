"""The architecture's import rules, checked on the source: ``bench -> jaxinfer -> {pallas_kernels,
sharding}``, the host side without JAX, no import cycles anywhere.

* no import cycle among the modules of jaxinfer, pallas_kernels, sharding and bench (imports at any level);
* ``pallas_kernels`` imports none of the engine's packages, ``sharding`` neither jaxinfer nor bench, and
  ``jaxinfer`` no bench module;
* ``jaxinfer.core`` (and the host-side half of ``jaxinfer.spec_decode``) imports and runs with JAX
  unavailable: a subprocess whose import system refuses jax, jaxlib, flax, optax and orbax.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.import_graph import import_cycles, import_graph

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("jaxinfer", "pallas_kernels", "sharding", "bench")
FORBIDDEN = {  # package -> packages none of its modules may import
    "pallas_kernels": ("jaxinfer", "sharding", "bench"),
    "sharding": ("jaxinfer", "bench"),
    "jaxinfer": ("bench",),
}
HOST_SIDE = ["jaxinfer.core", "jaxinfer.spec_decode.proposer", "jaxinfer.spec_decode.ngram",
             "jaxinfer.spec_decode.controller", "jaxinfer.spec_decode.speculator"]


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT, PACKAGES)


def test_the_graph_is_read_with_edges_of_every_kind(graph):
    assert len(graph) > 100
    assert "jaxinfer.runner.model_runner" in graph["jaxinfer.llm_engine"]  # from a.b import c
    assert "jaxinfer.core.request_io" in graph["jaxinfer.llm_engine"]  # from a import b (b a module)
    assert "jaxinfer.config.presets" in graph["jaxinfer.loading.model_source"]  # inside a function
    assert {"bench.phase1", "bench.serve", "bench.quant"} <= graph["bench.cli"]  # registry.load
    assert "bench.registry" in graph["bench.phase1"] and not graph["bench.registry"]


def test_no_import_cycles(graph):
    assert import_cycles(graph) == []


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(graph, package):
    offending = sorted(f"{m} imports {d}" for m, deps in graph.items() if m.split(".")[0] == package
                       for d in deps if d.split(".")[0] in FORBIDDEN[package])
    assert not offending, "\n".join(offending)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_detects_a_cycle_through_a_function_level_import(tmp_path):
    root = _write(tmp_path, {"pkg.__init__": "", "pkg.a": "from pkg import b\n",
                             "pkg.b": "def f():\n    from pkg.a import g\n    return g\n", "pkg.c": "import pkg.a\n"})
    graph = import_graph(root, ("pkg",))
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert import_cycles(graph) == [["pkg.a", "pkg.b"]]


def test_detects_a_cycle_through_a_registry_and_import_module(tmp_path):
    """The shape of the old bench.cli <-> bench.phase1 cycle: the CLI loads every experiment through the
    registry, one experiment imports the CLI back."""
    root = _write(tmp_path, {
        "pkg.__init__": "",
        "pkg.registry": 'EXPERIMENTS = {"one": "pkg.one", "two": "pkg.two"}\n',
        "pkg.cli": "from pkg import registry\nMODULES = [registry.load(n) for n in registry.EXPERIMENTS]\n",
        "pkg.one": "import importlib\nW = importlib.import_module('pkg.two')\n",
        "pkg.two": "def run():\n    from pkg import cli\n    return cli\n",
    })
    graph = import_graph(root, ("pkg",))
    assert graph["pkg.cli"] == {"pkg.registry", "pkg.one", "pkg.two"} and graph["pkg.one"] == {"pkg.two"}
    assert import_cycles(graph) == [["pkg.cli", "pkg.one", "pkg.two"]]
    (root / "pkg" / "two.py").write_text("from pkg import registry\nNAMES = set(registry.EXPERIMENTS)\n")
    assert import_cycles(import_graph(root, ("pkg",))) == []


def test_detects_cycles_across_subpackages_and_relative_imports(tmp_path):
    root = _write(tmp_path, {
        "pkg.__init__": "", "pkg.sub.__init__": "from .x import f\n", "pkg.sub.x": "from ..y import g\n",
        "pkg.y": "from pkg import sub\n", "pkg.z": "from pkg.sub import x\n",
    })
    graph = import_graph(root, ("pkg",))
    assert graph["pkg.z"] == {"pkg.sub.x"} and graph["pkg.sub.x"] == {"pkg.y"}
    assert import_cycles(graph) == [["pkg.sub", "pkg.sub.x", "pkg.y"]]


def test_a_forbidden_import_is_found(tmp_path):
    root = _write(tmp_path, {"sharding.__init__": "", "sharding.m": "def f():\n    import jaxinfer.model\n",
                             "jaxinfer.__init__": "", "jaxinfer.model": ""})
    graph = import_graph(root, ("sharding", "jaxinfer"))
    assert graph["sharding.m"] == {"jaxinfer.model"}


_WITHOUT_JAX = textwrap.dedent("""
    import importlib, importlib.abc, pkgutil, sys

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("jax", "jaxlib", "flax", "optax", "orbax"):
                raise ImportError(f"{name} is unavailable in this test")

    sys.meta_path.insert(0, Refuse())
    names = []
    for name in sys.argv[1:]:
        module = importlib.import_module(name)
        names.append(name)
        if hasattr(module, "__path__"):
            for info in pkgutil.walk_packages(module.__path__, name + "."):
                importlib.import_module(info.name)
                names.append(info.name)
    from jaxinfer.core.block_manager import BlockManager
    from jaxinfer.core.scheduler import Scheduler, SchedulerConfig
    from jaxinfer.core.sequence import Sequence
    from jaxinfer.sampling_params import SamplingParams
    sched = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64),
                      BlockManager(8, 16, True))
    sched.add(Sequence(0, "r", 0, list(range(20)), SamplingParams(max_tokens=4), 0, 0.0))
    plan = sched.schedule()
    assert [s.num_new_tokens for s in plan.scheduled] == [20], plan
    assert not [m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib")]
    print(len(names))
""")


def test_the_host_side_runs_without_jax():
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_JAX, *HOST_SIDE], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) >= 10  # every module of core/ and the host-side proposers
