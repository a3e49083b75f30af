"""Positions as a row per topic: a batch costs one position write per topic, not one per partition.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28

Every batch rewrote one ``positions`` row per partition: 100 WAL records of >= 95 bytes, 69-78 of
them framing, for a 100-partition batch (docs/benchmarks.md, issue 49). ``topic_positions`` keeps
one row per (pipeline, consumer group, topic): the partitions and their next offsets as parallel
arrays, and who placed each one as a short list of movers that ``stamps`` points into (NULL: one
mover placed them all, the steady state). A batch changes it with one UPDATE per topic.

- ``v_positions`` unnests it with the columns ``positions`` had; ``v_current_positions`` reads it
  (same columns, same grants: CREATE OR REPLACE). INSTEAD OF triggers take single-row writes.
- ``positions`` stays as the previous release's name (its listener and restart helper read it and
  write it with ``INSERT ... ON CONFLICT`` on its key, which no view accepts). On PostgreSQL its
  triggers fold every write into ``topic_positions``, and ``topic_positions``' trigger keeps the rows
  ``positions`` holds for a pipeline and group current, so the previous release reads what this one
  wrote. The migration keeps the rows: a previous release running on the migrated ledger reads the
  truth. Once none runs, ``TRUNCATE positions`` ends the mirroring (a probe of an empty index per
  write then); a ledger created at this revision starts empty. To be dropped in a later release.
- The copy runs in chunks of pipelines, printing progress on stderr; writers keep writing
  ``positions`` meanwhile (it is only read) until a short final step locks it, converts again the
  topics whose rows changed since and creates the triggers.

SQLite: the same table and view; its INSTEAD OF triggers call a function each connection of
``make_engine`` registers (``offset_ledger.ledger.sqlite_positions.sqlite_set``). No compatibility
triggers on ``positions`` (a SQLite ledger has one process; no rolling upgrade).

Downgrade rebuilds ``positions`` from the rows per topic.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

#: Pipelines (pipeline, consumer group) per copy statement.
CHUNK_GROUPS = 500

_COLUMNS = 'pipeline, consumer_group, topic, "partition", next_offset, updated_at, batch_id, reset_id, generation_id, query_id'

# v_current_positions as 0003 defined it, over v_positions (spelled out: a released view never changes).
_CURRENT = """
    SELECT p.pipeline, p.consumer_group, p.topic, p."partition", p.next_offset,
           p.updated_at, p.query_id, p.batch_id, p.reset_id,
           CASE WHEN p.reset_id IS NOT NULL THEN 'reset'
                WHEN p.generation_id IS NOT NULL AND p.query_id IS NULL THEN 'generation'
                ELSE 'batch' END AS placed_by,
           p.generation_id
    FROM {source} p
"""

_VIEW_PG = """
SELECT t.pipeline, t.consumer_group, t.topic, u."partition", u.next_offset,
       t.moved_at[coalesce(u.stamp, 1)] AS updated_at,
       t.moved_batch_ids[coalesce(u.stamp, 1)] AS batch_id,
       t.moved_reset_ids[coalesce(u.stamp, 1)] AS reset_id,
       t.moved_generation_ids[coalesce(u.stamp, 1)] AS generation_id,
       CAST(t.moved_query_ids[coalesce(u.stamp, 1)] AS varchar(64)) AS query_id
FROM topic_positions t
CROSS JOIN LATERAL unnest(t.partitions, t.next_offsets, t.stamps) AS u ("partition", next_offset, stamp)
"""

_VIEW_SQLITE = """
SELECT pipeline, consumer_group, topic, "partition", next_offset,
       json_extract(moved_at, '$[' || s || ']') AS updated_at,
       json_extract(moved_batch_ids, '$[' || s || ']') AS batch_id,
       json_extract(moved_reset_ids, '$[' || s || ']') AS reset_id,
       json_extract(moved_generation_ids, '$[' || s || ']') AS generation_id,
       json_extract(moved_query_ids, '$[' || s || ']') AS query_id
FROM (SELECT t.pipeline, t.consumer_group, t.topic, t.moved_at, t.moved_batch_ids, t.moved_reset_ids,
             t.moved_generation_ids, t.moved_query_ids, p.value AS "partition",
             json_extract(t.next_offsets, '$[' || p.key || ']') AS next_offset,
             coalesce(json_extract(t.stamps, '$[' || p.key || ']'), 1) - 1 AS s
      FROM topic_positions t, json_each(t.partitions) p)
"""

# One partition's position set (or dropped: p_drop) in its topic's row, the movers kept compact and in
# order of first use, stamps NULL when one mover remains: what ledger.position_store.encode makes.
_PG_FUNCTIONS = """
CREATE OR REPLACE FUNCTION offset_ledger_position_set(
    p_pipeline text, p_group text, p_topic text, p_partition integer, p_drop boolean, p_next bigint,
    p_at timestamptz, p_batch bigint, p_reset bigint, p_generation bigint, p_query text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n integer;
    i integer;
    m integer;
    st integer[];
    map integer[];
    a_at timestamptz[] := '{}';
    a_batch bigint[] := '{}';
    a_reset bigint[] := '{}';
    a_gen bigint[] := '{}';
    a_query text[] := '{}';
BEGIN
    SELECT * INTO r FROM topic_positions
    WHERE pipeline = p_pipeline AND consumer_group = p_group AND topic = p_topic FOR UPDATE;
    IF NOT FOUND THEN
        IF NOT p_drop THEN
            INSERT INTO topic_positions (pipeline, consumer_group, topic, partitions, stamps, next_offsets, moved_at,
                                         moved_batch_ids, moved_reset_ids, moved_generation_ids, moved_query_ids)
            VALUES (p_pipeline, p_group, p_topic, ARRAY[p_partition], NULL, ARRAY[p_next], ARRAY[p_at],
                    ARRAY[p_batch], ARRAY[p_reset], ARRAY[p_generation], ARRAY[p_query]);
        END IF;
        RETURN;
    END IF;
    n := cardinality(r.partitions);
    st := coalesce(r.stamps, array_fill(1, ARRAY[n]));
    i := array_position(r.partitions, p_partition);
    IF p_drop THEN
        IF i IS NULL THEN
            RETURN;
        END IF;
        r.partitions := r.partitions[1:i - 1] || r.partitions[i + 1:n];
        r.next_offsets := r.next_offsets[1:i - 1] || r.next_offsets[i + 1:n];
        st := st[1:i - 1] || st[i + 1:n];
        IF cardinality(r.partitions) = 0 THEN
            DELETE FROM topic_positions WHERE pipeline = p_pipeline AND consumer_group = p_group AND topic = p_topic;
            RETURN;
        END IF;
    ELSE
        m := NULL;
        FOR j IN 1..cardinality(r.moved_at) LOOP
            IF r.moved_at[j] = p_at AND r.moved_batch_ids[j] IS NOT DISTINCT FROM p_batch
               AND r.moved_reset_ids[j] IS NOT DISTINCT FROM p_reset
               AND r.moved_generation_ids[j] IS NOT DISTINCT FROM p_generation
               AND r.moved_query_ids[j] IS NOT DISTINCT FROM p_query THEN
                m := j;
                EXIT;
            END IF;
        END LOOP;
        IF m IS NULL THEN
            r.moved_at := array_append(r.moved_at, p_at);
            r.moved_batch_ids := array_append(r.moved_batch_ids, p_batch);
            r.moved_reset_ids := array_append(r.moved_reset_ids, p_reset);
            r.moved_generation_ids := array_append(r.moved_generation_ids, p_generation);
            r.moved_query_ids := array_append(r.moved_query_ids, p_query);
            m := cardinality(r.moved_at);
        END IF;
        IF i IS NULL THEN  -- a new partition, in ascending place
            i := coalesce((SELECT min(k) FROM generate_subscripts(r.partitions, 1) k
                           WHERE r.partitions[k] > p_partition), n + 1);
            r.partitions := r.partitions[1:i - 1] || p_partition || r.partitions[i:n];
            r.next_offsets := r.next_offsets[1:i - 1] || p_next || r.next_offsets[i:n];
            st := st[1:i - 1] || m || st[i:n];
        ELSE
            r.next_offsets[i] := p_next;
            st[i] := m;
        END IF;
    END IF;
    map := array_fill(0, ARRAY[cardinality(r.moved_at)]);
    FOR k IN 1..cardinality(st) LOOP
        IF map[st[k]] = 0 THEN
            a_at := array_append(a_at, r.moved_at[st[k]]);
            a_batch := array_append(a_batch, r.moved_batch_ids[st[k]]);
            a_reset := array_append(a_reset, r.moved_reset_ids[st[k]]);
            a_gen := array_append(a_gen, r.moved_generation_ids[st[k]]);
            a_query := array_append(a_query, r.moved_query_ids[st[k]]);
            map[st[k]] := cardinality(a_at);
        END IF;
        st[k] := map[st[k]];
    END LOOP;
    UPDATE topic_positions SET partitions = r.partitions,
           stamps = CASE WHEN cardinality(a_at) = 1 THEN NULL ELSE st END,
           next_offsets = r.next_offsets, moved_at = a_at, moved_batch_ids = a_batch, moved_reset_ids = a_reset,
           moved_generation_ids = a_gen, moved_query_ids = a_query
    WHERE pipeline = p_pipeline AND consumer_group = p_group AND topic = p_topic;
END $$;

CREATE OR REPLACE FUNCTION offset_ledger_v_positions_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND (TG_OP = 'DELETE' OR (OLD.pipeline, OLD.consumer_group, OLD.topic, OLD."partition")
            IS DISTINCT FROM (NEW.pipeline, NEW.consumer_group, NEW.topic, NEW."partition")) THEN
        PERFORM offset_ledger_position_set(OLD.pipeline, OLD.consumer_group, OLD.topic, OLD."partition", true,
                                           NULL, NULL, NULL, NULL, NULL, NULL);
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    PERFORM offset_ledger_position_set(NEW.pipeline, NEW.consumer_group, NEW.topic, NEW."partition", false,
                                       NEW.next_offset, NEW.updated_at, NEW.batch_id, NEW.reset_id,
                                       NEW.generation_id, NEW.query_id);
    RETURN NEW;
END $$;

-- The previous release's writes to positions: folded into topic_positions, and kept (it reads them
-- back). Depth 1 only: the mirror below writes positions from inside topic_positions' trigger.
CREATE OR REPLACE FUNCTION offset_ledger_positions_fold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND (OLD.pipeline, OLD.consumer_group, OLD.topic, OLD."partition")
            IS DISTINCT FROM (NEW.pipeline, NEW.consumer_group, NEW.topic, NEW."partition")) THEN
        PERFORM set_config('offset_ledger.folding', 'on', true);
        PERFORM offset_ledger_position_set(OLD.pipeline, OLD.consumer_group, OLD.topic, OLD."partition", true,
                                           NULL, NULL, NULL, NULL, NULL, NULL);
        PERFORM set_config('offset_ledger.folding', '', true);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        -- Not mirrored back: this very row is what positions keeps (the mirror would write it again,
        -- inside the statement that writes it: "cannot affect row a second time").
        PERFORM set_config('offset_ledger.folding', 'on', true);
        PERFORM offset_ledger_position_set(NEW.pipeline, NEW.consumer_group, NEW.topic, NEW."partition", false,
                                           NEW.next_offset, NEW.updated_at, NEW.batch_id, NEW.reset_id,
                                           NEW.generation_id, NEW.query_id);
        PERFORM set_config('offset_ledger.folding', '', true);
        RETURN NEW;
    END IF;
    RETURN OLD;
END $$;

-- This release's writes, mirrored into positions while it holds rows of the pipeline and group (a
-- previous release may read them); an index probe and nothing else when it holds none.
CREATE OR REPLACE FUNCTION offset_ledger_positions_mirror() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    k record;
BEGIN
    IF current_setting('offset_ledger.folding', true) = 'on' THEN
        RETURN NULL;  -- the previous release's own write, folded: positions has it already
    END IF;
    IF TG_OP = 'DELETE' THEN k := OLD; ELSE k := NEW; END IF;
    IF NOT EXISTS (SELECT FROM positions WHERE pipeline = k.pipeline AND consumer_group = k.consumer_group) THEN
        RETURN NULL;
    END IF;
    DELETE FROM positions l WHERE l.pipeline = k.pipeline AND l.consumer_group = k.consumer_group
        AND l.topic = k.topic AND (TG_OP = 'DELETE' OR NOT (l."partition" = ANY (NEW.partitions)));
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO positions AS l (pipeline, consumer_group, topic, "partition", next_offset, updated_at, batch_id,
                                    reset_id, generation_id, query_id)
        SELECT v.pipeline, v.consumer_group, v.topic, v."partition", v.next_offset, v.updated_at, v.batch_id,
               v.reset_id, v.generation_id, v.query_id
        FROM v_positions v
        WHERE v.pipeline = k.pipeline AND v.consumer_group = k.consumer_group AND v.topic = k.topic
        ORDER BY v."partition"
        ON CONFLICT (pipeline, consumer_group, topic, "partition") DO UPDATE SET
            next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at, batch_id = EXCLUDED.batch_id,
            reset_id = EXCLUDED.reset_id, generation_id = EXCLUDED.generation_id, query_id = EXCLUDED.query_id
        WHERE (l.next_offset, l.updated_at, l.batch_id, l.reset_id, l.generation_id, l.query_id)
              IS DISTINCT FROM (EXCLUDED.next_offset, EXCLUDED.updated_at, EXCLUDED.batch_id, EXCLUDED.reset_id,
                                EXCLUDED.generation_id, EXCLUDED.query_id);
    END IF;
    RETURN NULL;
END $$;
"""

_PG_VIEW_TRIGGERS = """
CREATE TRIGGER v_positions_write INSTEAD OF INSERT OR UPDATE OR DELETE ON v_positions
    FOR EACH ROW EXECUTE FUNCTION offset_ledger_v_positions_write();
"""

_PG_COMPAT_TRIGGERS = """
CREATE TRIGGER positions_fold BEFORE INSERT OR UPDATE ON positions
    FOR EACH ROW EXECUTE FUNCTION offset_ledger_positions_fold();
CREATE TRIGGER positions_fold_delete AFTER DELETE ON positions
    FOR EACH ROW EXECUTE FUNCTION offset_ledger_positions_fold();
CREATE TRIGGER topic_positions_mirror AFTER INSERT OR UPDATE OR DELETE ON topic_positions
    FOR EACH ROW EXECUTE FUNCTION offset_ledger_positions_mirror();
"""

_SQLITE_SET = """
UPDATE topic_positions SET (partitions, stamps, next_offsets, moved_at, moved_batch_ids, moved_reset_ids,
                            moved_generation_ids, moved_query_ids) = (
    SELECT json_extract(j, '$.partitions'), json_extract(j, '$.stamps'), json_extract(j, '$.next_offsets'),
           json_extract(j, '$.moved_at'), json_extract(j, '$.moved_batch_ids'), json_extract(j, '$.moved_reset_ids'),
           json_extract(j, '$.moved_generation_ids'), json_extract(j, '$.moved_query_ids')
    FROM (SELECT offset_ledger_position_set(partitions, stamps, next_offsets, moved_at, moved_batch_ids,
                                            moved_reset_ids, moved_generation_ids, moved_query_ids, {args}) AS j))
WHERE pipeline = {row}.pipeline AND consumer_group = {row}.consumer_group AND topic = {row}.topic;
"""
_SQLITE_PUT = ("INSERT OR IGNORE INTO topic_positions (pipeline, consumer_group, topic, partitions, next_offsets, "
               "moved_at, moved_batch_ids, moved_reset_ids, moved_generation_ids, moved_query_ids) VALUES "
               "(NEW.pipeline, NEW.consumer_group, NEW.topic, '[]', '[]', '[]', '[]', '[]', '[]', '[]');"
               + _SQLITE_SET.format(row="NEW", args='NEW."partition", NEW.next_offset, NEW.updated_at, NEW.batch_id, '
                                                     'NEW.reset_id, NEW.generation_id, NEW.query_id'))
_SQLITE_DROP = (_SQLITE_SET.format(row="OLD", args='OLD."partition", NULL, NULL, NULL, NULL, NULL, NULL')
                + "DELETE FROM topic_positions WHERE pipeline = OLD.pipeline AND consumer_group = OLD.consumer_group "
                  "AND topic = OLD.topic AND partitions = '[]';")
_SQLITE_TRIGGERS = (
    f"CREATE TRIGGER v_positions_insert INSTEAD OF INSERT ON v_positions BEGIN {_SQLITE_PUT} END",
    f"CREATE TRIGGER v_positions_update INSTEAD OF UPDATE ON v_positions BEGIN {_SQLITE_DROP} {_SQLITE_PUT} END",
    f"CREATE TRIGGER v_positions_delete INSTEAD OF DELETE ON v_positions BEGIN {_SQLITE_DROP} END",
)

# The conversion of a chunk of pipelines: movers numbered by their first (lowest) partition.
_CONVERT_PG = """
WITH p AS (
    SELECT l.pipeline, l.consumer_group, l.topic, l."partition", l.next_offset, l.updated_at, l.batch_id, l.reset_id,
           l.generation_id, l.query_id,
           min(l."partition") OVER (PARTITION BY l.pipeline, l.consumer_group, l.topic, l.updated_at, l.batch_id,
                                                 l.reset_id, l.generation_id, l.query_id) AS first_use
    FROM positions l
    WHERE (l.pipeline, l.consumer_group) IN (SELECT * FROM unnest(CAST(:pipelines AS text[]), CAST(:groups AS text[])))
      {topic_filter}
), s AS (
    SELECT p.*, dense_rank() OVER (PARTITION BY pipeline, consumer_group, topic ORDER BY first_use) AS stamp FROM p
)
INSERT INTO topic_positions (pipeline, consumer_group, topic, partitions, stamps, next_offsets, moved_at,
                             moved_batch_ids, moved_reset_ids, moved_generation_ids, moved_query_ids)
SELECT pipeline, consumer_group, topic, array_agg("partition" ORDER BY "partition"),
       CASE WHEN max(stamp) = 1 THEN NULL ELSE array_agg(CAST(stamp AS integer) ORDER BY "partition") END,
       array_agg(next_offset ORDER BY "partition"),
       array_agg(updated_at ORDER BY stamp) FILTER (WHERE "partition" = first_use),
       array_agg(batch_id ORDER BY stamp) FILTER (WHERE "partition" = first_use),
       array_agg(reset_id ORDER BY stamp) FILTER (WHERE "partition" = first_use),
       array_agg(generation_id ORDER BY stamp) FILTER (WHERE "partition" = first_use),
       array_agg(CAST(query_id AS text) ORDER BY stamp) FILTER (WHERE "partition" = first_use)
FROM s GROUP BY pipeline, consumer_group, topic
"""

# Topics whose rows in positions differ from what topic_positions says (changed during the copy).
_CHANGED_PG = f"""
SELECT DISTINCT pipeline, consumer_group, topic FROM (
    (SELECT {_COLUMNS} FROM positions EXCEPT SELECT {_COLUMNS} FROM v_positions)
    UNION ALL
    (SELECT {_COLUMNS} FROM v_positions EXCEPT SELECT {_COLUMNS} FROM positions)) d
"""


def _say(message: str) -> None:
    print(f"0024: {message}", file=sys.stderr, flush=True)


def create_views(bind: sa.engine.Connection) -> None:
    """``v_positions``, its INSTEAD OF triggers and (PostgreSQL) the compatibility triggers on ``positions``;
    also used by ``offset_ledger.ledger.tables`` when ``metadata.create_all`` builds a schema without
    migrations."""
    pg = bind.dialect.name == "postgresql"
    bind.exec_driver_sql(f"CREATE VIEW v_positions AS {(_VIEW_PG if pg else _VIEW_SQLITE).strip()}")
    if pg:
        bind.exec_driver_sql(_PG_FUNCTIONS)
        bind.exec_driver_sql(_PG_VIEW_TRIGGERS)
        bind.exec_driver_sql(_PG_COMPAT_TRIGGERS)
    else:
        for sql in _SQLITE_TRIGGERS:
            bind.exec_driver_sql(sql)


def _privileges(bind: sa.engine.Connection, source: str, target: str) -> None:
    """``source``'s grants, row security and policies given to ``target`` (same pipeline column)."""
    for grantee, privilege in bind.execute(sa.text(
            "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END, a.privilege_type "
            "FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee "
            "WHERE c.oid = CAST(:t AS regclass) AND a.grantee <> c.relowner"), {"t": source}).all():
        bind.exec_driver_sql(f"GRANT {privilege} ON {target} TO {grantee}")
    if target.startswith("v_"):
        return
    if bind.execute(sa.text("SELECT relrowsecurity FROM pg_class WHERE oid = CAST(:t AS regclass)"),
                    {"t": source}).scalar():
        bind.exec_driver_sql(f"ALTER TABLE {target} ENABLE ROW LEVEL SECURITY")
    for name, command, permissive, to, qual, check in bind.execute(sa.text(
            "SELECT quote_ident(policyname), cmd, permissive, "
            "(SELECT string_agg(quote_ident(r), ', ') FROM unnest(roles) r), qual, with_check FROM pg_policies "
            "WHERE schemaname = current_schema() AND tablename = :t ORDER BY policyname"), {"t": source}).all():
        bind.exec_driver_sql(f"CREATE POLICY {name} ON {target} AS {permissive} FOR {command} TO {to}"
                             + (f" USING ({qual})" if qual else "") + (f" WITH CHECK ({check})" if check else ""))


def _create_table() -> None:
    op.create_table(
        "topic_positions",
        sa.Column("pipeline", sa.String(255), primary_key=True),
        sa.Column("consumer_group", sa.String(255), primary_key=True),
        sa.Column("topic", sa.String(255), primary_key=True),
        sa.Column("partitions", sa.Text() if _sqlite() else sa.ARRAY(sa.Integer()), nullable=False),
        sa.Column("stamps", sa.Text() if _sqlite() else sa.ARRAY(sa.Integer())),
        sa.Column("next_offsets", sa.Text() if _sqlite() else sa.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("moved_at", sa.Text() if _sqlite() else sa.ARRAY(sa.DateTime(timezone=True)), nullable=False),
        sa.Column("moved_batch_ids", sa.Text() if _sqlite() else sa.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("moved_reset_ids", sa.Text() if _sqlite() else sa.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("moved_generation_ids", sa.Text() if _sqlite() else sa.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("moved_query_ids", sa.Text() if _sqlite() else sa.ARRAY(sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("pipeline", "consumer_group", "topic", name="pk_topic_positions"),
    )
    storage_parameters()


def storage_parameters() -> None:
    """PostgreSQL: room on the page for the row's next version (a HOT update, logged as its changed
    middle), and rows up to a page kept inline: the default moves a row over 2 KB (~150 partitions)
    to TOAST, compressed, and every update then rewrites it whole."""
    if not _sqlite():
        op.execute("ALTER TABLE topic_positions SET (fillfactor = 50, toast_tuple_target = 8160)")


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _convert_pg(bind: sa.engine.Connection) -> int:
    groups = bind.execute(sa.text("SELECT DISTINCT pipeline, consumer_group FROM positions ORDER BY 1, 2")).all()
    started = time.monotonic()
    for i in range(0, len(groups), CHUNK_GROUPS):
        chunk = groups[i:i + CHUNK_GROUPS]
        bind.execute(sa.text(_CONVERT_PG.format(topic_filter="")), {
            "pipelines": [g[0] for g in chunk], "groups": [g[1] for g in chunk]})
        _say(f"converting positions: {min(i + CHUNK_GROUPS, len(groups))}/{len(groups)} pipelines, "
             f"{time.monotonic() - started:.1f} s")
    return len(groups)


def _convert_sqlite(bind: sa.engine.Connection) -> int:
    rows = bind.execute(sa.text(f"SELECT {_COLUMNS} FROM positions")).all()
    by_topic: dict[tuple[str, str, str], list[Any]] = {}
    for r in rows:
        by_topic.setdefault((r.pipeline, r.consumer_group, r.topic), []).append(r)
    for (pipeline, group, topic), parts in sorted(by_topic.items()):
        parts.sort(key=lambda r: r.partition)
        movers: dict[tuple[Any, ...], int] = {}
        stamps = [movers.setdefault((str(r.updated_at), r.batch_id, r.reset_id, r.generation_id, r.query_id),
                                    len(movers) + 1) for r in parts]
        cols = list(zip(*movers)) if movers else [()] * 5
        dump = json.dumps
        bind.execute(sa.text(
            "INSERT INTO topic_positions (pipeline, consumer_group, topic, partitions, stamps, next_offsets, "
            "moved_at, moved_batch_ids, moved_reset_ids, moved_generation_ids, moved_query_ids) VALUES "
            "(:p, :g, :t, :parts, :stamps, :offs, :at, :b, :r, :gen, :q)"),
            {"p": pipeline, "g": group, "t": topic, "parts": dump([r.partition for r in parts]),
             "stamps": None if len(movers) == 1 else dump(stamps), "offs": dump([r.next_offset for r in parts]),
             "at": dump([_sqlite_time(v) for v in cols[0]]), "b": dump(list(cols[1])), "r": dump(list(cols[2])),
             "gen": dump(list(cols[3])), "q": dump(list(cols[4]))})
    return len({(k[0], k[1]) for k in by_topic})


def _sqlite_time(value: str) -> str:
    """SQLite's stored DateTime text as SQLAlchemy writes it (microseconds always present)."""
    return value if "." in value else value + ".000000"


def upgrade() -> None:
    bind = op.get_bind()
    started = time.monotonic()
    _create_table()
    if _sqlite():
        n = _convert_sqlite(bind)
        bind.exec_driver_sql("DROP VIEW IF EXISTS v_current_positions")
        create_views(bind)
        bind.exec_driver_sql(f"CREATE VIEW v_current_positions AS {_CURRENT.format(source='v_positions')}")
        if n:
            _say(f"{n} pipelines converted in {time.monotonic() - started:.1f} s")
        return
    n = _convert_pg(bind)
    # The final step: writers of positions (the previous release) wait from here to the commit.
    waited = time.monotonic()
    op.execute("LOCK TABLE positions IN SHARE ROW EXCLUSIVE MODE")
    bind.exec_driver_sql(f"CREATE VIEW v_positions AS {_VIEW_PG.strip()}")
    changed = bind.execute(sa.text(_CHANGED_PG)).all()
    if changed:
        for p, g, t in changed:
            bind.execute(sa.text("DELETE FROM topic_positions WHERE pipeline = :p AND consumer_group = :g "
                                 "AND topic = :t"), {"p": p, "g": g, "t": t})
            bind.execute(sa.text(_CONVERT_PG.format(topic_filter="AND l.topic = :t")),
                         {"pipelines": [p], "groups": [g], "t": t})
    bind.exec_driver_sql(_PG_FUNCTIONS)
    bind.exec_driver_sql(_PG_VIEW_TRIGGERS)
    bind.exec_driver_sql(_PG_COMPAT_TRIGGERS)
    # Same columns and types: the view keeps its grants (CREATE OR REPLACE).
    op.execute(f"CREATE OR REPLACE VIEW v_current_positions AS {_CURRENT.format(source='v_positions')}")
    _privileges(bind, "positions", "topic_positions")
    _privileges(bind, "v_current_positions", "v_positions")
    if n:  # a fresh ledger's upgrade says nothing
        _say(f"{len(changed)} topics written during the copy converted again; writers of positions waited "
             f"{time.monotonic() - waited:.1f} s (until commit)")
        _say(f"{n} pipelines converted in {time.monotonic() - started:.1f} s")


def downgrade() -> None:
    bind = op.get_bind()
    if _sqlite():
        bind.exec_driver_sql("DROP VIEW IF EXISTS v_current_positions")
        for name in ("v_positions_insert", "v_positions_update", "v_positions_delete"):
            bind.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name}")
        bind.exec_driver_sql("DELETE FROM positions")
        bind.exec_driver_sql(f"INSERT INTO positions ({_COLUMNS}) SELECT {_COLUMNS} FROM v_positions")
        bind.exec_driver_sql(f"CREATE VIEW v_current_positions AS {_CURRENT.format(source='positions')}")
        bind.exec_driver_sql("DROP VIEW v_positions")
        op.drop_table("topic_positions")
        return
    op.execute("LOCK TABLE positions IN SHARE ROW EXCLUSIVE MODE")
    for trigger, table in (("positions_fold", "positions"), ("positions_fold_delete", "positions"),
                           ("topic_positions_mirror", "topic_positions")):
        op.execute(f"DROP TRIGGER {trigger} ON {table}")
    # positions may have been emptied (TRUNCATE once no previous release ran): rebuilt whole.
    op.execute("DELETE FROM positions")
    op.execute(f"INSERT INTO positions ({_COLUMNS}) SELECT {_COLUMNS} FROM v_positions "
               'ORDER BY pipeline, consumer_group, topic, "partition"')
    op.execute(f"CREATE OR REPLACE VIEW v_current_positions AS {_CURRENT.format(source='positions')}")
    op.execute("DROP VIEW v_positions")
    op.execute("DROP FUNCTION offset_ledger_v_positions_write(); DROP FUNCTION offset_ledger_positions_fold(); "
               "DROP FUNCTION offset_ledger_positions_mirror()")
    op.execute("DROP FUNCTION offset_ledger_position_set(text, text, text, integer, boolean, bigint, timestamptz, "
               "bigint, bigint, bigint, text)")
    n = bind.execute(sa.text("SELECT count(*) FROM positions")).scalar()
    if n:
        _say(f"downgrade: {n} positions rebuilt per partition")
    op.drop_table("topic_positions")
