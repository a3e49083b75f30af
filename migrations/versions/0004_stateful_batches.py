"""Per-batch event time and state figures, for restarting windowed (stateful) pipelines.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

Adds to ``batches`` Spark's ``eventTime`` figures (``watermark``, ``event_time_min``,
``event_time_max``) and its ``stateOperators`` row counts (``state_rows_total``,
``state_rows_updated``, ``state_rows_dropped_by_watermark``), all nullable: batches recorded before
this revision, and queries without a watermark or state, have none.

0001 builds its tables from the live tables module, so a database created fresh at this revision
already has these columns: each one is added only when missing. The audit views are dropped and
re-created unchanged around the column changes (SQLite refuses to rebuild a table a view names).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_COLUMNS: list[tuple[str, sa.Column]] = [
    ("batches", sa.Column("watermark", sa.DateTime(timezone=True), nullable=True)),
    ("batches", sa.Column("event_time_min", sa.DateTime(timezone=True), nullable=True)),
    ("batches", sa.Column("event_time_max", sa.DateTime(timezone=True), nullable=True)),
    ("batches", sa.Column("state_rows_total", sa.BigInteger(), nullable=True)),
    ("batches", sa.Column("state_rows_updated", sa.BigInteger(), nullable=True)),
    ("batches", sa.Column("state_rows_dropped_by_watermark", sa.BigInteger(), nullable=True)),
]


def _load(filename: str, name: str) -> ModuleType:
    # alembic's versions directory is no package: load a released revision from its file.
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _views_0003() -> list[tuple[str, str]]:
    """The views as 0003 left them, in creation order."""
    v0002 = list(_load("0002_audit_views.py", "_offset_ledger_0002").VIEWS)
    new = dict(_load("0003_generation_authority.py", "_offset_ledger_0003")._NEW_VIEWS)
    names = dict(v0002)
    out = [(n, new.get(n, select)) for n, select in v0002]
    out += [(n, select) for n, select in new.items() if n not in names]
    return out


def upgrade() -> None:
    bind = op.get_bind()
    views = _views_0003()
    for name, _ in reversed(views):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    inspector = sa.inspect(bind)
    existing = {c["name"] for c in inspector.get_columns("batches")}
    missing = [column for _, column in _COLUMNS if column.name not in existing]
    if missing:
        with op.batch_alter_table("batches") as batch:
            for column in missing:
                batch.add_column(column)
    for name, select in views:
        op.execute(f"CREATE VIEW {name} AS {select.strip()}")


def downgrade() -> None:
    views = _views_0003()
    for name, _ in reversed(views):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    with op.batch_alter_table("batches") as batch:
        for _, column in reversed(_COLUMNS):
            batch.drop_column(column.name)
    for name, select in views:
        op.execute(f"CREATE VIEW {name} AS {select.strip()}")
