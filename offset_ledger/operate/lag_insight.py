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
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

from offset_ledger.config import settings
from offset_ledger.errors import KafkaError
from offset_ledger.ledger.lag_window import window_rows
from offset_ledger.rules.durations import parse_duration
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
    return parse_duration(settings().status_window, "OFFSET_LEDGER_STATUS_WINDOW")


def positions_and_window(
    conn: Connection, since: datetime, pipeline: str | None = None, consumer_group: str | None = None,
) -> tuple[dict[tuple[str, str], list[Position]], dict[Key, WindowFacts]]:
    """Positions (of every pipeline, or of one pipeline and group), sorted, and per position what the
    window's batches tell: records read, an end past the position (a rewind), whether one moved it.

    One statement (``ledger.lag_window.window_rows``): the position is read with the batches, and a
    list costs one round trip.
    """
    positions_by: dict[tuple[str, str], list[Position]] = {}
    out: dict[Key, WindowFacts] = {}
    mine: list[Position] = []
    key: tuple[str, str] | None = None
    # One fetchall and tuple unpacking (rows come sorted by pipeline and group): a third of the
    # time of attribute access and a dict look-up per row at 10,000 positions.
    for pipe, group, topic, partition, next_offset, moved, lo, hi in window_rows(conn, since, pipeline,
                                                                                 consumer_group):
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

