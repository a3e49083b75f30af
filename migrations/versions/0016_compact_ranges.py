"""Compact batch storage: a batch's ranges as one row per (batch, source, topic) with arrays.

Revision ID: 0016
Revises: 0014
Create Date: 2026-11-26

``batch_offsets`` stored one row per batch and partition, repeating the pipeline, group and query
id as text, with a surrogate key and three indexes: ~330 bytes per partition-offset for ~20 bytes
of facts. ``offset_ranges`` keeps one row per (batch, source index, topic): the partitions and their
``[from_offset, until_offset)`` as parallel arrays (PostgreSQL ``int[]``/``bigint[]``, JSON array
text on SQLite), the batch by its numeric key.

- ``v_batch_offsets`` unnests them with ``batch_offsets``' columns (but its surrogate ``id``);
  ``v_batch_history`` reads it. INSTEAD OF triggers take inserts, updates and deletes.
- ``batch_offsets`` stays, empty, as the name the previous release's listener writes to: it inserts
  with ``ON CONFLICT (query_id, batch_id, source_index, topic, partition) DO NOTHING``, which no view
  accepts (PostgreSQL: "no unique or exclusion constraint matching the ON CONFLICT specification",
  SQLite: "cannot UPSERT a view"). A BEFORE INSERT trigger folds each row into ``offset_ranges`` and
  drops it.
- The copy runs in chunks of batch ids, printing progress on stderr; listeners keep writing meanwhile
  (the old table is only read) until a short final step locks it, copies the batches that arrived
  and empties it.

Downgrade rebuilds the per-partition rows from the compact ones.
"""

from __future__ import annotations

import sys
import time

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0014"
branch_labels = None
depends_on = None

#: Batch ids per copy statement: ~100 partitions each, about half a million ranges.
CHUNK_BATCHES = 5000

_VIEW_PG = """
SELECT b.pipeline, b.consumer_group, b.query_id, b.batch_id, r.source_index, r.topic,
       u."partition", u.from_offset, u.until_offset, b.batch_time
FROM offset_ranges r
JOIN batches b ON b.id = r.batch_pk
CROSS JOIN LATERAL unnest(r.partitions, r.from_offsets, r.until_offsets) AS u ("partition", from_offset, until_offset)
"""

_VIEW_SQLITE = """
SELECT b.pipeline, b.consumer_group, b.query_id, b.batch_id, r.source_index, r.topic,
       p.value AS "partition",
       json_extract(r.from_offsets, '$[' || p.key || ']') AS from_offset,
       json_extract(r.until_offsets, '$[' || p.key || ']') AS until_offset,
       b.batch_time
FROM offset_ranges r
JOIN batches b ON b.id = r.batch_pk, json_each(r.partitions) p
"""

# 0005's v_batch_history, reading the view instead of the table.
_HISTORY = """
SELECT bo.pipeline, bo.consumer_group, bo.topic, bo."partition",
       bo.query_id, b.run_id, bo.batch_id, bo.source_index, bo.batch_time,
       b.recorded_at, bo.from_offset, bo.until_offset,
       bo.until_offset - bo.from_offset AS record_count,
       b.input_rows AS batch_input_rows,
       COALESCE(b.source, 'listener') AS recorded_by
FROM {source} bo
LEFT JOIN batches b ON b.query_id = bo.query_id AND b.batch_id = bo.batch_id
"""

# A range whose batch has no ``batches`` row (older writers, hand-made rows) gets a placeholder
# batch (run id = query id, no rows read), so no range is lost to the key.
_ORPHAN_BATCHES = """
INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at, input_rows)
SELECT MIN(bo.pipeline), MIN(bo.consumer_group), bo.query_id, bo.query_id, bo.batch_id, MIN(bo.batch_time),
       MIN(bo.batch_time), 0
FROM batch_offsets bo
WHERE bo.id > :after
  AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.query_id = bo.query_id AND b.batch_id = bo.batch_id)
GROUP BY bo.query_id, bo.batch_id
"""

_COPY_PG = """
INSERT INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
SELECT b.id, bo.source_index, bo.topic, array_agg(bo."partition" ORDER BY bo."partition"),
       array_agg(bo.from_offset ORDER BY bo."partition"), array_agg(bo.until_offset ORDER BY bo."partition")
FROM batches b JOIN batch_offsets bo ON bo.query_id = b.query_id AND bo.batch_id = b.batch_id
WHERE b.id >= :lo AND b.id < :hi
GROUP BY b.id, bo.source_index, bo.topic
ON CONFLICT DO NOTHING
"""

# json_group_array keeps the order of the rows it is fed: the inner ORDER BY.
_COPY_SQLITE = """
INSERT OR IGNORE INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
SELECT id, source_index, topic, json_group_array("partition"), json_group_array(from_offset),
       json_group_array(until_offset)
FROM (SELECT b.id, bo.source_index, bo.topic, bo."partition", bo.from_offset, bo.until_offset
      FROM batches b JOIN batch_offsets bo ON bo.query_id = b.query_id AND bo.batch_id = b.batch_id
      WHERE b.id >= :lo AND b.id < :hi
      ORDER BY b.id, bo.source_index, bo.topic, bo."partition")
GROUP BY id, source_index, topic
"""

_BACK_PG = """
INSERT INTO batch_offsets (pipeline, consumer_group, query_id, batch_id, source_index, topic, "partition",
                           from_offset, until_offset, batch_time)
SELECT b.pipeline, b.consumer_group, b.query_id, b.batch_id, r.source_index, r.topic, u."partition",
       u.from_offset, u.until_offset, b.batch_time
FROM offset_ranges r JOIN batches b ON b.id = r.batch_pk
CROSS JOIN LATERAL unnest(r.partitions, r.from_offsets, r.until_offsets) AS u ("partition", from_offset, until_offset)
WHERE b.id >= :lo AND b.id < :hi
ORDER BY b.id, r.source_index, r.topic, u."partition"
"""

_BACK_SQLITE = """
INSERT INTO batch_offsets (pipeline, consumer_group, query_id, batch_id, source_index, topic, "partition",
                           from_offset, until_offset, batch_time)
SELECT b.pipeline, b.consumer_group, b.query_id, b.batch_id, r.source_index, r.topic, p.value,
       json_extract(r.from_offsets, '$[' || p.key || ']'), json_extract(r.until_offsets, '$[' || p.key || ']'),
       b.batch_time
FROM offset_ranges r JOIN batches b ON b.id = r.batch_pk, json_each(r.partitions) p
WHERE b.id >= :lo AND b.id < :hi
ORDER BY b.id, r.source_index, r.topic, p.key
"""

# PostgreSQL: one function folds a per-partition row into offset_ranges (the view's INSTEAD OF
# INSERT and the old table's BEFORE INSERT, which then drops the row); a partition already there is
# left as it is (the ON CONFLICT DO NOTHING of the old writers).
_PG_FUNCTIONS = """
CREATE FUNCTION offset_ranges_fold() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    pk bigint;
BEGIN
    SELECT b.id INTO pk FROM batches b WHERE b.query_id = NEW.query_id AND b.batch_id = NEW.batch_id;
    IF pk IS NULL THEN
        INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at,
                             input_rows)
        VALUES (NEW.pipeline, NEW.consumer_group, NEW.query_id, NEW.query_id, NEW.batch_id, NEW.batch_time,
                NEW.batch_time, 0)
        RETURNING id INTO pk;
    END IF;
    INSERT INTO offset_ranges AS r (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
    VALUES (pk, NEW.source_index, NEW.topic, ARRAY[NEW."partition"], ARRAY[NEW.from_offset]::bigint[],
            ARRAY[NEW.until_offset]::bigint[])
    ON CONFLICT (batch_pk, source_index, topic) DO UPDATE
    SET partitions = r.partitions || EXCLUDED.partitions, from_offsets = r.from_offsets || EXCLUDED.from_offsets,
        until_offsets = r.until_offsets || EXCLUDED.until_offsets
    WHERE NOT (EXCLUDED.partitions[1] = ANY (r.partitions));
    IF TG_WHEN = 'BEFORE' THEN
        RETURN NULL;  -- the old table keeps nothing
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION offset_ranges_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    pk bigint;
    i int;
BEGIN
    SELECT b.id INTO pk FROM batches b WHERE b.query_id = OLD.query_id AND b.batch_id = OLD.batch_id;
    SELECT array_position(r.partitions, OLD."partition") INTO i FROM offset_ranges r
    WHERE r.batch_pk = pk AND r.source_index = OLD.source_index AND r.topic = OLD.topic;
    IF i IS NULL THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        UPDATE offset_ranges SET from_offsets[i] = NEW.from_offset, until_offsets[i] = NEW.until_offset
        WHERE batch_pk = pk AND source_index = OLD.source_index AND topic = OLD.topic;
        RETURN NEW;
    END IF;
    UPDATE offset_ranges
    SET partitions = partitions[:i - 1] || partitions[i + 1:],
        from_offsets = from_offsets[:i - 1] || from_offsets[i + 1:],
        until_offsets = until_offsets[:i - 1] || until_offsets[i + 1:]
    WHERE batch_pk = pk AND source_index = OLD.source_index AND topic = OLD.topic;
    DELETE FROM offset_ranges
    WHERE batch_pk = pk AND source_index = OLD.source_index AND topic = OLD.topic AND cardinality(partitions) = 0;
    RETURN OLD;
END $$;
"""

_PG_TRIGGERS = """
CREATE TRIGGER v_batch_offsets_insert INSTEAD OF INSERT ON v_batch_offsets
    FOR EACH ROW EXECUTE FUNCTION offset_ranges_fold();
CREATE TRIGGER v_batch_offsets_change INSTEAD OF UPDATE OR DELETE ON v_batch_offsets
    FOR EACH ROW EXECUTE FUNCTION offset_ranges_change();
CREATE TRIGGER batch_offsets_fold BEFORE INSERT ON batch_offsets
    FOR EACH ROW EXECUTE FUNCTION offset_ranges_fold();
"""

# SQLite: the same, as trigger bodies (no functions): json_insert '$[#]' appends.
_SQLITE_FOLD = """
    INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at, input_rows)
    SELECT NEW.pipeline, NEW.consumer_group, NEW.query_id, NEW.query_id, NEW.batch_id, NEW.batch_time,
           NEW.batch_time, 0
    WHERE NOT EXISTS (SELECT 1 FROM batches WHERE query_id = NEW.query_id AND batch_id = NEW.batch_id);
    INSERT OR IGNORE INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
    SELECT b.id, NEW.source_index, NEW.topic, '[]', '[]', '[]' FROM batches b
    WHERE b.query_id = NEW.query_id AND b.batch_id = NEW.batch_id;
    UPDATE offset_ranges
    SET partitions = json_insert(partitions, '$[#]', NEW."partition"),
        from_offsets = json_insert(from_offsets, '$[#]', NEW.from_offset),
        until_offsets = json_insert(until_offsets, '$[#]', NEW.until_offset)
    WHERE batch_pk = (SELECT id FROM batches WHERE query_id = NEW.query_id AND batch_id = NEW.batch_id)
      AND source_index = NEW.source_index AND topic = NEW.topic
      AND NOT EXISTS (SELECT 1 FROM json_each(partitions) WHERE value = NEW."partition");
"""

_SQLITE_WHERE_OLD = """
    WHERE batch_pk = (SELECT id FROM batches WHERE query_id = OLD.query_id AND batch_id = OLD.batch_id)
      AND source_index = OLD.source_index AND topic = OLD.topic"""
_SQLITE_AT = "'$[' || (SELECT key FROM json_each(partitions) WHERE value = OLD.\"partition\") || ']'"

_SQLITE_TRIGGERS = [
    f"CREATE TRIGGER v_batch_offsets_insert INSTEAD OF INSERT ON v_batch_offsets BEGIN {_SQLITE_FOLD} END",
    f"CREATE TRIGGER batch_offsets_fold BEFORE INSERT ON batch_offsets BEGIN {_SQLITE_FOLD} "
    "SELECT RAISE(IGNORE); END",
    f"""CREATE TRIGGER v_batch_offsets_update INSTEAD OF UPDATE ON v_batch_offsets BEGIN
    UPDATE offset_ranges SET from_offsets = json_set(from_offsets, {_SQLITE_AT}, NEW.from_offset),
                             until_offsets = json_set(until_offsets, {_SQLITE_AT}, NEW.until_offset)
    {_SQLITE_WHERE_OLD}; END""",
    f"""CREATE TRIGGER v_batch_offsets_delete INSTEAD OF DELETE ON v_batch_offsets BEGIN
    UPDATE offset_ranges SET partitions = json_remove(partitions, {_SQLITE_AT}),
                             from_offsets = json_remove(from_offsets, {_SQLITE_AT}),
                             until_offsets = json_remove(until_offsets, {_SQLITE_AT})
    {_SQLITE_WHERE_OLD};
    DELETE FROM offset_ranges {_SQLITE_WHERE_OLD} AND json_array_length(partitions) = 0; END""",
]


def _progress(what: str, done: int, total: int, started: float) -> None:
    print(f"0016: {what}: {done}/{total} batches, {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def _chunked(sql: str, what: str, lo: int, hi: int) -> None:
    """Run ``sql`` for batch ids [lo, hi] in chunks of CHUNK_BATCHES, printing progress."""
    bind = op.get_bind()
    started = time.monotonic()
    total = max(0, hi - lo + 1)
    for start in range(lo, hi + 1, CHUNK_BATCHES):
        bind.execute(sa.text(sql), {"lo": start, "hi": min(start + CHUNK_BATCHES, hi + 1)})
        if total > CHUNK_BATCHES:
            _progress(what, min(start + CHUNK_BATCHES, hi + 1) - lo, total, started)


def _id_bounds() -> tuple[int, int]:
    row = op.get_bind().execute(sa.text("SELECT MIN(id), MAX(id) FROM batches")).one()
    return (int(row[0]), int(row[1])) if row[0] is not None else (1, 0)


def upgrade() -> None:
    bind = op.get_bind()
    pg = bind.dialect.name == "postgresql"
    big = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    if pg:
        arrays = [sa.dialects.postgresql.ARRAY(sa.Integer()), sa.dialects.postgresql.ARRAY(sa.BigInteger()),
                  sa.dialects.postgresql.ARRAY(sa.BigInteger())]
    else:
        arrays = [sa.Text(), sa.Text(), sa.Text()]
    op.create_table(
        "offset_ranges",
        sa.Column("batch_pk", big, nullable=False),
        sa.Column("source_index", sa.Integer(), nullable=False),
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("partitions", arrays[0], nullable=False),
        sa.Column("from_offsets", arrays[1], nullable=False),
        sa.Column("until_offsets", arrays[2], nullable=False),
        sa.PrimaryKeyConstraint("batch_pk", "source_index", "topic", name="pk_offset_ranges"),
        sa.ForeignKeyConstraint(["batch_pk"], ["batches.id"], name="fk_offset_ranges_batch_pk_batches",
                                ondelete="CASCADE"),
    )
    seen = int(bind.execute(sa.text("SELECT COALESCE(MAX(id), 0) FROM batch_offsets")).scalar())
    started = time.monotonic()
    bind.execute(sa.text(_ORPHAN_BATCHES), {"after": -1})
    if seen > CHUNK_BATCHES:
        print(f"0016: ranges without a batch looked for in {time.monotonic() - started:.1f} s", file=sys.stderr,
              flush=True)
    # Listeners keep writing into the old table while the bulk is copied (it is only read)...
    lo, hi = _id_bounds()
    _chunked(_COPY_PG if pg else _COPY_SQLITE, "copying ranges", lo, hi)
    if pg:
        # ... then a short exclusive step: only what they wrote since (rows past ``seen``, batches
        # past ``hi``), and the old table emptied.
        locked = time.monotonic()
        bind.execute(sa.text("LOCK TABLE batch_offsets IN EXCLUSIVE MODE"))
        bind.execute(sa.text(_ORPHAN_BATCHES), {"after": seen})
        _, last = _id_bounds()
        _chunked(_COPY_PG, "copying ranges written meanwhile", hi + 1, last)
        bind.execute(sa.text("TRUNCATE batch_offsets"))
        print(f"0016: writers to batch_offsets waited {time.monotonic() - locked:.1f} s (until commit)",
              file=sys.stderr, flush=True)
    else:
        bind.execute(sa.text("DELETE FROM batch_offsets"))
    create_views(bind)


def create_views(bind: sa.engine.Connection) -> None:
    """``v_batch_offsets``, ``v_batch_history`` over it and the triggers (also used by
    ``offset_ledger.ledger.tables`` when ``metadata.create_all`` builds a schema without migrations)."""
    pg = bind.dialect.name == "postgresql"
    bind.exec_driver_sql((f"CREATE VIEW v_batch_offsets AS {(_VIEW_PG if pg else _VIEW_SQLITE).strip()}"))
    if pg:
        bind.exec_driver_sql((f"CREATE OR REPLACE VIEW v_batch_history AS {_HISTORY.format(source='v_batch_offsets')}"))
        bind.exec_driver_sql((_PG_FUNCTIONS))
        bind.exec_driver_sql((_PG_TRIGGERS))
    else:
        bind.exec_driver_sql(("DROP VIEW IF EXISTS v_batch_history"))
        bind.exec_driver_sql((f"CREATE VIEW v_batch_history AS {_HISTORY.format(source='v_batch_offsets')}"))
        for sql in _SQLITE_TRIGGERS:
            bind.exec_driver_sql((sql))


def downgrade() -> None:
    bind = op.get_bind()
    pg = bind.dialect.name == "postgresql"
    if pg:
        bind.execute(sa.text("DROP TRIGGER batch_offsets_fold ON batch_offsets"))
        bind.execute(sa.text(f"CREATE OR REPLACE VIEW v_batch_history AS {_HISTORY.format(source='batch_offsets')}"))
        bind.execute(sa.text("DROP VIEW v_batch_offsets"))
        bind.exec_driver_sql("DROP FUNCTION offset_ranges_fold(); DROP FUNCTION offset_ranges_change()")
    else:
        bind.execute(sa.text("DROP TRIGGER batch_offsets_fold"))
        bind.execute(sa.text("DROP VIEW v_batch_history"))
        bind.execute(sa.text(f"CREATE VIEW v_batch_history AS {_HISTORY.format(source='batch_offsets')}"))
        bind.execute(sa.text("DROP VIEW v_batch_offsets"))
    lo, hi = _id_bounds()
    _chunked(_BACK_PG if pg else _BACK_SQLITE, "rebuilding per-partition rows", lo, hi)
    op.drop_table("offset_ranges")
