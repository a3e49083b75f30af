"""The layering is checked, not hoped for: an import contract over the package's folders.

Each folder of ``offset_ledger`` is a layer, and the folder says the rule:

- ``rules/`` is pure: no I/O library, and nothing of the package but other rules and the exception
  tree (``offset_ledger.errors``);
- ``ledger/`` (the database) and ``kafka/`` (the cluster) are adapters: they use the rules, never
  capture, the verbs or a face, and ``ledger/`` never talks to Kafka;
- ``capture/`` (what records batches) never imports the operator verbs (``operate/``);
- the faces (``cli/``, ``api/``, ``console/``) are imported by nothing outside the faces;
- only ``errors``, ``config`` and ``addresses`` (used by every layer) and the lazy public surface sit at the top;
- no module imports another module's ``_private`` name: what another module needs gets a public
  name (or the helper becomes a member of the class that uses it), so a private name is safe to
  change by reading one file.
- SQL lives only in ``ledger/``: no other module imports the ledger's tables, builds a query with
  SQLAlchemy (only ``sqlalchemy.engine`` types and ``sqlalchemy.exc`` pass) or calls ``.execute`` and
  its kin; ``test_the_sql_check_can_fail`` proves it bites.

The contract is read from the source with ``ast`` (nothing is imported), so it also holds for the
optional extras a machine may lack. ``test_the_contract_can_fail`` proves it bites.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "offset_ledger"

FACES = {"cli", "api", "console"}
#: What each layer may import from the package (beside itself and the top-level errors/config).
MAY_IMPORT = {
    "rules": set(),
    "ledger": {"rules"},
    "kafka": {"rules", "ledger"},
    "capture": {"rules", "ledger", "kafka"},
    "operate": {"rules", "ledger", "kafka", "capture", "sinks"},
    # foreachBatch functions in the user's driver: like capture, never the verbs or a face
    "sinks": {"rules", "ledger", "capture"},
    "cli": {"rules", "ledger", "kafka", "capture", "sinks", "operate", "api", "console", "devstack", "<public>"},
    "api": {"rules", "ledger", "kafka", "capture", "sinks", "operate", "console", "<public>"},
    "console": {"rules", "ledger", "operate", "<public>"},
    "<public>": {"capture", "operate", "rules"},  # offset_ledger/__init__.py: the lazy public names
}
TOP_LEVEL = {"errors", "config", "addresses", "pids"}
IO_LIBRARIES = {"sqlalchemy", "psycopg2", "alembic", "kafka", "confluent_kafka", "pyspark", "fastapi", "starlette",
                "uvicorn", "typer", "rich", "fsspec", "requests", "httpx", "socket", "subprocess", "pydantic",
                "pydantic_settings", "os", "pathlib", "io", "shutil", "urllib"}
KNOWN = set(MAY_IMPORT) | TOP_LEVEL | {"devstack"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, name: str) -> set[str]:
    """Absolute names of everything ``source`` (module ``name``) imports, at any depth of the file."""
    out: set[str] = set()
    package = name.split(".") if name.endswith("__init__") else name.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def layer_of(name: str) -> str:
    """The folder under ``offset_ledger`` (``offset_ledger.api.app`` -> ``api``); ``<public>`` for the package."""
    parts = name.split(".")
    if parts[0] != "offset_ledger":
        return ""
    if len(parts) == 1:
        return "<public>"
    return parts[1]


def violations(modules: Iterable[tuple[str, str]]) -> list[str]:
    found = []
    for name, source in modules:
        layer = layer_of(name)
        for imported in sorted(imports_of(source, name)):
            root = imported.split(".")[0]
            if layer == "rules" and root in IO_LIBRARIES:
                found.append(f"{name} (rules) imports the I/O library {imported}")
            if layer == "ledger" and root in {"kafka", "pyspark"}:
                found.append(f"{name} (ledger) talks to {imported}")
            if root != "offset_ledger":
                continue
            target = layer_of(imported)
            if target not in KNOWN:  # `from offset_ledger import X` of a public name: the lazy surface
                target = "<public>"
            if target == layer or target in TOP_LEVEL:
                if layer == "rules" and target == "config":
                    found.append(f"{name} (rules) reads the settings {imported}")
                continue
            if layer in MAY_IMPORT and target not in MAY_IMPORT[layer]:
                kind = "the face" if target in FACES else f"the {target} layer"
                found.append(f"{name} ({layer}) imports {kind}: {imported}")
    return found


def private_imports(modules: Iterable[tuple[str, str]]) -> list[str]:
    """``from X import _name`` of the package's own modules, where ``X`` is another module."""
    found = []
    for name, source in modules:
        package = name.split(".") if name.endswith("__init__") else name.split(".")[:-1]
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "offset_ledger" or base == name:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{name} imports the private name {alias.name} of {base}")
    return found


def package_modules() -> list[tuple[str, str]]:
    return [(module_name(p), p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))
            if "migrations" not in p.parts and "devstack" not in p.parts]


def test_the_package_keeps_its_layers() -> None:
    modules = package_modules()
    assert violations(modules) == []


def test_no_module_imports_another_modules_private_name() -> None:
    # devstack too: it keeps no layer, but its modules share names only through public ones
    everything = [(module_name(p), p.read_text()) for p in sorted(PACKAGE.rglob("*.py")) if "migrations" not in p.parts]
    assert private_imports(everything) == []


def test_the_private_name_rule_can_fail() -> None:
    bad = [("offset_ledger.ledger.sink_store", "from offset_ledger.ledger.records import _Txn\n"),
           ("offset_ledger.operate.reads", "from .operations import _lag, resolve_group\n"),
           ("offset_ledger.capture.listener", "def f():\n    from offset_ledger.capture.store import _open\n")]
    assert [v.split()[0] for v in private_imports(bad)] == [name for name, _ in bad]
    # a module's own names, dunders and public names pass
    fine = [("offset_ledger.api.app", "from offset_ledger import __version__\n"),
            ("offset_ledger.api.routes", "from offset_ledger.api import paths as _paths\n")]
    assert private_imports(fine) == []


def test_every_module_lives_in_a_layer() -> None:
    """A new module picks its folder (and so its rule); only the shared ones stay at the top."""
    layers = {layer_of(n) for n, _ in package_modules()}
    assert layers - {"<public>"} - TOP_LEVEL <= set(MAY_IMPORT), layers
    top_files = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert top_files == TOP_LEVEL


def test_the_contract_can_fail() -> None:
    bad = [("offset_ledger.rules.resolver", "from sqlalchemy import select\n"),
           ("offset_ledger.rules.stateful", "from offset_ledger.ledger import queries\n"),
           ("offset_ledger.rules.status", "import kafka.admin\n"),
           ("offset_ledger.rules.model", "from offset_ledger.config import settings\n"),
           ("offset_ledger.ledger.queries", "from offset_ledger.cli.main import main\n"),
           ("offset_ledger.ledger.recorder", "from kafka import KafkaAdminClient\n"),
           ("offset_ledger.kafka.adapter", "from offset_ledger.operate import restart\n"),
           ("offset_ledger.capture.writer", "from offset_ledger.operate import restart\n"),
           ("offset_ledger.capture.listener", "from offset_ledger.api import app\n"),
           ("offset_ledger.operate.restart", "from ..console import pages\n"),
           ("offset_ledger.sinks.postgres", "from offset_ledger.operate import restart\n")]
    assert {v.split()[0] for v in violations(bad)} == {name for name, _ in bad}


#: What a module outside ``ledger/`` may take from SQLAlchemy: the types a signature names
#: (``sqlalchemy.engine``: ``Engine``, ``Connection``, ``make_url``) and the exceptions a layer
#: translates (``sqlalchemy.exc``). Everything else of it builds a query (``select``, ``text``,
#: ``func``, ``sqlalchemy.sql``, ``sqlalchemy.dialects.postgresql.insert``...).
SQLALCHEMY_OUTSIDE_LEDGER = {"sqlalchemy.engine", "sqlalchemy.exc"}
#: Methods that send SQL to a database: SQLAlchemy's ``Connection`` and a DB-API cursor (psycopg2's COPY
#: included). No Spark or Kafka client the package uses has a method of these names.
SENDS_SQL = {"execute", "executemany", "exec_driver_sql", "scalar", "scalars", "cursor", "copy_expert",
             "copy_from", "copy_to"}


def sql_outside_ledger(modules: Iterable[tuple[str, str]]) -> list[str]:
    """SQL in a module outside ``ledger/``: the ledger's tables imported, a query built or sent.

    Every statement the package sends to a database lives in ``ledger/`` behind a named function
    (issue 51), the sinks' target-database SQL included (``ledger.sink_target``): a schema change
    finds every reader of a table by reading one folder. No exception: devstack only waits for its
    Postgres to accept a connection, the tests make their databases themselves."""
    found = []
    for name, source in modules:
        if layer_of(name) == "ledger":
            continue
        package = name.split(".") if name.endswith("__init__") else name.split(".")[:-1]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import | ast.ImportFrom):
                if isinstance(node, ast.Import):
                    taken = [a.name for a in node.names]
                else:
                    base = node.module or ""
                    if node.level:
                        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                    taken = [f"{base}.{a.name}" for a in node.names]
                for imported in taken:
                    if imported == "offset_ledger.ledger.tables" or imported.startswith("offset_ledger.ledger.tables."):
                        found.append(f"{name} imports the ledger's tables: {imported}")
                    elif imported.split(".")[0] == "sqlalchemy" and ".".join(
                            imported.split(".")[:2]) not in SQLALCHEMY_OUTSIDE_LEDGER:
                        found.append(f"{name} builds SQL: imports {imported}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in SENDS_SQL):
                found.append(f"{name} sends SQL: .{node.func.attr}(...) on line {node.lineno}")
    return found


def test_only_the_ledger_holds_sql() -> None:
    everything = [(module_name(p), p.read_text()) for p in sorted(PACKAGE.rglob("*.py")) if "migrations" not in p.parts]
    assert sql_outside_ledger(everything) == []


def test_the_sql_check_can_fail() -> None:
    planted = [("offset_ledger.operate.reads", "from offset_ledger.ledger.tables import runs\n"),
               ("offset_ledger.operate.known", "from ..ledger import tables\n"),
               ("offset_ledger.capture.reconcile", "from sqlalchemy import func, select\n"),
               ("offset_ledger.sinks.staging", "def f():\n    from sqlalchemy.sql import text\n"),
               ("offset_ledger.operate.adopt", "import sqlalchemy as sa\n"),
               ("offset_ledger.sinks.postgres", "from sqlalchemy.dialects.postgresql import insert\n"),
               ("offset_ledger.kafka.mirror", "def f(conn):\n    return conn.execute(q).all()\n"),
               ("offset_ledger.cli.demo", "def f(engine):\n    engine.connect().exec_driver_sql('SELECT 1')\n"),
               ("offset_ledger.operate.audit", "def f(conn, q):\n    return conn.scalar(q)\n"),
               ("offset_ledger.devstack.postgres", "def f(c):\n    c.cursor().execute('CREATE DATABASE x')\n")]
    assert sorted({v.split()[0] for v in sql_outside_ledger(planted)}) == sorted(name for name, _ in planted)
    # the types a signature names and the exceptions a layer translates pass; the ledger itself may do anything
    fine = [("offset_ledger.operate.restart", "from sqlalchemy.engine import Connection, Engine\n"
                                              "from sqlalchemy.exc import SQLAlchemyError\n"),
            ("offset_ledger.sinks.postgres", "def f(dsn):\n    from sqlalchemy.engine import make_url\n"),
            ("offset_ledger.ledger.queries", "from sqlalchemy import select\nfrom offset_ledger.ledger.tables import runs\n"
                                             "def f(conn):\n    return conn.execute(select(runs)).all()\n")]
    assert sql_outside_ledger(fine) == []


def import_graph(modules: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    """Which package modules each module imports, function-local imports included.

    ``from offset_ledger.sinks import held`` inside ``offset_ledger.sinks.postgres`` imports
    the submodule, not its package's ``__init__`` (which Python is already running): no edge to
    the package for that."""
    sources = dict(modules)
    graph: dict[str, set[str]] = {}
    for name, source in sources.items():
        edges = {n for n in imports_of(source, name) if n in sources and n != name}
        for imported in list(edges):
            if name.startswith(imported + ".") and not _names_from(source, imported, sources):
                edges.discard(imported)
        graph[name] = edges
    return graph


def _names_from(source: str, package: str, sources: dict[str, str]) -> bool:
    """Whether ``source`` takes from ``package`` a name that is not one of its submodules."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == package:
            if any(f"{package}.{a.name}" not in sources for a in node.names):
                return True
    return False


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module), each sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return found


def test_no_import_circles() -> None:
    """A circle hidden behind a function-local import is still a circle (issue 36): two modules
    that need each other are one job split along no seam, or a value in the wrong room."""
    assert cycles(import_graph(package_modules())) == []


def test_the_circle_check_can_fail() -> None:
    planted = [("offset_ledger.ledger.a", "def f():\n    from offset_ledger.ledger.b import g\n"),
               ("offset_ledger.ledger.b", "from offset_ledger.ledger.a import f\n"),
               ("offset_ledger.sinks", "def __getattr__(n):\n    from offset_ledger.sinks.c import C\n"),
               ("offset_ledger.sinks.c", "from offset_ledger.sinks import d\nC = 1\n"),
               ("offset_ledger.sinks.d", "")]
    assert cycles(import_graph(planted)) == [["offset_ledger.ledger.a", "offset_ledger.ledger.b"]]


def front_doors() -> dict[str, set[str]]:
    """Each layer's front door, read from its ``__init__.py``: ``FRONT_DOOR`` (the modules other
    layers may import) and ``__all__`` (the names the package itself offers)."""
    doors: dict[str, set[str]] = {}
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        door: set[str] = set()
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in {"FRONT_DOOR", "__all__"}
                                                    for t in node.targets):
                door |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
        doors[init.parent.name] = door
    return doors


def back_door_imports(modules: Iterable[tuple[str, str]], doors: dict[str, set[str]]) -> list[str]:
    """Imports from another layer that do not come in through its front door."""
    found = []
    for name, source in modules:
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("offset_ledger."):
                continue
            parts = node.module.split(".")
            layer = parts[1]
            if layer == layer_of(name) or layer not in doors or layer in {"devstack", "cli"}:
                continue
            entered = [parts[2]] if len(parts) > 2 else [a.name for a in node.names]
            found += [f"{name} imports {node.module} past {layer}'s front door ({door_name})"
                      for door_name in entered if door_name not in doors[layer]]
    return found


def test_other_layers_come_in_through_the_front_door() -> None:
    """A layer's ``__init__.py`` names what other layers may import (issue 36: one front door per
    layer); its other modules are its own, free to change without reading another layer."""
    assert back_door_imports(package_modules(), front_doors()) == []


def test_the_front_door_check_can_fail() -> None:
    doors = {"sinks": {"protocol", "Sink"}, "ledger": {"queries"}}
    planted = [("offset_ledger.operate.restart", "from offset_ledger.sinks.table_batch import prepare_batch\n"),
               ("offset_ledger.operate.reads", "from offset_ledger.ledger.queries import batch_history\n"),
               ("offset_ledger.operate.pipeline", "from offset_ledger.sinks import Sink, DeltaSink\n")]
    assert back_door_imports(planted, doors) == [
        "offset_ledger.operate.restart imports offset_ledger.sinks.table_batch past sinks's front door (table_batch)",
        "offset_ledger.operate.pipeline imports offset_ledger.sinks past sinks's front door (DeltaSink)"]
