"""Ground truth and quieter findings: stored stateful inputs, defaulted groups, backfilled batches.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

- ``checkpoint_generations.stateful`` (JSON): a windowed generation's window spec, watermark delay,
  event-time floor and rewind basis, so a later restart never lowers the floor or forgets it.
- ``checkpoint_generations.group_defaulted``: the restart helper chose the consumer group (nobody
  named one); the group the generation's runs report may then take it over.
- ``batches.source``: who recorded the batch (NULL: the listener; ``checkpoint``: read back from
  Spark's commit log by reconciliation or ``offset-ledger watch``).
- ``findings.occurrences`` and ``findings.last_seen_at``: a repeated finding (same pipeline, run,
  kind, partition) is one row with a count instead of one row per batch.
- ``pipeline_policies``: a pipeline's stored restart policies, one row per change (who, why, what).

All nullable; rows written before this revision read as "listener", "named group", "seen once".
``v_batch_history`` gains ``recorded_by`` and ``v_findings`` ``occurrences`` and ``last_seen_at``.
0001 builds its tables from the live tables module, so each column is added only when missing. The
audit views are dropped and re-created unchanged around the column changes (SQLite refuses to
rebuild a table a view names).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_COLUMNS: list[tuple[str, sa.Column]] = [
    ("checkpoint_generations", sa.Column("stateful", sa.JSON(), nullable=True)),
    ("checkpoint_generations", sa.Column("group_defaulted", sa.Boolean(), nullable=True)),
    ("batches", sa.Column("source", sa.String(16), nullable=True)),
    ("findings", sa.Column("occurrences", sa.BigInteger(), nullable=True)),
    ("findings", sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True)),
]


def _load(filename: str, name: str) -> ModuleType:
    # alembic's versions directory is no package: load a released revision from its file.
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Views 0005 changes: the batch's recorder in history, a finding's count and last sighting.
_NEW_VIEWS = {
    "v_batch_history": """
        SELECT bo.pipeline, bo.consumer_group, bo.topic, bo."partition",
               bo.query_id, b.run_id, bo.batch_id, bo.source_index, bo.batch_time,
               b.recorded_at, bo.from_offset, bo.until_offset,
               bo.until_offset - bo.from_offset AS record_count,
               b.input_rows AS batch_input_rows,
               COALESCE(b.source, 'listener') AS recorded_by
        FROM batch_offsets bo
        LEFT JOIN batches b ON b.query_id = bo.query_id AND b.batch_id = bo.batch_id
    """,
    "v_findings": """
        SELECT f.id AS finding_id, f.pipeline, f.consumer_group, f.kind, f.topic, f."partition",
               f.query_id, f.batch_id, f.expected_offset, f.actual_offset,
               f.actual_offset - f.expected_offset AS offset_delta,
               f.message, f.created_at, f.generation_id, f.run_id,
               COALESCE(f.occurrences, 1) AS occurrences,
               COALESCE(f.last_seen_at, f.created_at) AS last_seen_at
        FROM findings f
    """,
}


def _views_before() -> list[tuple[str, str]]:
    """The views as 0004 left them (0003's), in creation order."""
    return _load("0004_stateful_batches.py", "_offset_ledger_0004")._views_0003()


def _views() -> list[tuple[str, str]]:
    """The views as 0005 leaves them, in the same order."""
    return [(name, _NEW_VIEWS.get(name, select)) for name, select in _views_before()]


def _tables() -> list[str]:
    return list(dict.fromkeys(table for table, _ in _COLUMNS))


def upgrade() -> None:
    bind = op.get_bind()
    views = _views()
    for name, _ in reversed(_views_before()):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    inspector = sa.inspect(bind)
    for table in _tables():
        existing = {c["name"] for c in inspector.get_columns(table)}
        missing = [column for t, column in _COLUMNS if t == table and column.name not in existing]
        if missing:
            with op.batch_alter_table(table) as batch:
                for column in missing:
                    batch.add_column(column)
    if not inspector.has_table("pipeline_policies"):
        # Spelled out here (not read from the tables module), so this revision never changes.
        op.create_table(
            "pipeline_policies",
            sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                      autoincrement=True),
            sa.Column("pipeline", sa.String(255), nullable=False),
            sa.Column("policies", sa.JSON(), nullable=False),
            sa.Column("actor", sa.String(255), nullable=False),
            sa.Column("reason", sa.Text()),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
            sa.PrimaryKeyConstraint("id", name="pk_pipeline_policies"),
        )
        op.create_index("ix_pipeline_policies_pipeline_id", "pipeline_policies", ["pipeline", "id"])
    for name, select in views:
        op.execute(f"CREATE VIEW {name} AS {select.strip()}")


def downgrade() -> None:
    views = _views_before()
    for name, _ in reversed(_views()):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_table("pipeline_policies")
    for table in reversed(_tables()):
        with op.batch_alter_table(table) as batch:
            for t, column in reversed(_COLUMNS):
                if t == table:
                    batch.drop_column(column.name)
    for name, select in views:
        op.execute(f"CREATE VIEW {name} AS {select.strip()}")
