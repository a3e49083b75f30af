"""Run liveness from the listener's own heartbeats: ``runs.max_gap_ms``, and sink runs ended with their query.

Revision ID: 0012
Revises: 0009
Create Date: 2026-11-26

``runs.max_gap_ms`` (nullable, no default: an instant ``ALTER TABLE ... ADD COLUMN`` on Postgres, no
rewrite of ``runs``) holds the longest silence the listener observed between two of a run's events;
the silence bound of ``offset_ledger.rules.liveness`` is 3 x it when that exceeds the floor. A
listener of the previous release never names the column and keeps recording.

Existing data: a sink's or the watcher's run record (``sink:<query>``, ``checkpoint:<query>``) that
is still open although a listener run of the same query terminated after its last batch is ended at
that termination, as the recorder now does when it sees a query end.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    if "max_gap_ms" not in {c["name"] for c in sa.inspect(bind).get_columns("runs")}:
        # A plain ADD COLUMN on both dialects (no batch copy of the table: views depend on it).
        op.add_column("runs", sa.Column("max_gap_ms", sa.BigInteger(), nullable=True))
    # One statement over the (few) open sink/watcher runs; the query_id index finds their listener runs.
    bind.execute(sa.text(
        "UPDATE runs SET terminated_at = (SELECT max(l.terminated_at) FROM runs l WHERE l.query_id = runs.query_id "
        "  AND l.run_id NOT LIKE 'sink:%' AND l.run_id NOT LIKE 'checkpoint:%' AND l.terminated_at IS NOT NULL "
        "  AND l.terminated_at >= coalesce(runs.last_heartbeat_at, runs.started_at)) "
        "WHERE terminated_at IS NULL AND (run_id LIKE 'sink:%' OR run_id LIKE 'checkpoint:%') "
        "  AND EXISTS (SELECT 1 FROM runs l WHERE l.query_id = runs.query_id "
        "  AND l.run_id NOT LIKE 'sink:%' AND l.run_id NOT LIKE 'checkpoint:%' AND l.terminated_at IS NOT NULL "
        "  AND l.terminated_at >= coalesce(runs.last_heartbeat_at, runs.started_at))"))


def downgrade() -> None:
    # The runs ended above stay ended: they were over.
    # Native DROP COLUMN (SQLite 3.35+, Postgres): a batch copy of the table would break the views on it.
    op.execute("ALTER TABLE runs DROP COLUMN max_gap_ms")
