"""Where the package imports: its own modules at the top of each module, heavy libraries at declared points.

Issue 51: a function-local import of the package's own module hides a dependency from the reader (and
a circle from nobody: ``test_layers.test_no_import_circles`` follows them too), so own modules import
each other at the top, and the few that may not say why here (``ALLOWED``). What a command's start
must not pay for is a heavy third-party library, not our own modules: each heavy library is imported
inside functions of the modules declared its lazy points (``LAZY_POINTS``) and never at the top of a
module the command line's commands import.

Read from the source with ``ast`` (nothing is imported); ``test_the_import_checks_can_fail`` plants a
violation of each rule and sees it caught.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "offset_ledger"

#: (module, the own module it imports inside a function) -> why that import stays in the function.
ALLOWED: dict[tuple[str, str], str] = {
    ("offset_ledger.sinks", "offset_ledger.sinks.postgres"):
        "PEP 562: Spark's Python workers import sinks' executor code without the driver side",
    ("offset_ledger.sinks", "offset_ledger.sinks.delta"): "PEP 562, as sinks.postgres",
    ("offset_ledger.sinks", "offset_ledger.sinks.iceberg"): "PEP 562, as sinks.postgres",
    ("offset_ledger.sinks", "offset_ledger.sinks.kafka"): "PEP 562, as sinks.postgres",
    ("offset_ledger.sinks", "offset_ledger.sinks.protocol"): "PEP 562, as sinks.postgres",
    ("offset_ledger.api", "offset_ledger.api.app"):
        "PEP 562: api.tokens (offset-ledger db) without FastAPI, the optional [server] extra",
    ("offset_ledger.cli.serve", "offset_ledger.api"):
        "FastAPI's lazy point for the CLI: `serve --help` works without the [server] extra",
    ("offset_ledger.operate.pipeline", "offset_ledger.capture.listener"):
        "the listener subclasses PySpark's StreamingQueryListener; Pipeline works without PySpark",
    ("offset_ledger.cli.demo", "offset_ledger"): "the demo's listener needs PySpark, imported where the demo runs Spark",
    # The ksink branch edits this module this session; hoisted once it has merged.
}

#: Heavy third-party libraries (``python -X importtime`` over the CLI's floor: 15-140 ms each, docs/benchmarks.md)
#: -> the modules that may import them, inside functions only: the declared lazy points. A prefix ending in
#: "." covers a folder. SQLAlchemy's core is not here: every command needs it (the floor).
LAZY_POINTS: dict[str, tuple[str, ...]] = {
    "pydantic_settings": ("offset_ledger.config",),  # settings_class()
    "kafka": ("offset_ledger.kafka.", "offset_ledger.cli.demo", "offset_ledger.cli.demo_stack", "offset_ledger.devstack."),
    "confluent_kafka": ("offset_ledger.sinks.kafka", "offset_ledger.sinks._kafka_tx"),
    "pyspark": ("offset_ledger.capture.listener", "offset_ledger.sinks.", "offset_ledger.cli.demo_stack"),
    "py4j": ("offset_ledger.capture.listener",),
    "alembic": ("offset_ledger.ledger.engine",),
    "rich": ("offset_ledger.cli.table",),
    "fastapi": ("offset_ledger.api.",),
    "starlette": ("offset_ledger.api.",),
    "uvicorn": ("offset_ledger.cli.serve",),
    "jinja2": ("offset_ledger.console.",),
    "fsspec": ("offset_ledger.capture.checkpoint_files",),
    "psycopg2": ("offset_ledger.ledger.", "offset_ledger.devstack."),
    "sqlalchemy.dialects.postgresql": ("offset_ledger.ledger.",),
    "grafana_foundation_sdk": ("offset_ledger.operate.alert_dashboard",),
}

#: Modules that import a heavy library at their top and that no command's start imports: the server's
#: (reached through the lazy points above), the listener (the user's Spark driver), the demo.
HEAVY_AT_TOP = ("offset_ledger.api.", "offset_ledger.console.", "offset_ledger.capture.listener",
                "offset_ledger.cli.demo", "offset_ledger.cli.demo_stack")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


_PACKAGES = {module_name(p) for p in PACKAGE.rglob("__init__.py")}


def package_modules() -> list[tuple[str, str]]:
    return [(module_name(p), p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))]


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    base = node.module or ""
    if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    return base


def _imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return [_absolute(node, name, is_package)]


def _imports(source: str, name: str, *, in_functions: bool) -> Iterator[tuple[str, ast.Import | ast.ImportFrom]]:
    """(imported module, node) of the imports inside function bodies, or of those at the top (a top-level
    ``try``/``if`` included, ``if TYPE_CHECKING:`` not: nothing runs there)."""
    tree = ast.parse(source)
    is_package = name in _PACKAGES
    if in_functions:
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        yield from ((m, node) for m in _imported(node, name, is_package))
        return
    for top in tree.body:
        if isinstance(top, ast.If) and "TYPE_CHECKING" in ast.unparse(top.test):
            continue
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(top):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield from ((m, node) for m in _imported(node, name, is_package))


def local_own_imports(modules: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """(module, own module) for every import of the package inside a function body (nested ones once)."""
    found = set()
    for name, source in modules:
        for imported, _node in _imports(source, name, in_functions=True):
            if imported == "offset_ledger" or imported.startswith("offset_ledger."):
                found.add((name, imported))
    return found


def _heavy(imported: str) -> str | None:
    for library in LAZY_POINTS:
        if imported == library or imported.startswith(library + "."):
            return library
    return None


def _covers(prefixes: Iterable[str], name: str) -> bool:
    return any(name == p or (p.endswith(".") and name.startswith(p)) for p in prefixes)


def heavy_imports_off_their_points(modules: Iterable[tuple[str, str]]) -> list[str]:
    """A heavy library imported inside a function of a module that is not one of its declared lazy points."""
    found = []
    for name, source in modules:
        for imported, node in _imports(source, name, in_functions=True):
            library = _heavy(imported)
            if library and not _covers(LAZY_POINTS[library], name):
                found.append(f"{name}:{node.lineno} imports {imported}: not a declared lazy point of {library}")
    return sorted(set(found))


def command_roots(main_source: str) -> list[str]:
    """``cli.main`` and every command module it registers (``_MODULES``, read from its source)."""
    roots = ["offset_ledger.cli.main"]
    for node in ast.parse(main_source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_MODULES" for t in node.targets):
            roots += [f"offset_ledger.cli.{v.value}" for v in node.value.values  # type: ignore[attr-defined]
                      if isinstance(v, ast.Constant)]
    return list(dict.fromkeys(roots))


def heavy_on_the_command_line(modules: Iterable[tuple[str, str]], roots: Iterable[str]) -> list[str]:
    """A heavy library at the top of a module some command's start imports, with the chain that imports it."""
    sources = dict(modules)
    came_from: dict[str, str | None] = {r: None for r in roots if r in sources}
    queue = list(came_from)
    found = []
    while queue:
        name = queue.pop(0)
        for imported, node in _imports(sources[name], name, in_functions=False):
            library = _heavy(imported)
            if library:
                chain = [name]
                while came_from[chain[-1]]:
                    chain.append(came_from[chain[-1]])  # type: ignore[arg-type]
                found.append(f"{name}:{node.lineno} imports {imported} at its top ({' <- '.join(chain)})")
                continue
            names = [imported] + ([f"{imported}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom)
                                  else [])
            for candidate in names:
                parts = candidate.split(".")
                for i in range(1, len(parts) + 1):  # a module runs its packages' __init__ first
                    module = ".".join(parts[:i])
                    if module in sources and module not in came_from:
                        came_from[module] = name
                        queue.append(module)
    return sorted(set(found))


def test_own_modules_are_imported_at_the_top() -> None:
    """A function-local import of the package is allowed only with its reason in ``ALLOWED``."""
    unexplained = sorted(local_own_imports(package_modules()) - set(ALLOWED))
    assert unexplained == [], "import these at the top of the module, or add (module, imported, reason) to ALLOWED"


def test_every_allowed_local_import_still_exists() -> None:
    """An entry whose import went to the top is removed, so the list stays the list of exceptions."""
    assert sorted(set(ALLOWED) - local_own_imports(package_modules())) == []


def test_heavy_libraries_only_at_their_declared_lazy_points() -> None:
    assert heavy_imports_off_their_points(package_modules()) == []


def test_no_command_imports_a_heavy_library_at_start() -> None:
    """Every command of ``offset-ledger`` (the read commands' start is benchmarks/bench_cli_start.py's figure)
    imports the heavy libraries only where it uses them."""
    modules = package_modules()
    roots = command_roots(dict(modules)["offset_ledger.cli.main"])
    assert "offset_ledger.cli.verify" in roots and "offset_ledger.cli.serve" in roots  # _MODULES was read
    assert heavy_on_the_command_line(modules, roots) == []


def test_modules_with_heavy_top_imports_are_the_known_ones() -> None:
    """Beside the command line's closure: which modules import a heavy library at their top at all."""
    found = {name for name, source in package_modules()
             for imported, _ in _imports(source, name, in_functions=False) if _heavy(imported)}
    assert sorted(n for n in found if not _covers(HEAVY_AT_TOP, n)) == []


def test_the_import_checks_can_fail() -> None:
    planted = [
        ("offset_ledger.operate.reads", "def f():\n    from offset_ledger.ledger.engine import require_schema\n"),
        ("offset_ledger.operate.audit", "def f():\n    from ..ledger import queries\n"),
        ("offset_ledger.cli.main", "import typer\nfrom offset_ledger.operate import reads\n"
                                   "_MODULES = {'verify': 'verify'}\n"),
        ("offset_ledger.cli.verify", "from offset_ledger.ledger.engine import x\n"),
        ("offset_ledger.operate", ""),
        ("offset_ledger.operate.reads", "from offset_ledger.kafka.adapter import KafkaAdapter\n"),
        ("offset_ledger.kafka", ""),
        ("offset_ledger.kafka.adapter", "import kafka.admin\n"),
        ("offset_ledger.ledger", ""),
        ("offset_ledger.ledger.engine", "def upgrade():\n    from alembic import command\n"),
        ("offset_ledger.ledger.queries", "def f():\n    import alembic.config\n"),
    ]
    assert local_own_imports(planted[:2]) == {("offset_ledger.operate.reads", "offset_ledger.ledger.engine"),
                                              ("offset_ledger.operate.audit", "offset_ledger.ledger")}
    assert heavy_imports_off_their_points(planted) == [
        "offset_ledger.ledger.queries:2 imports alembic.config: not a declared lazy point of alembic"]
    merged = dict(planted[2:])
    merged["offset_ledger.operate.reads"] = planted[5][1]
    roots = command_roots(merged["offset_ledger.cli.main"])
    assert roots == ["offset_ledger.cli.main", "offset_ledger.cli.verify"]
    assert heavy_on_the_command_line(merged.items(), roots) == [
        "offset_ledger.kafka.adapter:1 imports kafka.admin at its top "
        "(offset_ledger.kafka.adapter <- offset_ledger.operate.reads <- offset_ledger.cli.main)"]
