"""Bulk writes of the recorder's general path: large row sets COPYed into a session-temporary stage
and inserted with ``INSERT ... SELECT ... ON CONFLICT`` on psycopg2, small ones as one ``VALUES`` list.

``BulkWriter`` is a collaborator of ``offset_ledger.ledger.recorder.Recorder`` and of its position rules."""

from __future__ import annotations

import csv
import io
from typing import Any

from sqlalchemy import Table
from sqlalchemy.engine import Connection

from offset_ledger.ledger.records import BatchRecord, csv_rows, pg_int_array

# Below this many rows a multi-row VALUES statement beats COPY's extra round trip.
_COPY_MIN_ROWS = 200


def compact_ranges(recs: list[BatchRecord], batch_pks: dict[tuple[str, int], int],
                   *, literal: bool) -> list[dict[str, Any]]:
    """``offset_ranges`` rows of ``recs``: one per (batch, source, topic), its partitions' ranges as
    parallel lists in the order Spark reported them. ``literal``: the lists as PostgreSQL array
    literals (the raw psycopg2 statements and COPY of ``BulkWriter.upsert`` take them as text)."""
    out: list[dict[str, Any]] = []
    for rec in recs:
        pk = batch_pks[(rec.batch.query_id, rec.batch.batch_id)]
        for s in rec.batch.sources:
            by_topic: dict[str, list[Any]] = {}
            for r in s.ranges:
                by_topic.setdefault(r.topic, []).append(r)
            for topic, ranges in by_topic.items():
                cols = ([r.partition for r in ranges], [r.from_offset for r in ranges],
                        [r.until_offset for r in ranges])
                if literal:
                    cols = tuple(pg_int_array(c) for c in cols)  # type: ignore[assignment]
                out.append({"batch_pk": pk, "source_index": s.source_index, "topic": topic,
                            "partitions": cols[0], "from_offsets": cols[1], "until_offsets": cols[2]})
    return out


class BulkWriter:
    """Bulk statements on one dialect: ``insert`` its INSERT construct, ``execute_values`` psycopg2's (or None)."""

    def __init__(self, insert: Any, execute_values: Any) -> None:
        self.insert = insert
        self.execute_values = execute_values

    def _copy_upsert(self, conn: Connection, table: Table, columns: list[str], csv_text: str,
                     tail: str, returning: bool) -> list[tuple[Any, ...]]:
        """COPY ``csv_text`` into a session-temporary stage, then INSERT ... SELECT ``tail`` from it."""
        quote = conn.dialect.identifier_preparer.quote
        cols = ", ".join(quote(c) for c in columns)
        stage = quote(f"_ol_stage_{table.name}")
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            made = conn.connection.info.setdefault("offset_ledger_stages", set())
            if stage not in made:
                cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {stage} AS "
                               f"SELECT {cols} FROM {quote(table.name)} WITH NO DATA")
                made.add(stage)
            cursor.copy_expert(f"COPY {stage} ({cols}) FROM STDIN WITH (FORMAT csv)", io.StringIO(csv_text))
            # Emptying the stage in the same statement leaves it clean even if we fail later.
            cursor.execute(f"WITH staged AS (DELETE FROM {stage} RETURNING {cols}) "
                           f"INSERT INTO {quote(table.name)} ({cols}) SELECT {cols} FROM staged {tail}")
            return [tuple(r) for r in cursor.fetchall()] if returning else []
        finally:
            cursor.close()

    def upsert(self, conn: Connection, table: Table, rows: list[dict[str, Any]], conflict: tuple[str, ...],
              *, update: tuple[str, ...] = (), returning: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
        """Multi-row ``INSERT ... ON CONFLICT (conflict) DO NOTHING | DO UPDATE`` of ``rows``.

        On psycopg2, small sets go as one ``VALUES (...), (...)`` statement (``execute_values``;
        SQLAlchemy would send an ON CONFLICT executemany row by row), large ones are COPYed into a
        session-temporary staging table and inserted from there with the same ON CONFLICT clause: for
        large sets COPY plus INSERT ... SELECT is cheaper than one multi-row INSERT, whose parsing
        dominates (docs/benchmarks.md).
        """
        if self.execute_values is not None:
            quote = conn.dialect.identifier_preparer.quote
            columns = list(rows[0])
            cols = ", ".join(quote(c) for c in columns)
            action = ("DO UPDATE SET " + ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in update)
                      if update else "DO NOTHING")
            tail = f"ON CONFLICT ({', '.join(quote(c) for c in conflict)}) {action}"
            if returning:
                tail += " RETURNING " + ", ".join(quote(c) for c in returning)
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                if len(rows) < _COPY_MIN_ROWS:
                    result = self.execute_values(
                        cursor, f"INSERT INTO {quote(table.name)} ({cols}) VALUES %s {tail}",
                        [tuple(r[c] for c in columns) for r in rows], page_size=1000, fetch=bool(returning))
                    return [tuple(r) for r in result] if returning else []
            finally:
                cursor.close()
            buffer = io.StringIO()
            csv.writer(buffer).writerows(csv_rows(rows, columns))
            return self._copy_upsert(conn, table, columns, buffer.getvalue(), tail, bool(returning))
        stmt = self.insert(table)
        if update:
            stmt = stmt.on_conflict_do_update(index_elements=list(conflict),
                                              set_={c: stmt.excluded[c] for c in update})
        else:
            stmt = stmt.on_conflict_do_nothing(index_elements=list(conflict))
        if returning:
            return [tuple(r) for r in conn.execute(stmt.returning(*(table.c[c] for c in returning)), rows)]
        conn.execute(stmt, rows)
        return []
