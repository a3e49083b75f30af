"""``listener_health.ledger_role``: the database role that wrote a health row (team walls, issue 48).

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28

A listener that records several pipelines (a mapping or a callable for ``pipeline``) reports its
health without a pipeline. Row security decides a team role's rows by their pipeline
(``row_security``), so such a row was refused for every team role, and no policy could say whose
it was. PostgreSQL fills the new column with ``current_user`` by default, so no writer changes (the
previous release's listener included): a team role then reads and writes the pipeline-less health
rows it wrote itself, and no other team's. Rows from before have none: no team sees them (the owner
does, as every row).

SQLite has no roles: the column is added and stays NULL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    # 0001 builds its tables from today's metadata: a ledger created at this release has the column.
    if "ledger_role" not in {c["name"] for c in sa.inspect(conn).get_columns("listener_health")}:
        op.add_column("listener_health", sa.Column("ledger_role", sa.String(255)))
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE listener_health ALTER COLUMN ledger_role SET DEFAULT current_user")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # The team walls' policies read the column; they are made again without it after the downgrade
        # (``row_security.migrating``, in this transaction).
        for command in ("select", "insert", "update", "delete"):
            op.execute(f"DROP POLICY IF EXISTS offset_ledger_{command} ON listener_health")
    # In place (SQLite 3.35+ and PostgreSQL): a batch copy of the table would lose what refers to it.
    op.execute("ALTER TABLE listener_health DROP COLUMN ledger_role")
