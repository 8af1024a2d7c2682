"""The sharding package knows nothing of the engine: no module under ``sharding/`` imports ``jaxinfer`` or
``bench``, at any level (module top, inside functions, ``__import__`` / ``importlib.import_module`` calls).

Imports point one way (DESIGN.md): ``bench -> jaxinfer -> {pallas_kernels, sharding}``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sharding

FORBIDDEN = ("jaxinfer", "bench")
PACKAGE_DIR = Path(sharding.__file__).resolve().parent


def imported_modules(tree: ast.AST):
    """(line, absolute module name) of every import in ``tree``; relative imports stay inside the package."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                yield node.lineno, node.module
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in ("__import__", "import_module") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def test_the_scanner_sees_imports_at_every_level():
    source = ("import jaxinfer.model\n"
              "def f():\n    from bench import tp\n"
              "class C:\n    def g(self):\n        import importlib\n"
              "        return importlib.import_module('jaxinfer.config'), __import__('bench.moe')\n"
              "from . import rules\n")
    assert sorted(imported_modules(ast.parse(source))) == [
        (1, "jaxinfer.model"), (3, "bench"), (6, "importlib"), (7, "bench.moe"), (7, "jaxinfer.config")]


def test_sharding_imports_neither_jaxinfer_nor_bench():
    files = sorted(PACKAGE_DIR.rglob("*.py"))
    assert PACKAGE_DIR / "__init__.py" in files and len(files) > 1
    offending = [f"{path.relative_to(PACKAGE_DIR.parent)}:{line}: {module}"
                 for path in files
                 for line, module in imported_modules(ast.parse(path.read_text(), filename=str(path)))
                 if module.split(".")[0] in FORBIDDEN]
    assert not offending, "sharding/ must know nothing of the engine:\n" + "\n".join(offending)
