"""Room on the page for position updates: ``positions`` with ``fillfactor = 50`` on PostgreSQL.

Revision ID: 0008
Revises: 0006
Create Date: 2026-11-25

Every recorded batch updates its partitions' rows in ``positions``, and a restart on a new generation
updates all of a pipeline's rows at once (the baseline). With full pages (the default fillfactor
100) each update writes the new row version to another page and a new entry into the primary key
index; with half of each page left free, the new version stays on its page and the index is not
touched (a heap-only tuple update, HOT), and the dead versions are pruned on the page as it is read
again. Measured on 10,000 positions (issue 27): updating all of them 53-120 ms at fillfactor 100,
12-14 ms at 50. The table is small (a row per pipeline, group and partition), so twice its size is
cheap.

The existing rows are rewritten once (``CLUSTER`` on the primary key, which unlike ``VACUUM FULL``
runs inside the migration's transaction) so the free space is there from the first update; it holds
an exclusive lock on ``positions`` for the rewrite (about a second per 100,000 rows here). SQLite has
no fillfactor: nothing to do there.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE positions SET (fillfactor = 50)")
    # The primary key's index by its catalog name (whatever naming convention created it).
    pk = bind.execute(sa.text(
        "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "WHERE x.indrelid = 'positions'::regclass AND x.indisprimary")).scalar_one()
    op.execute(f'CLUSTER positions USING "{pk}"')


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE positions RESET (fillfactor)")
