"""Team roles: ``ledger_role_scopes`` names the pipelines a database role may write.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26

``offset-ledger db grant`` (issue 39) fills this table and turns on PostgreSQL row-level security
over the tables the listener, the watcher and the sinks write; this revision only creates the
(empty) table, so nothing changes for any role until a grant is made: a role with no row here is
not restricted. The policies are not made here: they follow the tables they guard, which later
revisions add to (``offset_ledger.ledger.row_security.GUARDED``), and ``db grant`` re-applies them.
Downgrading removes row security altogether (the policies' function first: it reads this table).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


# The tables ``db grant`` guarded when this revision was released (spelled out: it never changes).
_GUARDED_AT_0017 = ("runs", "batches", "batch_offsets", "offset_ranges", "positions", "findings", "resets", "reset_partitions",
                    "checkpoint_generations", "listener_health", "pipeline_policies", "sinks", "sink_batches",
                    "pruned_ranges", "ledger_role_scopes")


def upgrade() -> None:
    op.create_table(
        "ledger_role_scopes",
        sa.Column("role_name", sa.String(255), primary_key=True),
        sa.Column("pattern", sa.String(255), primary_key=True),
        sa.Column("is_prefix", sa.Boolean, primary_key=True),
        sa.Column("granted_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # CASCADE drops every policy that calls the functions; row security is then off for good.
        op.execute("DROP FUNCTION IF EXISTS offset_ledger_in_scope(text) CASCADE")
        op.execute("DROP FUNCTION IF EXISTS offset_ledger_unscoped() CASCADE")
        for table in _GUARDED_AT_0017:
            op.execute(f"ALTER TABLE IF EXISTS {table} DISABLE ROW LEVEL SECURITY")
    op.drop_table("ledger_role_scopes")
