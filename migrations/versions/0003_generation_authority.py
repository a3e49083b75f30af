"""Generations as the unit of authority: which run may move positions, topic ids, stored restart findings.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

Adds ``runs.generation_id`` and ``runs.max_batch_ms``, ``positions.generation_id``,
``findings.generation_id`` and ``findings.run_id``, and on ``checkpoint_generations`` the resolved
starting offsets, topic ids, watermarks and the claiming query. Existing runs are matched to the
generation whose location their recorded checkpoint is, so a ledger upgraded in place keeps
telling current runs from foreign ones. The audit views gain the new columns at their end
(columns are only ever added) and ``v_generations`` is new.

0001 builds its tables from the live tables module, so a database created fresh at this revision
already has these columns: each one is added only when missing.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_COLUMNS: list[tuple[str, sa.Column]] = [
    ("runs", sa.Column("generation_id", sa.BigInteger(), nullable=True)),
    ("runs", sa.Column("max_batch_ms", sa.BigInteger(), nullable=True)),
    ("positions", sa.Column("generation_id", sa.BigInteger(), nullable=True)),
    ("findings", sa.Column("generation_id", sa.BigInteger(), nullable=True)),
    ("findings", sa.Column("run_id", sa.String(64), nullable=True)),
    ("checkpoint_generations", sa.Column("resolved_offsets", sa.JSON(), nullable=True)),
    ("checkpoint_generations", sa.Column("topic_ids", sa.JSON(), nullable=True)),
    ("checkpoint_generations", sa.Column("watermarks", sa.JSON(), nullable=True)),
    ("checkpoint_generations", sa.Column("query_id", sa.String(64), nullable=True)),
]

_NEW_VIEWS: dict[str, str] = {
    # placed_by gains 'generation': a restart's resolved starting offsets placed the position.
    "v_current_positions": """
        SELECT p.pipeline, p.consumer_group, p.topic, p."partition", p.next_offset,
               p.updated_at, p.query_id, p.batch_id, p.reset_id,
               CASE WHEN p.reset_id IS NOT NULL THEN 'reset'
                    WHEN p.generation_id IS NOT NULL AND p.query_id IS NULL THEN 'generation'
                    ELSE 'batch' END AS placed_by,
               p.generation_id
        FROM positions p
    """,
    "v_findings": """
        SELECT f.id AS finding_id, f.pipeline, f.consumer_group, f.kind, f.topic, f."partition",
               f.query_id, f.batch_id, f.expected_offset, f.actual_offset,
               f.actual_offset - f.expected_offset AS offset_delta,
               f.message, f.created_at, f.generation_id, f.run_id
        FROM findings f
    """,
    # One row per checkpoint generation, the newest of each pipeline flagged as current.
    "v_generations": """
        SELECT g.id AS generation_id, g.pipeline, g.consumer_group, g.generation, g.location,
               g.checkpoint_root, g.app_version, g.reason, g.created_at, g.query_id,
               CASE WHEN g.generation = (SELECT MAX(g2.generation) FROM checkpoint_generations g2
                                         WHERE g2.pipeline = g.pipeline
                                           AND g2.consumer_group = g.consumer_group)
                    THEN 1 ELSE 0 END AS is_current
        FROM checkpoint_generations g
    """,
}


def _norm(location: str) -> str:
    # Spark reports the resolved location (file:/x/gen-1-ab12cd34) where the helper handed out /x/...
    text = re.sub(r"^file:(//)?", "", location.strip()).rstrip("/")
    return re.sub(r"(?<!:)/{2,}", "/", text)


def _views_0002() -> list[tuple[str, str]]:
    """0002's views as it created them (loaded from its file: alembic's versions are no package)."""
    spec = importlib.util.spec_from_file_location("_offset_ledger_0002",
                                                  Path(__file__).with_name("0002_audit_views.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.VIEWS)


def _drop_views(names: list[str]) -> None:
    # SQLite rebuilds a table to add or drop a column and refuses while a view names it: every
    # view goes first and comes back after.
    for name in reversed(names):
        op.execute(f"DROP VIEW IF EXISTS {name}")


def upgrade() -> None:
    bind = op.get_bind()
    old = _views_0002()
    _drop_views([n for n, _ in old])
    inspector = sa.inspect(bind)
    for table, column in _COLUMNS:
        if column.name not in {c["name"] for c in inspector.get_columns(table)}:
            with op.batch_alter_table(table) as batch:
                batch.add_column(column)
    # Existing runs: the generation whose location their checkpoint is.
    gens = bind.execute(sa.text(
        "SELECT id, pipeline, consumer_group, location FROM checkpoint_generations")).fetchall()
    by_location = {(g.pipeline, g.consumer_group, _norm(g.location)): g.id for g in gens}
    runs = bind.execute(sa.text(
        "SELECT run_id, pipeline, consumer_group, checkpoint_location FROM runs "
        "WHERE checkpoint_location IS NOT NULL AND generation_id IS NULL")).fetchall()
    for r in runs:
        gen_id = by_location.get((r.pipeline, r.consumer_group, _norm(r.checkpoint_location)))
        if gen_id is not None:
            bind.execute(sa.text("UPDATE runs SET generation_id = :g WHERE run_id = :r"),
                         {"g": gen_id, "r": r.run_id})
    for name, select in old:
        op.execute(f"CREATE VIEW {name} AS {_NEW_VIEWS.get(name, select).strip()}")
    for name, select in _NEW_VIEWS.items():
        if name not in dict(old):
            op.execute(f"CREATE VIEW {name} AS {select.strip()}")


def downgrade() -> None:
    old = _views_0002()
    _drop_views([n for n, _ in old] + [n for n in _NEW_VIEWS if n not in dict(old)])
    for table, column in reversed(_COLUMNS):
        with op.batch_alter_table(table) as batch:
            batch.drop_column(column.name)
    for name, select in old:
        op.execute(f"CREATE VIEW {name} AS {select.strip()}")
