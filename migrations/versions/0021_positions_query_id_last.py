"""``positions.query_id`` moves behind the columns a batch changes: a smaller WAL record per position.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27

Every recorded batch updates one ``positions`` row per partition (next_offset, updated_at,
batch_id; query_id keeps its value). PostgreSQL logs such a same-page update as only the bytes
between the old and new tuple's common prefix and common suffix. ``query_id`` sat between
updated_at and batch_id, so every update logged it again: ~37 bytes of a Spark query id (a UUID),
a quarter of the position's record, ~3.7 KB of WAL per 100-partition batch (bench_storage
--wal-breakdown). Behind batch_id, reset_id and generation_id (NULL or unchanged), it falls in the
unchanged suffix. Nothing a reader sees changes but where ``SELECT *`` lists the column (last);
``v_current_positions`` keeps its columns and grants (CREATE OR REPLACE).

PostgreSQL has no column reordering: the column is renamed, a new ``query_id`` added (no default:
no rewrite), the values copied, the view re-pointed and the old column dropped. ``positions`` is
one row per pipeline and partition (20,000 rows for a fleet of 200 x 100): the table is locked for
the copy, well under a second, so no writer sees it half-moved (a recorder waits, then records).
A ledger created at this release already has the column last (0001 builds today's metadata).
SQLite logs whole pages: column order changes nothing there, nothing to do.
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# v_current_positions as 0003 defined it (spelled out: a released view never changes).
_VIEW = """
    SELECT p.pipeline, p.consumer_group, p.topic, p."partition", p.next_offset,
           p.updated_at, p.query_id, p.batch_id, p.reset_id,
           CASE WHEN p.reset_id IS NOT NULL THEN 'reset'
                WHEN p.generation_id IS NOT NULL AND p.query_id IS NULL THEN 'generation'
                ELSE 'batch' END AS placed_by,
           p.generation_id
    FROM positions p
"""


def _live_columns(conn: sa.engine.Connection) -> list[str]:
    return list(conn.execute(sa.text(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'positions'::regclass AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum")).scalars())


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql" or _live_columns(conn)[-1] == "query_id":
        return
    started = time.monotonic()
    # Writers wait for the whole move (they take ROW EXCLUSIVE): none updates a row between the
    # copy and the drop, none deadlocks against the copy's row locks.
    op.execute("LOCK TABLE positions IN ACCESS EXCLUSIVE MODE")
    op.execute("ALTER TABLE positions RENAME COLUMN query_id TO query_id_before_0021")
    op.execute("ALTER TABLE positions ADD COLUMN query_id varchar(64)")
    op.execute("UPDATE positions SET query_id = query_id_before_0021 WHERE query_id_before_0021 IS NOT NULL")
    # The view names the column by its number: re-point it at the new one (keeps the view's grants).
    op.execute(f"CREATE OR REPLACE VIEW v_current_positions AS {_VIEW}")
    op.execute("ALTER TABLE positions DROP COLUMN query_id_before_0021")
    rows = conn.execute(sa.text("SELECT count(*) FROM positions")).scalar()
    print(f"0021: positions.query_id moved last ({rows:,} rows, {time.monotonic() - started:.2f} s)")


def downgrade() -> None:
    # Column order only: the schema 0019 reads and writes is the same by name. Nothing to undo.
    pass
