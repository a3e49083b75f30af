"""Transactional sinks: the sink's fence row, the batches it committed, and the batch -> output view.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25

- ``sinks``: one row per transactional sink (``offset_ledger.sinks``): pipeline, target, and its
  last commit (sequence, generation, batch), the row each commit locks.
- ``sink_batches``: every batch a sink committed, keyed by the ledger's identity (sink, checkpoint
  generation, batch id -> a sequence that only grows) with what it wrote (rows, table version).
- ``v_batch_outputs``: each batch's sink, target, table version and row count beside its input.

Both tables are new; nothing existing changes. Spelled out here (not read from the tables module),
so this revision never changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

V_BATCH_OUTPUTS = """
    SELECT sb.pipeline, sb.consumer_group, sb.sink, s.kind AS sink_kind, sb.target,
           COALESCE(s.target_database, 'ledger') AS target_database,
           sb.sequence, g.generation, sb.generation_id, sb.query_id, sb.batch_id,
           sb.row_count, sb.table_version, b.input_rows AS batch_input_rows, b.batch_time,
           sb.committed_at, sb.recorded_at
    FROM sink_batches sb
    JOIN sinks s ON s.sink = sb.sink
    LEFT JOIN checkpoint_generations g ON g.id = sb.generation_id
    LEFT JOIN batches b ON b.query_id = sb.query_id AND b.batch_id = sb.batch_id
"""


def upgrade() -> None:
    op.create_table(
        "sinks",
        sa.Column("sink", sa.String(255), nullable=False),
        sa.Column("pipeline", sa.String(255), nullable=False),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("target_database", sa.Text()),
        sa.Column("last_sequence", sa.BigInteger(), nullable=False),
        sa.Column("generation_id", sa.BigInteger()),
        sa.Column("batch_id", sa.BigInteger()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sink", name="pk_sinks"),
    )
    op.create_table(
        "sink_batches",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("sink", sa.String(255), nullable=False),
        sa.Column("pipeline", sa.String(255), nullable=False),
        sa.Column("consumer_group", sa.String(255), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("generation_id", sa.BigInteger(), nullable=False),
        sa.Column("query_id", sa.String(64), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("row_count", sa.BigInteger()),
        sa.Column("table_version", sa.BigInteger()),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sink_batches"),
        sa.UniqueConstraint("sink", "sequence", name="uq_sink_batches_sink_sequence"),
        sa.UniqueConstraint("sink", "generation_id", "batch_id", name="uq_sink_batches_sink_generation_id_batch_id"),
    )
    op.create_index("ix_sink_batches_pipeline_consumer_group_query_id_batch_id", "sink_batches",
                    ["pipeline", "consumer_group", "query_id", "batch_id"])
    op.execute(f"CREATE VIEW v_batch_outputs AS {V_BATCH_OUTPUTS.strip()}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS v_batch_outputs")
    op.drop_index("ix_sink_batches_pipeline_consumer_group_query_id_batch_id", table_name="sink_batches")
    op.drop_table("sink_batches")
    op.drop_table("sinks")
