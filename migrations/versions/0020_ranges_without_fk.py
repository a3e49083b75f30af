"""``offset_ranges`` without its foreign key to ``batches`` (PostgreSQL): retention no longer pays a probe per batch.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27

The foreign key ``offset_ranges.batch_pk -> batches.id ON DELETE CASCADE`` fired once per deleted
``batches`` row: a cascade DELETE planned against the partitioned ``offset_ranges`` (0018) and run
for one id. Prune removes a day's ranges by swapping partitions, then deletes that day's batches: at
the fleet's 169,800 batches a day those per-row probes were ~3.5 s of a prune whose target is 10 s,
and they found nothing (the swap had already removed the rows). Every writer also paid the other
side of the key: a lookup and ``FOR KEY SHARE`` lock of its batch's row per inserted range row.

Why nothing replaces it: no path relies on the cascade. Prune removes ranges itself before their
batches (a partition swap, or ``DELETE FROM offset_ranges`` in the same transaction as the batches'
DELETE; SQLite enforces the key only with its pragma, so prune never relied on it), the
``v_batch_offsets`` INSTEAD OF DELETE removes ranges, and no other code deletes batches. Integrity
without the key: every writer inserts a batch's ranges in the transaction that inserted or found its
``batches`` row, and batch ids come from a sequence and are never reused, so a range row can only
lose its batch to a prune racing a writer re-recording a batch older than the retention (a replay of
history the ledger was told to forget). Such a row is never read: every reader (the view, history,
verify, replay, lag, prune and its islands) joins ``batches`` on ``batch_pk``, and the next swap of its
partition, which copies only rows whose batch it keeps, drops it. A statement-level cascade trigger
was considered and left out: it would re-probe the ranges prune has just removed, and its cost would
depend on the plan chosen for an unanalyzed transition table.

Partitioning ``batches`` like ``offset_ranges`` (so that its rows also went by swap) is not possible
without breaking writers: a unique key of a partitioned table must contain the partition key, and the
previous releases' writers rely on ``UNIQUE (query_id, batch_id)`` (``ON CONFLICT (query_id,
batch_id)``). ``batches`` holds one row per batch (~250 B with its indexes), so its DELETE is ~0.3 s
for a fleet day and its dead rows are reused by the next inserts after autovacuum.

Locks: dropping the key takes an exclusive lock on ``offset_ranges`` and ``batches`` for the catalog
change only (no scan), bounded by ``lock_timeout``. SQLite: unchanged (its ledgers are small; prune
deletes ranges explicitly there).

Downgrade puts the key back: rows whose batch is gone are deleted first, then the key is added, which
scans ``offset_ranges`` once under the lock (PostgreSQL 15 cannot add a NOT VALID foreign key to a
partitioned table); its cost follows the ledger's size.
"""

from __future__ import annotations

import sys
import time

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_FK = "fk_offset_ranges_batch_pk_batches"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    started = time.monotonic()
    # A long reader of either table would otherwise queue this exclusive lock and every writer behind it.
    # (Set for this statement only: later revisions run in the same transaction.)
    before = bind.exec_driver_sql("SELECT current_setting('lock_timeout')").scalar_one()
    bind.exec_driver_sql("SELECT set_config('lock_timeout', '10s', true)")
    bind.exec_driver_sql(f"ALTER TABLE offset_ranges DROP CONSTRAINT IF EXISTS {_FK}")
    bind.exec_driver_sql("SELECT set_config('lock_timeout', %(v)s, true)", {"v": before})
    print(f"0020: offset_ranges' foreign key to batches dropped; writers waited {time.monotonic() - started:.2f} s "
          "before the commit", file=sys.stderr, flush=True)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    bind.exec_driver_sql("LOCK TABLE batches, offset_ranges IN SHARE ROW EXCLUSIVE MODE")
    bind.exec_driver_sql("DELETE FROM offset_ranges r "
                         "WHERE NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = r.batch_pk)")
    bind.exec_driver_sql(f"ALTER TABLE offset_ranges ADD CONSTRAINT {_FK} "
                         "FOREIGN KEY (batch_pk) REFERENCES batches (id) ON DELETE CASCADE")
