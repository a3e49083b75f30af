"""The layering is checked, not hoped for: an import contract over the package's source.

- **rules** (pure: no I/O library, and only other rules inside the package) — the resolver, the
  authority and stateful rules, checkpoint and progress parsing, reset planning, status,
  locations, the model and the exception tree;
- **faces** (CLI, REST API, console, demo) are imported by nothing outside the faces;
- **capture** (what records batches: listener, writer, spool, event records) never imports the
  operator verbs (restart, adopt, replay, operations, reconcile).

The contract is read from the source with ``ast`` (nothing is imported), so it also holds for the
optional extras a machine may lack. ``test_the_contract_can_fail`` proves it bites.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "offset_ledger"

RULES = {"model", "errors", "resolver", "authority", "stateful", "checkpoint", "progress", "resets", "status",
         "locations", "coalesce", "restart_options", "policies", "verify"}
FACES = {"api", "console", "demo"}  # and every cli* module
CAPTURE = {"listener", "writer", "spool", "event_records"}
# The consumer-group mirror is a Kafka adapter (the listener's commit_to_kafka uses it), not a verb.
OPERATE = {"restart", "restart_plan", "restart_stateful", "adopt", "replay", "operations", "reconcile"}
IO_LIBRARIES = {"sqlalchemy", "psycopg2", "alembic", "kafka", "pyspark", "fastapi", "starlette", "uvicorn",
                "typer", "rich", "fsspec", "requests", "httpx", "socket", "subprocess"}


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


def top(name: str) -> str:
    """The first segment under ``offset_ledger`` (``offset_ledger.api.app`` -> ``api``)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "offset_ledger" else ""


def is_face(layer: str) -> bool:
    return layer in FACES or layer == "cli" or layer.startswith("cli_")


def violations(modules: Iterable[tuple[str, str]]) -> list[str]:
    found = []
    for name, source in modules:
        layer = top(name)
        for imported in sorted(imports_of(source, name)):
            root = imported.split(".")[0]
            target = top(imported)
            if layer in RULES:
                if root in IO_LIBRARIES:
                    found.append(f"{name} (rules) imports the I/O library {imported}")
                elif root == "offset_ledger" and target and target not in RULES:
                    found.append(f"{name} (rules) imports {imported}, outside the rules")
            if not is_face(layer) and is_face(target):
                found.append(f"{name} imports the face {imported}")
            if layer in CAPTURE and target in OPERATE:
                found.append(f"{name} (capture) imports the operator verb {imported}")
    return found


def package_modules() -> list[tuple[str, str]]:
    return [(module_name(p), p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))
            if "migrations" not in p.parts and "devstack" not in p.parts]


def test_the_package_keeps_its_layers() -> None:
    modules = package_modules()
    assert {top(n) for n, _ in modules} >= RULES | CAPTURE  # the lists name real modules
    assert violations(modules) == []


def test_the_contract_can_fail() -> None:
    bad = [("offset_ledger.resolver", "from sqlalchemy import select\n"),
           ("offset_ledger.stateful", "from offset_ledger.ledger import queries\n"),
           ("offset_ledger.ledger.queries", "from offset_ledger.cli import main\n"),
           ("offset_ledger.writer", "from offset_ledger import restart\n"),
           ("offset_ledger.status", "import kafka.admin\n")]
    assert {v.split()[0] for v in violations(bad)} == {name for name, _ in bad}
