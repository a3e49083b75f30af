"""The driver's own heartbeat: ``runs.beat_at`` and ``runs.beat_every_ms``.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28

A run's liveness was inferred from the gaps between Spark's events, so a slow trigger (events only
at triggers) or a restart's first interval looked like a crash and opened a live query to resets
(issue 47). The listener now keeps a heartbeat from the driver process itself: a daemon thread
writes ``beat_at`` every ``beat_every_ms`` while the run is alive (``capture.heartbeat``), and a run
is alive while that beat is fresh (``rules.liveness``).

Two nullable columns without a default: an instant ``ALTER TABLE ... ADD COLUMN`` on PostgreSQL (a
catalog change, no rewrite of ``runs``, the ACCESS EXCLUSIVE lock held for milliseconds) and on
SQLite. Existing runs keep NULL: they have no heartbeat and keep today's inference, shown as
``uncertain``. A listener of the previous release never names the columns and keeps recording on the
migrated ledger (its runs stay without a heartbeat). A ledger created at this release already has
the columns (0001 builds today's tables), so they are added only where missing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_COLUMNS = (("beat_at", sa.DateTime(timezone=True)), ("beat_every_ms", sa.BigInteger()))


def upgrade() -> None:
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("runs")}
    for name, kind in _COLUMNS:
        if name not in have:
            # A plain ADD COLUMN on both dialects (no batch copy of the table: views depend on it).
            op.add_column("runs", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    # Native DROP COLUMN (SQLite 3.35+, PostgreSQL): a batch copy of the table would break the views on it.
    for name, _ in reversed(_COLUMNS):
        op.execute(f"ALTER TABLE runs DROP COLUMN {name}")
