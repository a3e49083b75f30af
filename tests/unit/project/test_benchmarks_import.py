"""Every name a benchmark imports from offset_ledger exists.

Benchmarks run by hand, not in the default suite, so a rename inside the package broke
``bench_fleet`` silently once (its simulator imported a private name that had moved). This reads
each script's ``from offset_ledger... import ...`` statements (top level and inside functions) and
resolves them, without running the benchmark. An import inside a ``try`` that catches
``ImportError`` is a deliberate fallback for an older tree (``bench_reads``' baseline) and is left out.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def _fallback_imports(tree: ast.AST) -> set[int]:
    """ids of ImportFrom nodes inside a try whose handlers catch ImportError."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = " ".join(ast.unparse(h.type) for h in node.handlers if h.type is not None)
        if "ImportError" not in caught and "ModuleNotFoundError" not in caught:
            continue
        for part in (*node.body, *node.handlers):
            inside.update(id(n) for n in ast.walk(part) if isinstance(n, ast.ImportFrom))
    return inside


def _package_imports(path: Path) -> list[tuple[int, str, str]]:
    tree = ast.parse(path.read_text(), str(path))
    skipped = _fallback_imports(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and id(node) not in skipped and node.level == 0 \
                and node.module and node.module.split(".")[0] == "offset_ledger":
            found.extend((node.lineno, node.module, alias.name) for alias in node.names)
    return found


SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if _package_imports(p))


def test_the_benchmarks_import_the_package() -> None:
    assert len(SCRIPTS) >= 10, [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_imported_name_exists(script: Path) -> None:
    missing = []
    for line, module, name in _package_imports(script):
        imported = importlib.import_module(module)
        if not hasattr(imported, name):
            try:  # a submodule imported by name: ``from offset_ledger import devstack``
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{script.name}:{line}: from {module} import {name}")
    assert not missing, missing
