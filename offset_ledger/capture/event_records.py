"""What a listener event becomes in the ledger: the pipeline it belongs to, and its records."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from offset_ledger.capture.checkpoint_files import checkpoint_files
from offset_ledger.capture.spool import Event
from offset_ledger.errors import CheckpointFormatError, ConfigError
from offset_ledger.ledger.records import BatchRecord, Record, RunEnd, RunHeartbeat, RunStart
from offset_ledger.rules.checkpoint import parse_initial_offsets, parse_offsets_file
from offset_ledger.rules.model import BatchOffsets
from offset_ledger.rules.progress import (
    ProgressParseError,
    is_no_data,
    parse_idle,
    parse_progress,
    parse_started,
    parse_terminated,
)

log = logging.getLogger(__name__)


def with_true_starts(batch: BatchOffsets, location: str) -> BatchOffsets:
    """Ranges Spark reported without a start (a new query's first batch) get the start Spark wrote in
    the checkpoint at ``location`` (``batch_starts``); where it cannot be read the start stays unknown
    (None), never assumed to continue the history."""
    if all(r.from_offset is not None for s in batch.sources for r in s.ranges):
        return batch
    starts = batch_starts(location, batch.batch_id)
    if not starts:
        return batch
    sources = tuple(replace(s, ranges=tuple(
        replace(r, from_offset=starts.get(s.source_index, {}).get(r.topic, {}).get(r.partition))
        if r.from_offset is None else r for r in s.ranges)) for s in batch.sources)
    return replace(batch, sources=sources)


def batch_starts(location: str, batch_id: int) -> dict[int, Mapping[str, Mapping[int, int]]]:
    """Where each Kafka source of batch ``batch_id`` began, as the checkpoint says: source index ->
    topic -> partition -> offset. Batch 0 began at the initial offsets Spark resolved and wrote in
    ``sources/<n>/0``; batch N at ``offsets/N-1``. Empty when the checkpoint cannot say."""
    try:
        files = checkpoint_files(location)
        if batch_id == 0:
            out: dict[int, Mapping[str, Mapping[int, int]]] = {}
            for name in files.list("sources"):
                if not name.isdigit():
                    continue
                raw = files.read(f"sources/{name}/0")
                if raw is not None:
                    initial = parse_initial_offsets(raw, int(name), f"{location}/sources/{name}/0")
                    if initial.kind == "kafka" and initial.kafka:
                        out[int(name)] = initial.kafka
            return out
        raw = files.read(f"offsets/{batch_id - 1}")
        if raw is None:
            return {}
        _, _, sources = parse_offsets_file(raw, f"{location}/offsets/{batch_id - 1}")
        return {s.index: s.kafka for s in sources if s.kind == "kafka" and s.kafka}
    except (CheckpointFormatError, ConfigError, OSError, ValueError) as exc:
        log.info("offset-ledger: the start of batch %d is unknown: %s", batch_id, exc)
        return {}

STARTED, PROGRESS, IDLE, TERMINATED = "started", "progress", "idle", "terminated"

#: At most one heartbeat write per run this often: with a short
#: ``spark.sql.streaming.noDataProgressEventInterval`` idle events may come many times a second, and
#: the silence bound (``rules.liveness``, at least 60 s) needs far less. A heartbeat that widens the
#: run's longest gap is always written.
HEARTBEAT_EVERY_SECONDS = 5.0


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


class EventConverter:
    """Turns events into ledger records; remembers each query's pipeline (idle/terminated carry no name)."""

    def __init__(self, on_query_seen: Callable[[str], str | None] | None,
                 pipeline_of: Callable[[str], str | None] | None,
                 count_failure: Callable[[str], None], *, beat_every_ms: int | None = None,
                 live_since: float | None = None) -> None:
        self._beat_every_ms = beat_every_ms
        # Events received before this process's writer existed (an orphaned spool of a driver that died,
        # replayed here) never make a run live: this process beats only for what it runs itself.
        self._live_since = live_since if live_since is not None else 0.0
        #: Runs seen started (or reporting) and not ended, run id -> query id: what the driver's heartbeat
        #: thread beats for (``capture.heartbeat``). Changed on the writer thread; read there as a copy.
        self.live_runs: dict[str, str] = {}
        self._ended_runs: set[str] = set()
        self._on_query_seen = on_query_seen
        self._pipeline_of = pipeline_of
        self._count_failure = count_failure
        self._query_pipeline: dict[str, tuple[str, str, str | None]] = {}
        self._warned_unnamed: set[str] = set()
        self._beats: dict[str, _Beat] = {}  # per run: what the heartbeat throttle and the gap need
        self._checkpoints: dict[str, str] = {}  # query id -> its checkpoint, where the session said

    def convert(self, event: Event) -> tuple[list[Record], tuple[str, str, int | None] | None]:
        """One event -> ledger records (none for unnamed queries) and what it settles."""
        if event.kind == STARTED:
            started = parse_started(event.payload)
            checkpoint = self._first_sight(started.query_id, started=True)
            target = self._pipeline_for(event, started.query_id, started.query_name)
            mark: tuple[str, str, int | None] = (STARTED, started.query_id, None)
            if target is None:
                return [], mark
            pipeline, group, app_version = target
            self._live(started.run_id, started.query_id, event)
            return [RunStart(pipeline, group, started.query_id, started.run_id, started.query_name,
                             started.started_at, app_version=app_version, checkpoint_location=checkpoint,
                             beat_every_ms=self._beat_every_ms)], mark
        if event.kind == PROGRESS:
            batch = parse_progress(event.payload)
            self._first_sight(batch.query_id)
            batch = self._with_true_starts(batch)
            target = self._pipeline_for(event, batch.query_id, batch.query_name)
            mark = (PROGRESS, batch.query_id, batch.batch_id)
            if target is None:
                return [], mark
            pipeline, group, _ = target
            self._live(batch.run_id, batch.query_id, event)
            if is_no_data(batch):
                return self._heartbeat(pipeline, group, batch.query_id, batch.run_id, batch.batch_time), mark
            grew = self._beat(batch.run_id, batch.batch_time, written=True)
            beat = [] if grew is None else [
                RunHeartbeat(pipeline, group, batch.query_id, batch.run_id, batch.batch_time, grew)]
            return [BatchRecord(pipeline, group, batch), *beat], mark
        if event.kind == IDLE:
            idle = parse_idle(event.payload)
            self._first_sight(idle.query_id)
            target = self._pipeline_for(event, idle.query_id, None)
            mark = (IDLE, idle.query_id, None)
            if target is None:
                return [], mark
            self._live(idle.run_id, idle.query_id, event)
            return self._heartbeat(target[0], target[1], idle.query_id, idle.run_id, idle.at), mark
        if event.kind == TERMINATED:
            ended = parse_terminated(event.payload)
            target = self._pipeline_for(event, ended.query_id, None)
            self._beats.pop(ended.run_id, None)
            self.live_runs.pop(ended.run_id, None)
            self._ended_runs.add(ended.run_id)
            mark = (TERMINATED, ended.query_id, None)
            if target is None:
                return [], mark
            return [RunEnd(target[0], target[1], ended.query_id, ended.run_id, _utc(event.received_at),
                           ended.exception)], mark
        raise ProgressParseError(f"unknown event kind {event.kind!r}")

    def _live(self, run_id: str, query_id: str, event: Event) -> None:
        """A run of a recorded pipeline is running (a late event of an ended run does not revive it)."""
        if self._beat_every_ms is not None and run_id not in self._ended_runs \
                and event.received_at >= self._live_since:
            self.live_runs[run_id] = query_id

    def _heartbeat(self, pipeline: str, group: str, query_id: str, run_id: str, at: datetime) -> list[Record]:
        """An idle event or an empty progress report: a heartbeat record, unless one was written just now."""
        beat = self._beats.get(run_id)
        due = beat is None or (at - beat.written_at).total_seconds() >= HEARTBEAT_EVERY_SECONDS
        grew = self._beat(run_id, at, written=False)
        if grew is None and not due:
            return []
        self._beats[run_id].written_at = at
        return [RunHeartbeat(pipeline, group, query_id, run_id, at, grew)]

    def _beat(self, run_id: str, at: datetime, *, written: bool) -> int | None:
        """Note an event of ``run_id`` at ``at`` (Spark's time); the run's longest gap when it grew."""
        beat = self._beats.get(run_id)
        if beat is None:
            self._beats[run_id] = _Beat(at, at if written else _NEVER, 0)
            return None
        gap_ms = int((at - beat.last_event_at).total_seconds() * 1000)
        beat.last_event_at = max(beat.last_event_at, at)
        if written:
            beat.written_at = at
        if gap_ms > beat.max_gap_ms:
            beat.max_gap_ms = gap_ms
            return gap_ms
        return None

    def _first_sight(self, query_id: str, *, started: bool = False) -> str | None:
        """Tell the listener about a query (each run's start, else its first event): the checkpoint."""
        if self._on_query_seen is None:
            return None
        if not started and (query_id in self._query_pipeline or query_id in self._warned_unnamed):
            return None
        try:
            checkpoint = self._on_query_seen(query_id)
        except Exception:  # noqa: BLE001 - only an optimisation for flush() and a detail of the run
            log.debug("on_query_seen failed", exc_info=True)
            return None
        if checkpoint:
            self._checkpoints[query_id] = checkpoint
        return checkpoint

    def _with_true_starts(self, batch: BatchOffsets) -> BatchOffsets:
        location = self._checkpoints.get(batch.query_id)
        return batch if location is None else with_true_starts(batch, location)

    def _pipeline_for(self, event: Event, query_id: str, name: str | None) -> tuple[str, str, str | None] | None:
        """(pipeline, consumer group, app version) of a query; idle/terminated events carry no name."""
        if event.pipeline or name:
            pipeline = event.pipeline or self._mapped(name) or name
            assert pipeline is not None
            target = (pipeline, event.consumer_group or pipeline, event.app_version)
        elif query_id in self._query_pipeline:
            target = self._query_pipeline[query_id]
        else:
            if query_id not in self._warned_unnamed:
                self._warned_unnamed.add(query_id)
                log.warning("offset-ledger: query %s has no name and the listener no pipeline; "
                            "its offsets are not recorded (set queryName or pipeline=)", query_id)
            return None
        self._query_pipeline[query_id] = target
        return target

    def _mapped(self, name: str | None) -> str | None:
        """The pipeline ``pipeline=`` maps a query name to (None: use the name itself)."""
        if self._pipeline_of is None or name is None:
            return None
        try:
            mapped = self._pipeline_of(name)
        except Exception as exc:  # noqa: BLE001 - a user's mapping must not stop recording
            self._count_failure(f"pipeline mapping failed for query {name!r}: {exc!r}; using the query name")
            return None
        return str(mapped) if mapped else None


_NEVER = datetime.min.replace(tzinfo=timezone.utc)


@dataclass
class _Beat:
    """One run's last event, last heartbeat written and longest gap seen (Spark's clock)."""

    last_event_at: datetime
    written_at: datetime
    max_gap_ms: int
