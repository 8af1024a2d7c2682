"""No import cycles among the bench modules.

The import graph is read from the source with ``ast`` (nothing is imported): every ``import bench.x``,
``from bench import x`` and ``from bench.x import ...``, at module level or inside a function (a cycle
hidden in a function-level import is still a cycle: it only fails later, or in another import order), and
``importlib.import_module("bench.x")``. A module that loads experiments through ``registry.load`` depends on
every module the registry's ``EXPERIMENTS`` table names. A cycle is a strongly connected component of more
than one module.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _registry_targets(pkg_dir: Path, package: str) -> set[str]:
    """Modules named by the string values of ``EXPERIMENTS = {...}`` in ``registry.py``."""
    path = pkg_dir / "registry.py"
    if not path.is_file():
        return set()
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            names = [t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                     if isinstance(t, ast.Name)]
            if "EXPERIMENTS" in names:
                targets |= {v.value.split(".")[1] for v in node.value.values if isinstance(v, ast.Constant)
                            and isinstance(v.value, str) and v.value.startswith(package + ".")}
    return targets


def _imports(tree: ast.AST, package: str, registry: set[str]) -> set[str]:
    """Names of the ``package`` modules this module imports, wherever the import statement stands."""
    deps = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == package and len(parts) > 1:
                    deps.add(parts[1])
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            if node.level == 1 and node.module:  # from .x import y
                deps.add(parts[0])
            elif node.level == 1 or (node.level == 0 and node.module == package):  # from . / from bench import x
                deps.update(alias.name for alias in node.names)
            elif node.level == 0 and parts[0] == package:  # from bench.x import y
                deps.add(parts[1])
            if node.level == 0 and node.module == f"{package}.registry" and any(a.name == "load" for a in node.names):
                deps |= registry
        elif isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == "import_module" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                parts = node.args[0].value.split(".")
                if parts[0] == package and len(parts) > 1:
                    deps.add(parts[1])
        elif (isinstance(node, ast.Attribute) and node.attr == "load" and isinstance(node.value, ast.Name)
              and node.value.id == "registry"):
            deps |= registry
    return deps


def import_graph(pkg_dir: Path, package: str = "bench") -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (itself and the package's ``__init__`` left out)."""
    modules = {p.stem for p in pkg_dir.glob("*.py")} - {"__init__"}
    registry = _registry_targets(pkg_dir, package)
    return {name: (_imports(ast.parse((pkg_dir / f"{name}.py").read_text(), name), package, registry) & modules)
            - {name} for name in sorted(modules)}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _write(pkg: Path, files: dict[str, str]) -> Path:
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / f"{name}.py").write_text(text)
    return pkg


def test_bench_modules_have_no_import_cycles():
    graph = import_graph(BENCH)
    # the graph is read, not empty: edges of each kind the reader handles are there
    assert "serve_http" in graph["serve"]  # from bench import x (module level)
    assert "workload" in graph["serve_http"]  # from bench.x import y
    assert "plots" in graph["prefix"]  # from bench import x inside a function
    assert {"phase1", "serve", "quant"} <= graph["cli"]  # registry.load(...) of the registry's table
    assert "registry" in graph["phase1"] and not graph["registry"]
    assert import_cycles(graph) == []


def test_detects_a_cycle_through_a_function_level_import(tmp_path):
    pkg = _write(tmp_path / "bench", {
        "a": "from bench import b\n",
        "b": "def f():\n    from bench.a import g\n    return g\n",
        "c": "import bench.a\n",
    })
    graph = import_graph(pkg)
    assert graph == {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert import_cycles(graph) == [["a", "b"]]


def test_detects_a_cycle_through_the_registry(tmp_path):
    """The shape of the old bench.cli <-> bench.phase1 cycle: the CLI loads every experiment, one experiment
    imports the CLI back (here inside a function)."""
    pkg = _write(tmp_path / "bench", {
        "registry": 'EXPERIMENTS = {"one": "bench.one", "two": "bench.two"}\n',
        "cli": "from bench import registry\nMODULES = [registry.load(n) for n in registry.EXPERIMENTS]\n",
        "one": "import importlib\nW = importlib.import_module('bench.two')\n",
        "two": "def run():\n    from bench import cli\n    return cli\n",
    })
    graph = import_graph(pkg)
    assert graph["cli"] == {"registry", "one", "two"} and graph["one"] == {"two"}
    assert import_cycles(graph) == [["cli", "one", "two"]]
    (pkg / "two.py").write_text("from bench import registry\nNAMES = set(registry.EXPERIMENTS)\n")
    assert import_cycles(import_graph(pkg)) == []


def test_detects_longer_cycles_and_relative_imports(tmp_path):
    pkg = _write(tmp_path / "bench", {
        "a": "from .b import x\n",
        "b": "from . import c\n",
        "c": "import bench.a as a\n",
        "d": "from bench import a, e\n",
        "e": "",
    })
    assert import_cycles(import_graph(pkg)) == [["a", "b", "c"]]
