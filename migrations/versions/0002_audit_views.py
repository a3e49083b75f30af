"""Audit views: stable, documented names for the questions auditors ask (docs/audit.md).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

The views are plain SQL that PostgreSQL and SQLite both accept (no dialect functions, the
``partition`` column always quoted), so the same queries work on the production ledger and on the
embedded default. Their columns are a public contract: add columns in later revisions, never
rename or drop them.
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# (name, SELECT) in creation order; dropped in reverse order.
VIEWS: list[tuple[str, str]] = [
    (
        "v_current_positions",
        # The next offset each pipeline will read per partition, and what placed it there.
        """
        SELECT p.pipeline, p.consumer_group, p.topic, p."partition", p.next_offset,
               p.updated_at, p.query_id, p.batch_id, p.reset_id,
               CASE WHEN p.reset_id IS NOT NULL THEN 'reset' ELSE 'batch' END AS placed_by
        FROM positions p
        """,
    ),
    (
        "v_batch_history",
        # One row per committed batch and partition: [from_offset, until_offset) and its size.
        # record_count counts offsets, so transaction markers and compacted-away records count too.
        """
        SELECT bo.pipeline, bo.consumer_group, bo.topic, bo."partition",
               bo.query_id, b.run_id, bo.batch_id, bo.source_index, bo.batch_time,
               b.recorded_at, bo.from_offset, bo.until_offset,
               bo.until_offset - bo.from_offset AS record_count,
               b.input_rows AS batch_input_rows
        FROM batch_offsets bo
        LEFT JOIN batches b ON b.query_id = bo.query_id AND b.batch_id = bo.batch_id
        """,
    ),
    (
        "v_resets",
        # One row per reset and partition (a reset that touched no partition still has a row).
        """
        SELECT r.id AS reset_id, r.pipeline, r.consumer_group, r.mode, r.actor, r.reason,
               r.dry_run, r.forced, r.status, r.created_at, r.consumed_at,
               r.consumed_by_generation, rp.topic, rp."partition",
               rp.before_next_offset, rp.after_next_offset,
               rp.after_next_offset - rp.before_next_offset AS moved_by,
               rp.log_start_offset, rp.log_end_offset
        FROM resets r
        LEFT JOIN reset_partitions rp ON rp.reset_id = r.id
        """,
    ),
    (
        "v_findings",
        # Gaps, regressions, data loss, removed partitions, ... with the offsets involved.
        """
        SELECT f.id AS finding_id, f.pipeline, f.consumer_group, f.kind, f.topic, f."partition",
               f.query_id, f.batch_id, f.expected_offset, f.actual_offset,
               f.actual_offset - f.expected_offset AS offset_delta,
               f.message, f.created_at
        FROM findings f
        """,
    ),
    (
        "v_pipeline_activity",
        # Per pipeline and consumer group: the latest committed batch and the open runs.
        """
        SELECT b.pipeline, b.consumer_group, MAX(b.batch_time) AS last_batch_time,
               COUNT(*) AS batches_recorded,
               (SELECT COUNT(*) FROM runs r
                 WHERE r.pipeline = b.pipeline AND r.consumer_group = b.consumer_group
                   AND r.terminated_at IS NULL) AS active_runs
        FROM batches b
        GROUP BY b.pipeline, b.consumer_group
        """,
    ),
]


def upgrade() -> None:
    for name, select in VIEWS:
        op.execute(f"CREATE VIEW {name} AS {select.strip()}")


def downgrade() -> None:
    for name, _ in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
