"""Retention without DELETE: ``offset_ranges`` becomes a table partitioned by range of ``batch_pk`` (PostgreSQL).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26

Prune then removes aged history by swapping a whole partition out (``ledger.partitions``) instead of
deleting its rows one by one: its cost follows the rows it keeps, not the rows it removes, and it
leaves no dead tuples behind.

Why ``batch_pk``: a unique key of a partitioned table must contain the partition key, and every writer
(this release's fast statement and recorder, the previous release f245580, which inserts
``offset_ranges`` rows with ``ON CONFLICT DO NOTHING`` and ``ON CONFLICT (batch_pk, source_index,
topic)``, and 0016's fold of 4cc5ce0's rows) relies on the primary key ``(batch_pk, source_index,
topic)``. It includes ``batch_pk``, which grows with time (a sequence), so a plain INSERT of today's
columns routes to the newest partition without any writer changing. The batch time is not a column of
``offset_ranges``; a partition is aged when every batch of its id range is.

The existing table is not rewritten: under one short exclusive lock it is renamed, given a CHECK on its
id bound (a scan of its heap, no rewrite; docs/benchmarks.md has the time at 10M partition-offsets),
and attached to the new parent as its first partition, whose primary key, foreign key and row triggers
it keeps (the parent adopts its index and constraints instead of building them). Then eight partitions
ahead (two days) and a DEFAULT partition (a writer never fails for want of a partition; prune and ``db upgrade``
keep partitions ahead so that it stays empty). The view ``v_batch_offsets`` is made again (a view binds
its table when created), and the grants, row-security policies and row triggers of the old table are
put on the parent (0017's team roles keep their rights and scopes).

SQLite has no partitioning: nothing changes there (prune keeps deleting).

Downgrade copies every row back into one plain table (its cost follows the ledger's size).
"""

from __future__ import annotations

import sys
import time

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

#: The first partitions' width in batch ids when the ledger's rate cannot be measured (a new ledger).
MIN_WIDTH = 10_000
#: Partitions made ahead: two days at six hours each (``ledger.partitions.AHEAD`` as released with 0018).
AHEAD = 8

# 0016's view text, spelled out (this revision never changes): made again so that it reads the parent.
_VIEW_PG = """
SELECT b.pipeline, b.consumer_group, b.query_id, b.batch_id, r.source_index, r.topic,
       u."partition", u.from_offset, u.until_offset, b.batch_time
FROM offset_ranges r
JOIN batches b ON b.id = r.batch_pk
CROSS JOIN LATERAL unnest(r.partitions, r.from_offsets, r.until_offsets) AS u ("partition", from_offset, until_offset)
"""

_COLUMNS = """
    batch_pk bigint NOT NULL,
    source_index integer NOT NULL,
    topic varchar(255) NOT NULL,
    partitions integer[] NOT NULL,
    from_offsets bigint[] NOT NULL,
    until_offsets bigint[] NOT NULL
"""

# Ids per 6 hours at the rate of the newest (up to) 100,000 batches: ``ledger.partitions.width`` as
# released with 0018.
_WIDTH = """
SELECT hi.id - lo.id, EXTRACT(EPOCH FROM hi.batch_time - lo.batch_time)
FROM (SELECT id, batch_time FROM batches ORDER BY id DESC LIMIT 1) hi,
     LATERAL (SELECT id, batch_time FROM batches WHERE id >= hi.id - 100000 ORDER BY id LIMIT 1) lo
"""


def _width(bind: sa.engine.Connection) -> int:
    row = bind.execute(sa.text(_WIDTH)).first()
    if row is None or not row[1] or row[1] <= 0:
        return MIN_WIDTH
    per_6h = int(row[0] * 6 * 3600 / float(row[1]))
    return max(MIN_WIDTH, -(-per_6h // MIN_WIDTH) * MIN_WIDTH)


def _privileges(bind: sa.engine.Connection, table: str) -> list[str]:
    """The statements that give ``table``'s grants, row security, policies and user row triggers to
    another table of the same columns (read while ``table`` still has its name: expressions print it)."""
    out: list[str] = []
    for grantee, privilege in bind.execute(sa.text(
            "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END, a.privilege_type "
            "FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee "
            "WHERE c.oid = CAST(:t AS regclass) AND a.grantee <> c.relowner"), {"t": table}):
        out.append(f"GRANT {privilege} ON @TABLE@ TO {grantee}")
    if bind.execute(sa.text("SELECT relrowsecurity FROM pg_class WHERE oid = CAST(:t AS regclass)"),
                    {"t": table}).scalar():
        out.append("ALTER TABLE @TABLE@ ENABLE ROW LEVEL SECURITY")
    for name, command, permissive, to, qual, check in bind.execute(sa.text(
            "SELECT quote_ident(policyname), cmd, permissive, "
            "(SELECT string_agg(quote_ident(r), ', ') FROM unnest(roles) r), qual, with_check FROM pg_policies "
            "WHERE schemaname = current_schema() AND tablename = :t ORDER BY policyname"), {"t": table}):
        out.append(f"CREATE POLICY {name} ON @TABLE@ AS {permissive} FOR {command} TO {to}"
                   + (f" USING ({qual})" if qual else "") + (f" WITH CHECK ({check})" if check else ""))
    for (definition,) in bind.execute(sa.text(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = CAST(:t AS regclass) "
            "AND NOT tgisinternal ORDER BY tgname"), {"t": table}):
        out.append(definition.replace(f" ON {_schema(bind)}.{table} ", " ON @TABLE@ ").replace(
            f" ON {table} ", " ON @TABLE@ "))
    return out


def _schema(bind: sa.engine.Connection) -> str:
    return str(bind.execute(sa.text("SELECT current_schema()")).scalar_one())


def _drop_user_triggers(bind: sa.engine.Connection, table: str) -> None:
    for (name,) in bind.execute(sa.text("SELECT tgname FROM pg_trigger WHERE tgrelid = CAST(:t AS regclass) "
                                        "AND NOT tgisinternal"), {"t": table}).all():
        bind.exec_driver_sql(f'DROP TRIGGER "{name}" ON {table}')


def _next_id(bind: sa.engine.Connection) -> int:
    """The first batch id no batch has yet (the sequence's next value; it is not consumed)."""
    seq = bind.execute(sa.text("SELECT pg_get_serial_sequence('batches', 'id')")).scalar_one()
    last, called = bind.execute(sa.text(f"SELECT last_value, is_called FROM {seq}")).one()
    return int(last) + 1 if called else int(last)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    width = _width(bind)
    privileges = _privileges(bind, "offset_ranges")
    # The locked step: writers and readers of offset_ranges wait from here to the commit.
    locked = time.monotonic()
    bind.exec_driver_sql("LOCK TABLE offset_ranges IN ACCESS EXCLUSIVE MODE")
    first = _next_id(bind)
    _drop_user_triggers(bind, "offset_ranges")
    bind.exec_driver_sql("ALTER TABLE offset_ranges RENAME TO offset_ranges_p0")
    bind.exec_driver_sql("ALTER TABLE offset_ranges_p0 RENAME CONSTRAINT pk_offset_ranges TO offset_ranges_p0_pkey")
    bind.exec_driver_sql("ALTER TABLE offset_ranges_p0 RENAME CONSTRAINT fk_offset_ranges_batch_pk_batches "
                         "TO offset_ranges_p0_batch_pk_fkey")
    # Validated by one scan of the heap (no rewrite), so that ATTACH below needs no scan of its own.
    bind.exec_driver_sql(f"ALTER TABLE offset_ranges_p0 ADD CONSTRAINT offset_ranges_p0_bound "
                         f"CHECK (batch_pk IS NOT NULL AND batch_pk < {first})")
    bind.exec_driver_sql(f"CREATE TABLE offset_ranges ({_COLUMNS}) PARTITION BY RANGE (batch_pk)")
    bind.exec_driver_sql("ALTER TABLE offset_ranges ADD CONSTRAINT pk_offset_ranges "
                         "PRIMARY KEY (batch_pk, source_index, topic)")
    bind.exec_driver_sql("ALTER TABLE offset_ranges ADD CONSTRAINT fk_offset_ranges_batch_pk_batches "
                         "FOREIGN KEY (batch_pk) REFERENCES batches (id) ON DELETE CASCADE")
    bind.exec_driver_sql(f"ALTER TABLE offset_ranges ATTACH PARTITION offset_ranges_p0 "
                         f"FOR VALUES FROM (MINVALUE) TO ({first})")
    for lo in range(first, first + AHEAD * width, width):
        bind.exec_driver_sql(f"CREATE TABLE offset_ranges_p{lo} PARTITION OF offset_ranges "
                             f"FOR VALUES FROM ({lo}) TO ({lo + width})")
    bind.exec_driver_sql("CREATE TABLE offset_ranges_default PARTITION OF offset_ranges DEFAULT")
    bind.exec_driver_sql(f"CREATE OR REPLACE VIEW v_batch_offsets AS {_VIEW_PG.strip()}")
    for statement in privileges:
        bind.exec_driver_sql(statement.replace("@TABLE@", "offset_ranges"))
    print(f"0018: offset_ranges partitioned by batch_pk (first partition: ids below {first}, then {width:,} ids "
          f"each); writers waited {time.monotonic() - locked:.2f} s before the commit", file=sys.stderr, flush=True)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    privileges = _privileges(bind, "offset_ranges")
    bind.exec_driver_sql("LOCK TABLE offset_ranges IN ACCESS EXCLUSIVE MODE")
    _drop_user_triggers(bind, "offset_ranges")
    bind.exec_driver_sql("ALTER TABLE offset_ranges RENAME TO offset_ranges_parted")
    bind.exec_driver_sql("ALTER TABLE offset_ranges_parted RENAME CONSTRAINT pk_offset_ranges "
                         "TO offset_ranges_parted_pkey")
    bind.exec_driver_sql(f"CREATE TABLE offset_ranges ({_COLUMNS})")
    bind.exec_driver_sql("INSERT INTO offset_ranges SELECT batch_pk, source_index, topic, partitions, from_offsets, "
                         "until_offsets FROM offset_ranges_parted ORDER BY batch_pk, source_index, topic")
    bind.exec_driver_sql("ALTER TABLE offset_ranges ADD CONSTRAINT pk_offset_ranges "
                         "PRIMARY KEY (batch_pk, source_index, topic)")
    bind.exec_driver_sql(f"CREATE OR REPLACE VIEW v_batch_offsets AS {_VIEW_PG.strip()}")
    bind.exec_driver_sql("DROP TABLE offset_ranges_parted")
    bind.exec_driver_sql("ALTER TABLE offset_ranges ADD CONSTRAINT fk_offset_ranges_batch_pk_batches "
                         "FOREIGN KEY (batch_pk) REFERENCES batches (id) ON DELETE CASCADE")
    for statement in privileges:
        bind.exec_driver_sql(statement.replace("@TABLE@", "offset_ranges"))
