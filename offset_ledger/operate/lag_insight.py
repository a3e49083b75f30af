"""Lag beyond records: time lag, drift against the Kafka consumer group, and status (``status``).

``LagInsight.enrich`` takes partitions whose record lag is known and adds, in a fixed number of
round trips whatever the number of pipelines:

- **time lag**: the age of the record at the position (its Kafka timestamp; 0 when caught up),
  read with one group-less consumer whose fetches go once per broker for every partition
  (``KafkaAdapter.record_timestamps``). A record never changes, so a (partition, offset) ->
  timestamp cache spares re-reading positions that did not move between scrapes.
- **drift**: the group's committed offset minus the ledger position, per partition, for groups
  that committed anything (one OffsetFetch per coordinator for all groups).
- **status**: ``status.partition_status`` over the window facts the ledger has (one query over
  the recent batches' ranges: ``offset_ranges`` on PostgreSQL, the ``v_batch_offsets`` view on
  SQLite) and the lag observations this object kept from earlier calls.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, and_, bindparam, case, func, select
from sqlalchemy.engine import Connection

from offset_ledger.errors import KafkaError
from offset_ledger.ledger.queries import positions_and_window_pg
from offset_ledger.ledger.tables import batch_offsets, batches, offset_ranges, positions
from offset_ledger.rules.model import Position, TopicPartition
from offset_ledger.rules.status import status_of

if TYPE_CHECKING:
    from offset_ledger.kafka.adapter import KafkaAdapter
    from offset_ledger.operate.answers import PartitionLag

log = logging.getLogger(__name__)

_TS_CACHE_MAX = 200_000
_SAMPLES_PER_PARTITION = 32

Key = tuple[str, str, str, int]  # pipeline, consumer group, topic, partition


@dataclass(frozen=True)
class WindowFacts:
    """What the ledger says about one partition within the status window."""

    consumed: int = 0
    highest_end: int | None = None  # set only when a window batch ended past the position (rewound)
    moved: bool = False


def status_window() -> timedelta:
    """``OFFSET_LEDGER_STATUS_WINDOW`` (default 5m)."""
    from offset_ledger.config import settings
    from offset_ledger.rules.durations import parse_duration

    return parse_duration(settings().status_window, "OFFSET_LEDGER_STATUS_WINDOW")


def positions_and_window(
    conn: Connection, since: datetime, pipeline: str | None = None, consumer_group: str | None = None,
) -> tuple[dict[tuple[str, str], list[Position]], dict[Key, WindowFacts]]:
    """Positions (of every pipeline, or of one pipeline and group), sorted, and per position what the
    window's batches tell: records read, an end past the position (a rewind), whether one moved it.

    One statement: the position is read with the batches (read apart, a batch committed in between
    would end past an older position and look like a rewind), and a list costs one round trip.
    """
    params: dict[str, Any] = {"since": since}
    if pipeline is not None:
        params.update(pipeline=pipeline, consumer_group=consumer_group)
    positions_by: dict[tuple[str, str], list[Position]] = {}
    out: dict[Key, WindowFacts] = {}
    mine: list[Position] = []
    key: tuple[str, str] | None = None
    # One fetchall and tuple unpacking (rows come sorted by pipeline and group): a third of the
    # time of attribute access and a dict look-up per row at 10,000 positions.
    if conn.dialect.name == "postgresql":  # one row per topic, unrolled (issue 49)
        rows: Any = positions_and_window_pg(conn, since, pipeline, consumer_group)
    else:
        rows = conn.execute(_positions_and_window_stmt(pipeline is not None, False), params).all()
    for pipe, group, topic, partition, next_offset, moved, lo, hi in rows:
        if (pipe, group) != key:
            key = (pipe, group)
            mine = positions_by.setdefault(key, [])
        mine.append(Position(topic, partition, next_offset))
        if hi is not None:
            out[(pipe, group, topic, partition)] = _facts(lo, hi, next_offset, bool(moved))
        elif moved:
            out[(pipe, group, topic, partition)] = WindowFacts(0, None, True)
    return positions_by, out


def _facts(lo: int | None, hi: int, position: int | None, moved: bool) -> WindowFacts:
    lo = lo if lo is not None else hi
    # Only an end beyond the position as of the same statement says "rewound" (the rule's REWOUND).
    rewound_past = int(hi) if position is not None and int(hi) > int(position) else None
    return WindowFacts(max(0, int(hi) - int(lo)), rewound_past, moved)


def _window(g: Any, since: Any) -> Any:
    """Per partition of the (pipeline, group, topic) triples ``g``: lowest start and highest end of the
    window's batches (SQLite, through the view; PostgreSQL: ``_window_compact``).

    Driven from the triples that have positions, so each is one range scan of the (pipeline, topic,
    consumer_group, batch_time) index: filtered on batch_time alone, the planner scanned the whole
    history (80 ms per pipelines list at 1,000,000 rows, window empty). Partitions without a
    position are never asked about.
    """
    return (select(batch_offsets.c.pipeline, batch_offsets.c.consumer_group, batch_offsets.c.topic,
                   batch_offsets.c.partition, func.min(batch_offsets.c.from_offset).label("lo"),
                   func.max(batch_offsets.c.until_offset).label("hi"))
            .select_from(g.join(batch_offsets, and_(
                batch_offsets.c.pipeline == g.c.pipeline, batch_offsets.c.topic == g.c.topic,
                batch_offsets.c.consumer_group == g.c.consumer_group, batch_offsets.c.batch_time >= since)))
            .group_by(batch_offsets.c.pipeline, batch_offsets.c.consumer_group, batch_offsets.c.topic,
                      batch_offsets.c.partition)).subquery("w")


def _window_compact(g: Any, since: Any) -> Any:
    """PostgreSQL: ``_window`` read from ``offset_ranges`` itself, per (triple number ``g.n``, partition).

    Same answer as through ``v_batch_offsets``, in half the time at 300 window batches x 100
    partitions (7 against 15 ms, docs/benchmarks.md): the arrays are unnested in the select list (a
    ProjectSet, where the view's ``LATERAL unnest`` fills a tuplestore per row) and the 30,000
    elements are grouped on two integers instead of the pipeline's, group's and topic's text. The
    window's batches are still found from each triple's (pipeline, consumer_group, batch_time) index
    range on ``batches``; their compact rows by primary key.
    """
    x = (select(g.c.n, func.unnest(offset_ranges.c.partitions).label("partition"),
                func.unnest(offset_ranges.c.from_offsets).label("from_offset"),
                func.unnest(offset_ranges.c.until_offsets).label("until_offset"))
         .select_from(g.join(batches, and_(
             batches.c.pipeline == g.c.pipeline, batches.c.consumer_group == g.c.consumer_group,
             batches.c.batch_time >= since)).join(offset_ranges, and_(
                 offset_ranges.c.batch_pk == batches.c.id, offset_ranges.c.topic == g.c.topic)))).subquery("x")
    return (select(x.c.n, x.c.partition, func.min(x.c.from_offset).label("lo"), func.max(x.c.until_offset).label("hi"))
            .group_by(x.c.n, x.c.partition)).subquery("w")


@cache
def _positions_and_window_stmt(one_pipeline: bool, compact: bool = False) -> Select[Any]:
    since = bindparam("since")
    triples = select(positions.c.pipeline, positions.c.consumer_group, positions.c.topic).distinct()
    stmt = select(positions.c.pipeline, positions.c.consumer_group, positions.c.topic, positions.c.partition,
                  positions.c.next_offset)
    if one_pipeline:
        mine = (positions.c.pipeline == bindparam("pipeline"), positions.c.consumer_group == bindparam("consumer_group"))
        triples = triples.where(*mine)
        stmt = stmt.where(*mine)
    moved = case((and_(positions.c.updated_at >= since, positions.c.query_id.is_not(None)), 1), else_=0)
    stmt = stmt.add_columns(moved.label("moved"))
    order = (positions.c.pipeline, positions.c.consumer_group, positions.c.topic, positions.c.partition)
    if compact:
        # Each position finds its triple's number (the positions' primary key starts with the triple).
        t = triples.subquery("d")
        g = select(t.c.pipeline, t.c.consumer_group, t.c.topic, func.row_number().over().label("n")).cte("g")
        w = _window_compact(g, since)
        return (stmt.add_columns(w.c.lo, w.c.hi)
                .select_from(positions.join(g, and_(
                    g.c.pipeline == positions.c.pipeline, g.c.consumer_group == positions.c.consumer_group,
                    g.c.topic == positions.c.topic)).outerjoin(w, and_(
                        w.c.n == g.c.n, w.c.partition == positions.c.partition)))
                .order_by(*order))
    w = _window(triples.subquery("g"), since)
    return (stmt.add_columns(w.c.lo, w.c.hi)
            .select_from(positions.outerjoin(w, and_(
                w.c.pipeline == positions.c.pipeline, w.c.consumer_group == positions.c.consumer_group,
                w.c.topic == positions.c.topic, w.c.partition == positions.c.partition)))
            .order_by(*order))


_NO_FACTS = WindowFacts()


class LagInsight:
    """Adds time lag, drift and status to PartitionLag rows; thread-safe, keeps small caches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._timestamps: dict[tuple[str, int, int], int] = {}
        # Per partition: when each recent lag sample was taken, and the samples (kept apart so the
        # status rule gets a tuple of lags at C speed; this runs for every partition on every list).
        self._samples: dict[Key, tuple[collections.deque[float], collections.deque[int]]] = {}

    def enrich(
        self, kafka: KafkaAdapter | None, rows: Sequence[tuple[str, str, PartitionLag]],
        facts: Mapping[Key, WindowFacts], active: Mapping[tuple[str, str], bool], *, window: timedelta,
        now_ms: int | None = None, with_drift: bool = True,
    ) -> list[tuple[str, str, PartitionLag]]:
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        stamps = self._timestamps_for(kafka, [x for _, _, x in rows]) if kafka is not None else {}
        committed = self._committed(kafka, sorted({g for _, g, _ in rows})) if kafka and with_drift else {}
        now_mono = time.monotonic()
        horizon = now_mono - window.total_seconds()
        out = []
        with self._lock:
            for pipeline, group, x in rows:
                key = (pipeline, group, x.topic, x.partition)
                lag = x.lag
                seconds: float | None = None
                if lag == 0:
                    seconds = 0.0
                elif lag is not None and x.next_offset is not None:
                    ts = stamps.get((x.topic, x.partition, x.next_offset))
                    seconds = None if ts is None else max(0.0, (now_ms - ts) / 1000)
                f = facts.get(key, _NO_FACTS)
                held = self._samples.get(key)
                if held is None:
                    held = self._samples[key] = (collections.deque(maxlen=_SAMPLES_PER_PARTITION),
                                                 collections.deque(maxlen=_SAMPLES_PER_PARTITION))
                taken, lags = held
                while taken and taken[0] < horizon:
                    taken.popleft()
                    lags.popleft()
                # The rule over the fields (no PartitionWindow per row); the samples deque as it is
                # (read only, before this observation is appended).
                state = status_of(x.next_offset, x.log_end_offset, active.get((pipeline, group), False), f.moved,
                                  f.consumed, f.highest_end, lags)
                if lag is not None:
                    taken.append(now_mono)
                    lags.append(lag)
                got = committed.get(group, {}).get(TopicPartition(x.topic, x.partition)) if committed else None
                # The constructor, not dataclasses.replace (which inspects the fields on every call).
                out.append((pipeline, group, type(x)(x.topic, x.partition, x.next_offset, x.log_start_offset,
                                                     x.log_end_offset, seconds, got, state)))
        return out

    def timestamps(self, kafka: KafkaAdapter, rows: Sequence[PartitionLag]) -> dict[tuple[str, int, int], int]:
        """(topic, partition, next offset) -> timestamp of the record there, for rows with lag; from the
        cache, else one ``record_timestamps`` read (the retention headroom reuses time lag's reads)."""
        return self._timestamps_for(kafka, rows)

    def _timestamps_for(self, kafka: KafkaAdapter, rows: Sequence[PartitionLag]) -> dict[tuple[str, int, int], int]:
        wanted = {(x.topic, x.partition, x.next_offset) for x in rows
                  if x.lag and x.next_offset is not None}
        with self._lock:
            missing = [(TopicPartition(t, p), o) for t, p, o in wanted if (t, p, o) not in self._timestamps]
        if missing:
            try:
                found = kafka.record_timestamps(missing)
            except KafkaError as exc:
                log.warning("time lag unavailable: %s", exc.message)
                found = {}
            except Exception as exc:  # noqa: BLE001 - time lag is extra; its absence must not fail a scrape
                log.warning("time lag unavailable: %r", exc)
                found = {}
            with self._lock:
                if len(self._timestamps) + len(found) > _TS_CACHE_MAX:
                    self._timestamps.clear()
                for (tp, offset), ts in found.items():
                    self._timestamps[(tp.topic, tp.partition, offset)] = ts
        with self._lock:
            return {k: self._timestamps[k] for k in wanted if k in self._timestamps}

    @staticmethod
    def _committed(kafka: KafkaAdapter, groups: list[str]) -> dict[str, dict[TopicPartition, int]]:
        if not groups:
            return {}
        try:
            found = kafka.committed_offsets(groups)
        except KafkaError as exc:
            log.warning("consumer-group offsets unavailable: %s", exc.message)
            return {}
        except Exception as exc:  # noqa: BLE001 - a group-level error (authorization, ...) means "unknown"
            log.warning("consumer-group offsets unavailable: %r", exc)
            return {}
        return {g: {tp: o for tp, (o, _meta) in offs.items()} for g, offs in found.items()}

