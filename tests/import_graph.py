"""The import graph of the project's packages, read from the source with ``ast`` (nothing is imported).

Every import counts wherever it stands (module level, inside a function: a cycle hidden in a function-level
import is still a cycle, it only fails later or in another import order): ``import a.b``, ``from a import b``
(``a.b`` when it is a module, else ``a``), ``from .b import c`` (resolved), ``importlib.import_module("a.b")``
and ``__import__("a.b")``. A module that loads through a ``registry`` module's ``load`` depends on every
module whose name that registry spells out as a string (``bench.registry``'s experiment table). The parent
packages Python imports first are left out: they are edges of every module, and a cycle through an
``__init__`` shows as the edges that ``__init__`` itself makes.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``*.py`` under ``root/<package>``."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, str | None]]:
    """(module, name) of every import in this module's code, absolute: ``(a.b, None)`` for ``import a.b``
    or ``import_module("a.b")``, ``(a, b)`` for ``from a import b``."""
    found: list[tuple[str, str | None]] = []
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here[: len(here) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            found += [(base, alias.name) for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            fname = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if fname in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.args[0].value, None))
    return found


def _uses_registry_load(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "load" and isinstance(node.value, ast.Name)
                and node.value.id == "registry"):
            return True
        if (isinstance(node, ast.ImportFrom) and (node.module or "").endswith("registry")
                and any(a.name == "load" for a in node.names)):
            return True
    return False


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the modules of ``packages`` it imports (itself and its parent packages left out)."""
    modules = module_files(root, packages)
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in modules.items()}
    registry_targets = {
        m: {c.value for c in ast.walk(t) if isinstance(c, ast.Constant) and isinstance(c.value, str)
            and c.value in modules}
        for m, t in trees.items() if m.rpartition(".")[2] == "registry"}
    graph = {}
    for m, tree in trees.items():
        deps = set()
        for base, name in imported_names(tree, m, modules[m].name == "__init__.py"):
            target = f"{base}.{name}" if name is not None and f"{base}.{name}" in modules else _resolve(base, modules)
            if target is not None:
                deps.add(target)
        if _uses_registry_load(tree):
            for registry, targets in registry_targets.items():
                if registry.split(".")[0] == m.split(".")[0]:
                    deps |= targets
        parents = {".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 1)}
        graph[m] = deps - {m} - parents
    return graph


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
