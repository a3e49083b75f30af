"""``offset_ranges`` partitions on PostgreSQL (0018): made ahead of the writers, swapped out by prune.

The table is partitioned by range of ``batch_pk``, the batch's key from a sequence, so a writer's plain
INSERT lands in the newest partition. Each partition covers ``width`` batch ids: about six hours of
batches at the rate of the newest (up to) 100,000, at least 10,000 ids. Why six hours: prune removes
whole partitions, and the one holding the cutoff is rebuilt from the rows it keeps, so a prune copies
at most six hours of history (the rest is dropped, whatever its size); a 30-day retention holds ~120
partitions, few enough that a query which cannot skip partitions plans quickly.

- ``ensure_ahead`` keeps eight empty partitions (two days) ahead of the newest batch. ``db upgrade``,
  ``prune`` and every process that checks the schema at start (``engine.ensure_schema``) call it; it
  is never run on the recording path. A DEFAULT partition takes what arrives past them anyway, so a writer never
  fails; prune deletes old rows there row by row, as before 0018.
- ``swap_out`` replaces a partition by a new table holding only the rows to keep (copied under a lock
  that blocks writes to that partition only), detaches the old one and drops it: one short exclusive
  lock on ``offset_ranges`` (``lock_timeout`` bounded, retried), no dead tuples, and a cost that follows
  the rows kept, not the rows removed. Which rows to keep is read under that lock: those of batches
  newer than the cutoff or protected, never a row whose batch is gone (0020: no foreign key).

Only partitions wholly below the newest batch are swapped: writers never insert there.
"""

from __future__ import annotations

import logging
import re
import time
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import DateTime, bindparam, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

log = logging.getLogger(__name__)

PARENT = "offset_ranges"
MIN_WIDTH = 10_000
AHEAD = 8
#: How long a partition change waits for its lock before it gives up and retries (a long reader holds
#: the table: an exclusive lock queued behind it would stop every writer meanwhile).
LOCK_TIMEOUT = "2s"
TRIES = 5
# An advisory lock key of its own: two processes never make or swap partitions at once.
_PARTITION_LOCK_KEY = 0x0FF5E7_0018

_BOUND = re.compile(r"FOR VALUES FROM \((MINVALUE|'?(-?\d+)'?)\) TO \((MAXVALUE|'?(-?\d+)'?)\)")


@dataclass(frozen=True)
class Partition:
    """One partition: ``[lo, hi)`` in batch ids (None: unbounded), or the DEFAULT one."""

    name: str
    lo: int | None
    hi: int | None
    bound: str  # as PostgreSQL prints it ("FOR VALUES FROM (..) TO (..)" or "DEFAULT")

    @property
    def default(self) -> bool:
        return self.bound == "DEFAULT"


def partitioned(conn: Connection) -> bool:
    """Whether ``offset_ranges`` is a partitioned table here (PostgreSQL at 0018 or later)."""
    if conn.dialect.name != "postgresql":
        return False
    return conn.execute(text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"), {"t": PARENT}).scalar() == "p"


def partitions(conn: Connection) -> list[Partition]:
    """The partitions of ``offset_ranges``, ranges in id order, the DEFAULT one last."""
    out = []
    for name, bound in conn.execute(text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c "
            "ON c.oid = i.inhrelid WHERE i.inhparent = CAST(:t AS regclass)"), {"t": PARENT}):
        m = _BOUND.match(bound)
        lo = int(m.group(2)) if m and m.group(2) is not None else None
        hi = int(m.group(4)) if m and m.group(4) is not None else None
        out.append(Partition(name, lo, hi, bound))
    return sorted(out, key=lambda p: (p.default, -1 if p.lo is None else p.lo))


def width(conn: Connection) -> int:
    """Batch ids per partition: six hours at the rate of the newest (up to) 100,000 batches, rounded up
    to a multiple of MIN_WIDTH (MIN_WIDTH when there is no rate yet)."""
    row = conn.execute(text(
        "SELECT hi.id - lo.id, EXTRACT(EPOCH FROM hi.batch_time - lo.batch_time) "
        "FROM (SELECT id, batch_time FROM batches ORDER BY id DESC LIMIT 1) hi, "
        "LATERAL (SELECT id, batch_time FROM batches WHERE id >= hi.id - 100000 ORDER BY id LIMIT 1) lo")).first()
    if row is None or not row[1] or float(row[1]) <= 0:
        return MIN_WIDTH
    per_6h = int(row[0] * 6 * 3600 / float(row[1]))
    return max(MIN_WIDTH, -(-per_6h // MIN_WIDTH) * MIN_WIDTH)


def _newest_id(conn: Connection) -> int:
    return int(conn.execute(text("SELECT COALESCE(MAX(id), 0) FROM batches")).scalar_one())


def _locked(conn: Connection) -> bool:
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    return bool(conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _PARTITION_LOCK_KEY}).scalar())


def ensure_ahead(engine: Engine, ahead: int = AHEAD, width_ids: int | None = None) -> list[str]:
    """Make partitions until ``ahead`` of them lie wholly past the newest batch; the names made.

    Attached as empty tables (ATTACH takes a lock that writers and readers do not wait for; the
    DEFAULT partition is scanned for rows of the new range, and is empty in steady state)."""
    try:
        return _ensure_ahead(engine, ahead, width_ids)
    except OperationalError as exc:
        if getattr(exc.orig, "pgcode", None) != "55P03":
            raise
        # A long reader holds the DEFAULT partition: the next call makes them (the DEFAULT takes rows meanwhile).
        log.info("offset_ranges: partitions ahead not made now (lock busy)")
        return []


def _ensure_ahead(engine: Engine, ahead: int, width_ids: int | None) -> list[str]:
    made: list[str] = []
    with engine.begin() as conn:
        if not partitioned(conn) or not _locked(conn):
            return made
        step = width_ids or width(conn)
        newest = _newest_id(conn)
        ranges = [p for p in partitions(conn) if not p.default]
        top = max((p.hi for p in ranges if p.hi is not None), default=newest + 1)
        # Rows the DEFAULT partition took (nobody made partitions in time) stay there: start past them.
        spill = conn.execute(text(f"SELECT MAX(batch_pk) FROM {PARENT}_default")).scalar() \
            if any(p.default for p in partitions(conn)) else None
        if spill is not None and spill >= top:
            top = int(spill) + 1
        while top <= newest + ahead * step:
            name = f"{PARENT}_p{top}"
            conn.execute(text(f"CREATE TABLE {name} (LIKE {PARENT})"))
            conn.execute(text(f"ALTER TABLE {name} ADD CONSTRAINT {name}_bound "
                              f"CHECK (batch_pk IS NOT NULL AND batch_pk >= {top} AND batch_pk < {top + step})"))
            conn.execute(text(f"ALTER TABLE {PARENT} ATTACH PARTITION {name} "
                              f"FOR VALUES FROM ({top}) TO ({top + step})"))
            made.append(name)
            top += step
    if made:
        log.info("offset_ranges: partitions %s made ahead", ", ".join(made))
    return made


@dataclass(frozen=True)
class Swapped:
    """One partition prune replaced by the rows it keeps."""

    name: str
    kept_rows: int
    removed_ranges: int  # partition-offsets removed
    seconds: float
    locked_seconds: float  # the exclusive lock on offset_ranges, until the commit


def swappable(conn: Connection, cutoff: datetime, keep_ids: set[int]) -> list[tuple[Partition, list[int]]]:
    """Range partitions wholly below the newest batch holding a batch older than the cutoff that is not
    kept, each with the ids of its old batches to keep (``keep_ids``, the protected ones, in its range).

    One probe per partition, no ids fetched: the recent batches are told by their time again under
    the swap's lock (``swap_out``)."""
    newest = _newest_id(conn)
    probe = text("SELECT 1 FROM batches WHERE id >= :lo AND id < :hi AND batch_time < :cutoff "
                 "AND id <> ALL(:protected) LIMIT 1").bindparams(bindparam("cutoff", cutoff,
                                                                          type_=DateTime(timezone=True)))
    out = []
    kept = sorted(keep_ids)  # a live windowed query keeps all its history: many ids, cut by bisection
    for p in partitions(conn):
        if p.default or p.hi is None or p.hi > newest:
            continue
        lo = -(2 ** 63) if p.lo is None else p.lo
        protected = kept[bisect_left(kept, lo):bisect_left(kept, p.hi)]
        if conn.execute(probe, {"lo": lo, "hi": p.hi, "protected": protected}).first() is not None:
            out.append((p, protected))
    return out


def swap_out(engine: Engine, part: Partition, protected: Sequence[int], cutoff: datetime) -> Swapped | None:
    """Replace ``part`` by a table of its rows whose batch is newer than ``cutoff`` (read under the lock: a
    batch a slow writer committed meanwhile is kept) or in ``protected`` (the old batches prune keeps);
    None when its lock could not be had (retried ``TRIES`` times: prune then deletes its rows as it did
    before 0018). A row whose batch is gone is not copied (0020: no foreign key removes it with its
    batch). The recent ids are not passed in: an array literal of a fleet's recent batches, evaluated
    against every row, cost seconds (docs/benchmarks.md)."""
    started = time.perf_counter()
    new = f"{PARENT}_swap_{part.name.removeprefix(PARENT + '_')}"
    for attempt in range(TRIES):
        try:
            with engine.begin() as conn:
                if not _locked(conn):
                    raise _Busy()
                conn.execute(text(f"LOCK TABLE {part.name} IN SHARE MODE"))  # its writes wait; reads go on
                conn.execute(text("SET LOCAL jit = off"))  # one-off statements: compiling costs more than it saves
                b_lo = "" if part.lo is None else f"b.id >= {part.lo} AND "
                kept_batch = (f"r.batch_pk IN (SELECT b.id FROM batches b WHERE {b_lo}b.id < {part.hi} "
                              f"AND (b.batch_time >= :cutoff OR b.id = ANY(:protected)))")
                params = {"protected": list(protected), "cutoff": cutoff}
                removed = int(conn.execute(text(
                    f"SELECT COALESCE(SUM(cardinality(partitions)), 0) FROM {part.name} r WHERE NOT {kept_batch}"
                ).bindparams(bindparam("cutoff", type_=DateTime(timezone=True))), params).scalar_one())
                conn.execute(text(f"CREATE TABLE {new} (LIKE {PARENT})"))
                kept = conn.execute(text(f"INSERT INTO {new} SELECT r.* FROM {part.name} r WHERE {kept_batch}")
                                    .bindparams(bindparam("cutoff", type_=DateTime(timezone=True))), params).rowcount
                lo = "" if part.lo is None else f"batch_pk >= {part.lo} AND "
                conn.execute(text(f"ALTER TABLE {new} ADD CONSTRAINT {new}_bound "
                                  f"CHECK (batch_pk IS NOT NULL AND {lo}batch_pk < {part.hi})"))
                conn.execute(text(f"ALTER TABLE {new} ADD CONSTRAINT {new}_pkey "
                                  "PRIMARY KEY (batch_pk, source_index, topic)"))
                locked = time.perf_counter()
                conn.execute(text(f"ALTER TABLE {PARENT} DETACH PARTITION {part.name}"))  # exclusive on the parent
                conn.execute(text(f"ALTER TABLE {PARENT} ATTACH PARTITION {new} {part.bound}"))
                conn.execute(text(f"DROP TABLE {part.name}"))
                conn.execute(text(f"ALTER TABLE {new} RENAME TO {part.name}"))
            done = time.perf_counter()
            return Swapped(part.name, kept, removed, done - started, done - locked)
        except (_Busy, OperationalError) as exc:
            if isinstance(exc, OperationalError) and getattr(exc.orig, "pgcode", None) != "55P03":
                raise  # not a lock timeout
            log.info("offset_ranges: %s busy (try %d of %d)", part.name, attempt + 1, TRIES)
            time.sleep(0.2 * 2 ** attempt)
    return None


class _Busy(Exception):
    """Another process holds the partition lock."""
