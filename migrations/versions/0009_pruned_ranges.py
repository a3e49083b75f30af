"""What prune deleted: ``pruned_ranges``, so verify tells pruned history from history never recorded.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25

One row per island of deleted ranges (one query, one partition, offsets that tile). New table only;
0001 builds its tables from the live tables module, so it is created only when missing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("pruned_ranges"):
        return
    # Spelled out here (not read from the tables module), so this revision never changes.
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "pruned_ranges",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("pipeline", sa.String(255), nullable=False),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("query_id", sa.String(64), nullable=False),
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("from_batch_id", sa.BigInteger(), nullable=False),
        sa.Column("until_batch_id", sa.BigInteger(), nullable=False),
        sa.Column("from_offset", sa.BigInteger(), nullable=False),
        sa.Column("until_offset", sa.BigInteger(), nullable=False),
        sa.Column("batches", sa.BigInteger(), nullable=False),
        sa.Column("first_batch_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cutoff", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_pruned_ranges"),
    )
    op.create_index("ix_pruned_ranges_pipeline_consumer_group_topic_partition", "pruned_ranges",
                    ["pipeline", "consumer_group", "topic", "partition"])


def downgrade() -> None:
    op.drop_index("ix_pruned_ranges_pipeline_consumer_group_topic_partition", table_name="pruned_ranges")
    op.drop_table("pruned_ranges")
