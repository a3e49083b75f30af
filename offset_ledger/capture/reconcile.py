"""Ground truth: bring the ledger up to what a checkpoint says Spark committed.

The listener is the fast path, not the truth: Spark's listener bus drops events when its queue is
full, a killed driver loses what it had queued, and a job may run without the listener at all. A
checkpoint's ``offsets/<n>`` + ``commits/<n>`` say what Spark really committed. ``reconcile``
reads them (``offset_ledger.rules.checkpoint`` parses; local paths directly, remote URIs through
fsspec), and records every committed batch the ledger lacks through the ordinary ``Recorder`` (same
authority rules, same tables), marked ``batches.source = 'checkpoint'``. A restart reconciles the
current generation before planning (so a fresh generation is never planned behind the old
checkpoint), and ``offset-ledger watch`` runs the same pass in a loop for jobs that cannot carry a
Python listener. A batch the listener also delivers is recorded once: batches are keyed by (query
id, batch id).

Backfilled batches have what the checkpoint has: offsets and the batch time. Spark writes no row
counts or event-time figures there, so ``input_rows`` is the number of offsets read and the
watermark columns stay empty.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.capture.checkpoint_files import checkpoint_files
from offset_ledger.errors import CheckpointFormatError, ConfigError, LedgerError
from offset_ledger.ledger import audit_store, reconcile_store
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunEnd, RunStart
from offset_ledger.rules.checkpoint import CheckpointFiles, CommittedBatch, committed_batch_ids, read_committed_batches
from offset_ledger.rules.incarnation import Incarnation, checkpoint_incarnation, incarnation_finding
from offset_ledger.rules.model import BatchOffsets, Finding, PartitionRange, SourceProgress
from offset_ledger.rules.progress import is_no_data

log = logging.getLogger(__name__)

#: ``batches.source`` of a batch read back from a checkpoint's commit log.
CHECKPOINT_SOURCE = "checkpoint"


@dataclass(frozen=True)
class CurrentGeneration:
    """What a restart's pass knows of the checkpoint generation it reconciles (the pipeline's current one)."""

    number: int
    #: the query the ledger knows on it: a checkpoint of another query is reported, never recorded
    query_id: str | None
    #: a query ran on it (a run or a sink's commit names it): gone or empty now means lost, not unstarted
    ran: bool = False
    #: the positions it started from, asked only when batches are missing: batches ending at or before
    #: them are the checkpoint's history before the ledger adopted it, not batches the listener missed
    baseline: Callable[[], Mapping[tuple[str, int], int]] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class PassMode:
    """How a pass books what it did: a restart's (the default) or a watcher's (``WATCH_PASS``)."""

    #: close the synthetic run: a restart's pass runs while the job is stopped; a watcher's keeps it
    #: open while the job runs
    end_run: bool = True
    #: findings into the ledger; a watcher, which passes every few seconds, logs what it recorded instead
    store_findings: bool = True


RESTART_PASS = PassMode()
WATCH_PASS = PassMode(end_run=False, store_findings=False)


@dataclass(frozen=True)
class _Book:
    """Where one pass's findings go: the pipeline's group in the ledger (when ``store``), stamped ``at``."""

    engine: Engine
    pipeline: str
    consumer_group: str
    store: bool
    at: datetime


@dataclass(frozen=True)
class Reconciliation:
    """What one pass over a checkpoint found and recorded."""

    location: str
    query_id: str | None
    readable: bool
    checkpoint_batch_id: int | None = None  # the last batch the checkpoint committed
    ledger_batch_id: int | None = None      # the last batch the ledger had of that query before
    backfilled: tuple[int, ...] = ()
    findings: tuple[Finding, ...] = field(default=())
    #: a restart's pass (``generation`` given): whether the checkpoint is still the generation's
    #: incarnation (``offset_ledger.rules.incarnation``); anything but "same" needs a fresh generation
    incarnation: Incarnation = "same"

    @property
    def behind(self) -> bool:
        """The ledger lacked committed batches (now backfilled)."""
        return bool(self.backfilled)


def checkpoint_run_id(query_id: str) -> str:
    """The run id under which batches read back from a query's checkpoint are recorded."""
    return f"checkpoint:{query_id}"


def _ranges(starts: Sequence[Any] | None, ends: Sequence[Any]) -> list[SourceProgress]:
    """Per Kafka source: ``[start, end)`` per partition (start None where the checkpoint lacks it)."""
    by_index = {s.index: s for s in starts or () if s.kind == "kafka"}
    out = []
    for end in ends:
        if end.kind != "kafka":
            continue
        begin = by_index.get(end.index)
        ranges = tuple(
            PartitionRange(topic, partition, (begin.kafka or {}).get(topic, {}).get(partition) if begin else None,
                           until_offset)
            for topic, parts in sorted(end.kafka.items()) for partition, until_offset in sorted(parts.items()))
        rows = sum(r.until_offset - r.from_offset for r in ranges if r.from_offset is not None)
        out.append(SourceProgress(end.index, f"checkpoint source {end.index}", ranges, max(rows, 0)))
    return out


def batch_records(pipeline: str, consumer_group: str, query_id: str, committed: Sequence[CommittedBatch],
                  *, fallback_time: datetime) -> list[BatchRecord]:
    """The ledger records of batches read back from a checkpoint (pure)."""
    out = []
    for b in committed:
        sources = tuple(_ranges(b.starts, b.ends))
        if not sources:
            continue
        at = (datetime.fromtimestamp(b.timestamp_ms / 1000, tz=timezone.utc)
              if b.timestamp_ms is not None else fallback_time)
        out.append(BatchRecord(pipeline, consumer_group, BatchOffsets(
            query_id, checkpoint_run_id(query_id), None, b.batch_id, at, sum(s.input_rows for s in sources),
            sources, recorded_by=CHECKPOINT_SOURCE)))
    return out


def reconcile(
    engine: Engine, location: str, *, pipeline: str, consumer_group: str, current: CurrentGeneration | None = None,
    files: CheckpointFiles | None = None, storage_options: Any = None, mode: PassMode = RESTART_PASS,
    recorder: Recorder | None = None, now: datetime | None = None,
) -> Reconciliation:
    """Record every batch ``location`` committed that the ledger lacks; the findings say what was done.

    An unreadable checkpoint is a ``checkpoint_unreadable`` finding, never an exception: the caller
    plans from the ledger and says so. ``mode``: a restart's pass (the default: the job is stopped,
    the synthetic run is closed and the findings stored) or a watcher's (``WATCH_PASS``).

    ``current`` (a restart's pass over the pipeline's current generation): a checkpoint that is
    gone, empty or holds another query than ``current.query_id`` (when it ran, or the ledger has
    runs of that query) is another incarnation: the result says which (``incarnation``) with a
    stored ``checkpoint_lost`` / ``checkpoint_recreated`` finding, and the restart opens a fresh
    generation instead of reusing this one's batch ids.
    """
    at = now or datetime.now(timezone.utc)
    book = _Book(engine, pipeline, consumer_group, mode.store_findings, at)
    expected_query_id = current.query_id if current is not None else None
    generation = current.number if current is not None else None
    ran = current.ran if current is not None else False
    baseline = current.baseline if current is not None else None
    try:
        with engine.connect() as conn:
            recorded_on_location = reconcile_store.query_ran(
                conn, pipeline, consumer_group, expected_query_id) if expected_query_id else False
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading runs") from exc
    try:
        reader = files if files is not None else checkpoint_files(location, storage_options)
        query_id, _ = read_committed_batches(location, reader, only=())
        available = committed_batch_ids(reader)
    except (CheckpointFormatError, ConfigError, OSError) as exc:
        message = getattr(exc, "message", None) or str(exc)
        missing = isinstance(exc, CheckpointFormatError) and "no such directory" in message
        if missing and generation is not None:
            return _incarnation(book, location, generation, expected_query_id, None,
                                exists=False, ran=ran or recorded_on_location)
        if missing and not recorded_on_location:
            return Reconciliation(location, None, True)  # handed out, never started
        return _unreadable(book, location, message)
    if generation is not None and (query_id is None or (expected_query_id is not None
                                                         and query_id != expected_query_id)):
        return _incarnation(book, location, generation, expected_query_id, query_id,
                            exists=True, ran=ran or recorded_on_location)
    if query_id is None:
        return Reconciliation(location, None, True)
    if expected_query_id is not None and query_id != expected_query_id:
        finding = Finding(
            "checkpoint_foreign",
            f"checkpoint {location} now belongs to query {query_id}, not to query {expected_query_id} that ran "
            f"on it; its batches are not recorded (was the directory replaced or copied over?)",
            details={"checkpoint_location": location, "query_id": query_id, "expected_query_id": expected_query_id})
        if book.store:
            _store(book, [finding])
        return Reconciliation(location, query_id, True, findings=(finding,))
    try:
        with engine.connect() as conn:
            # Only the ids the checkpoint still holds matter (a long-running query has many more);
            # batches prune deleted (their islands name them) are pruned, not missed.
            held = reconcile_store.recorded_batches(conn, query_id, available[0] if available else 0,
                                                    checkpoint_run_id(query_id))
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading batch history") from exc
    first_recorded, last_recorded, recorded, pruned = (held.first_batch_id, held.last_batch_id, held.recorded,
                                                       held.pruned)
    last_committed = available[-1] if available else None
    # Below the oldest batch the ledger still has, a missing one was pruned (prune keeps each
    # partition's newest batch), not missed: only holes above it and the tail are backfilled.
    # A batch an island names was pruned too (prune may keep an older one: a finding names it).
    lacking = [b for b in available if b not in recorded and (first_recorded is None or b > first_recorded)
               and not any(lo <= b <= hi for lo, hi in pruned)]
    if not lacking:
        return Reconciliation(location, query_id, True, last_committed, last_recorded)
    try:
        _, missing = read_committed_batches(location, reader, only=set(lacking))
    except (CheckpointFormatError, ConfigError, OSError) as exc:
        return _unreadable(book, location, getattr(exc, "message", None) or str(exc))
    start = baseline() if baseline is not None and missing else None
    if start:
        missing = [b for b in missing if not _before(b, start)]
        if not missing:
            return Reconciliation(location, query_id, True, last_committed, last_recorded)
    records = batch_records(pipeline, consumer_group, query_id, missing, fallback_time=at)
    head: list[Any] = []
    if not held.run_known:
        head.append(RunStart(pipeline, consumer_group, query_id, checkpoint_run_id(query_id), None,
                             records[0].batch.batch_time if records else at, checkpoint_location=location))
    tail: list[Any] = []
    if mode.end_run:
        tail.append(RunEnd(pipeline, consumer_group, query_id, checkpoint_run_id(query_id), at))
    own = recorder is None
    writer = recorder or Recorder(engine)
    try:
        writer.record([*head, *records, *tail], now=at)
    finally:
        if own:
            writer.close()
    ids = tuple(r.batch.batch_id for r in records)
    # A batch that moved nothing is one the listener hears as a heartbeat and does not record (a
    # real-time query commits one every trigger interval while its topics are quiet): recorded from
    # the checkpoint, but the ledger did not miss it, so it is no finding.
    moved = tuple(r.batch.batch_id for r in records if not is_no_data(r.batch))
    earliest = available[0]
    purged = (last_recorded is not None and earliest > last_recorded + 1)
    if not moved and not purged:
        return Reconciliation(location, query_id, True, last_committed, last_recorded, ids)
    text = (f"the ledger lacked {len(moved or ids)} batch(es) that checkpoint {location} committed "
            f"({_span(moved or ids)}; last recorded {'none' if last_recorded is None else last_recorded}, last committed "
            f"{last_committed}): recorded from the checkpoint's commit log")
    if purged:
        text += (f"; batches {last_recorded + 1}-{earliest - 1} are no longer in the checkpoint (Spark keeps the "
                 f"last ~100) and stay missing from history")
    finding = Finding("backfilled", text, details={
        "checkpoint_location": location, "query_id": query_id, "batch_ids": list(moved or ids),
        "last_recorded_batch_id": last_recorded, "last_committed_batch_id": last_committed,
        "purged_from_checkpoint": [last_recorded + 1, earliest - 1] if purged else None})
    if book.store:
        _store(book, [finding])
        log.warning("offset-ledger: %s", text)
    else:
        log.info("offset-ledger watch: recorded %s of %s from %s", _span(ids), pipeline, location)
    return Reconciliation(location, query_id, True, last_committed, last_recorded, ids, (finding,))


def _incarnation(book: _Book, location: str, generation: int, expected_query_id: str | None,
                 found_query_id: str | None, *, exists: bool, ran: bool) -> Reconciliation:
    """The checkpoint is gone, empty or another query's: which incarnation, and the finding saying so."""
    which = checkpoint_incarnation(ran=ran, exists=exists, claimed_query_id=expected_query_id,
                                   found_query_id=found_query_id)
    finding = incarnation_finding(which, generation=generation, location=location,
                                  claimed_query_id=expected_query_id, found_query_id=found_query_id)
    if finding is None:
        return Reconciliation(location, found_query_id, True)
    if book.store:
        _store(book, [finding])
    log.warning("offset-ledger: %s", finding.message)
    return Reconciliation(location, found_query_id, True, findings=(finding,), incarnation=which)


def _before(batch: CommittedBatch, start: Mapping[tuple[str, int], int]) -> bool:
    """Whether every partition the batch read ended at or before where the generation started."""
    ends = [((topic, partition), until) for s in batch.ends if s.kind == "kafka" and s.kafka
            for topic, parts in s.kafka.items() for partition, until in parts.items()]
    return bool(ends) and all(key in start and until <= start[key] for key, until in ends)


def _span(ids: Sequence[int]) -> str:
    if len(ids) == 1:
        return f"batch {ids[0]}"
    contiguous = list(ids) == list(range(ids[0], ids[-1] + 1))
    return f"batches {ids[0]}-{ids[-1]}" if contiguous else "batches " + ", ".join(map(str, ids))


def _unreadable(book: _Book, location: str, why: str) -> Reconciliation:
    finding = Finding(
        "checkpoint_unreadable",
        f"checkpoint {location} could not be read ({why}); the plan trusts the ledger, which may lack batches "
        f"the listener never delivered",
        details={"checkpoint_location": location, "error": why})
    if book.store:
        _store(book, [finding])
    log.warning("offset-ledger: %s", finding.message)
    return Reconciliation(location, None, False, findings=(finding,))


def _store(book: _Book, found: Sequence[Finding]) -> None:
    try:
        with book.engine.begin() as conn:
            audit_store.add_findings(conn, book.pipeline, book.consumer_group, found, book.at)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "recording findings") from exc


def watch(
    engine: Engine, location: str, *, pipeline: str, consumer_group: str, interval_s: float = 5.0,
    stop: threading.Event | None = None, once: bool = False, storage_options: Any = None,
    on_pass: Callable[[Reconciliation], None] | None = None,
) -> Reconciliation:
    """Record a pipeline's batches from its checkpoint's commit log, every ``interval_s`` until ``stop``.

    Transient ledger errors are logged and retried on the next pass; the last pass is returned.
    """
    stop = stop or threading.Event()
    recorder = Recorder(engine)
    last = Reconciliation(location, None, False)
    try:
        while True:
            try:
                last = reconcile(engine, location, pipeline=pipeline, consumer_group=consumer_group,
                                 storage_options=storage_options, mode=WATCH_PASS, recorder=recorder)
                if on_pass is not None:
                    on_pass(last)
            except LedgerError as exc:
                if once or not exc.retriable:
                    raise
                log.warning("offset-ledger watch: %s; retrying in %.0f s", exc.message, interval_s)
            if once or stop.wait(interval_s):
                return last
    finally:
        recorder.close()
