"""A generation's opening in the ledger's own order: ``checkpoint_generations.sink_batch_floor``.

Revision ID: 0019
Revises: 0017
Create Date: 2026-11-26

``rules.sink_ahead`` weighs the sink commits of older generations the ledger learned after the
current generation opened. It told them by ``sink_batches.recorded_at`` against the generation's
``created_at`` with an hour of slack: a skewed clock could hide a zombie's late commit or invent one.
The generation now stores the highest ``sink_batches.id`` when it opened (under the pipeline lock a
commit holds), and "learned after" is a higher id.

Existing generations get the floor the clock rule gave them (the highest id of their pipeline
recorded more than the slack before they opened; 0 when none), so nothing a restart decides changes
with the upgrade. ``checkpoint_generations`` has a row per restart: a nullable column (no rewrite)
and one UPDATE per generation, short. A release before 0019 leaves the column NULL on the
generations it opens; they keep the clock rule.
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

#: The clock rule's slack (``sink_store.CLOCK_SLACK`` when this revision was released).
_SLACK = timedelta(hours=1)


def upgrade() -> None:
    conn = op.get_bind()
    # 0001 builds its tables from today's metadata: a ledger created at this release has the column.
    if "sink_batch_floor" not in {c["name"] for c in sa.inspect(conn).get_columns("checkpoint_generations")}:
        op.add_column("checkpoint_generations", sa.Column("sink_batch_floor", sa.BigInteger))
    g = sa.table("checkpoint_generations", sa.column("id", sa.BigInteger), sa.column("pipeline", sa.String),
                 sa.column("consumer_group", sa.String), sa.column("created_at", sa.DateTime(timezone=True)),
                 sa.column("sink_batch_floor", sa.BigInteger))
    sb = sa.table("sink_batches", sa.column("id", sa.BigInteger), sa.column("pipeline", sa.String),
                  sa.column("consumer_group", sa.String), sa.column("recorded_at", sa.DateTime(timezone=True)))
    for gen in conn.execute(sa.select(g.c.id, g.c.pipeline, g.c.consumer_group, g.c.created_at)
                            .where(g.c.sink_batch_floor.is_(None))).all():
        floor = conn.execute(sa.select(sa.func.coalesce(sa.func.max(sb.c.id), 0)).where(
            sb.c.pipeline == gen.pipeline, sb.c.consumer_group == gen.consumer_group,
            sb.c.recorded_at < gen.created_at - _SLACK)).scalar_one()
        conn.execute(sa.update(g).where(g.c.id == gen.id).values(sink_batch_floor=floor))


def downgrade() -> None:
    # In place (SQLite 3.35+ and PostgreSQL): a batch copy of the table would break the views over it.
    op.execute("ALTER TABLE checkpoint_generations DROP COLUMN sink_batch_floor")
