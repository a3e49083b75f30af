"""The initial ledger schema.

Revision ID: 0001
Revises:
Create Date: 2026-11-22

Built from ``offset_ledger.ledger.tables`` as they stood at this revision. Later revisions change
the schema with explicit ``op`` calls, never by re-reading the tables module.
"""

from __future__ import annotations

from alembic import op

from offset_ledger.ledger import tables

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_INITIAL = ["runs", "batches", "batch_offsets", "positions", "findings", "resets",
            "reset_partitions", "checkpoint_generations", "listener_health"]


def upgrade() -> None:
    bind = op.get_bind()
    tables.metadata.create_all(bind, tables=[tables.metadata.tables[n] for n in _INITIAL])


def downgrade() -> None:
    bind = op.get_bind()
    tables.metadata.drop_all(bind, tables=[tables.metadata.tables[n] for n in _INITIAL])
