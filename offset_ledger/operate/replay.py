"""Replay ranges: the exact Kafka records recorded batches read, as options for ``spark.read.format("kafka")``.

``compute_range`` is pure (the batches' partition ranges and optional watermarks in, a
``ReplayRange`` out); ``replay`` picks the batches in the ledger and asks Kafka for
retention; ``replay_range`` is the public entry point. The CLI and the API call ``replay(ops, ...)``.

Spark's batch reader wants every partition it reads named in ``startingOffsets`` and
``endingOffsets`` (with ``subscribe``: every partition of the topic). Reading with ``assign`` set
to exactly the partitions the batches touched lets both name only those, so nothing else is read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.errors import InvalidInput, KafkaError, ReplayNotExact, UnknownBatch
from offset_ledger.ledger import batch_ranges as q
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.sink_outputs import outputs_by_batch
from offset_ledger.operate.inputs import check_name, parse_timestamp
from offset_ledger.operate.operations import Operations, resolve_group
from offset_ledger.rules.model import TopicPartition, Watermarks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordedRange:
    """One batch's range on one partition as the ledger recorded it: ``[from_offset, until_offset)``."""

    query_id: str
    batch_id: int
    topic: str
    partition: int
    from_offset: int | None  # None: recorded before start offsets were filled
    until_offset: int
    source_index: int = 0


@dataclass(frozen=True)
class ReplayRange:
    """What to read again: per partition, from the first batch's ``from`` to the last batch's ``until``."""

    starting_offsets: Mapping[str, Mapping[str, int]]  # topic -> partition -> from_offset (inclusive)
    ending_offsets: Mapping[str, Mapping[str, int]]  # topic -> partition -> until_offset (exclusive)
    batches: tuple[tuple[str, int], ...]  # (query id, batch id), in order
    warnings: tuple[str, ...] = ()
    lost: tuple[Mapping[str, Any], ...] = ()  # partitions whose records retention already deleted
    retention_checked: bool = False
    records: int = 0
    #: What the batches wrote through a transactional sink (``offset_ledger.sinks``): sink, target,
    #: sequence, rows, table version; empty for batches written any other way.
    outputs: tuple[Mapping[str, Any], ...] = ()

    @property
    def assign(self) -> dict[str, list[int]]:
        """The ``assign`` option: exactly the partitions to read."""
        return {t: sorted(int(p) for p in parts) for t, parts in self.starting_offsets.items()}

    @property
    def starting_offsets_json(self) -> str:
        return json.dumps(self.starting_offsets, separators=(",", ":"))

    @property
    def ending_offsets_json(self) -> str:
        return json.dumps(self.ending_offsets, separators=(",", ":"))

    @property
    def assign_json(self) -> str:
        return json.dumps(self.assign, separators=(",", ":"))

    def options(self) -> dict[str, str]:
        """The reader options: ``spark.read.format("kafka").options(**r.options())``."""
        return {"assign": self.assign_json, "startingOffsets": self.starting_offsets_json,
                "endingOffsets": self.ending_offsets_json}


# (query id, batch id, source index, topic, partition) of one recorded range.
RangeKey = tuple[str, int, int, str, int]


def recover_starts(
    ranges: Sequence[RecordedRange], previous_until: Mapping[RangeKey, int],
    first_batch_starts: Mapping[tuple[str, str, int], int],
) -> list[RecordedRange]:
    """``ranges`` with every start the ledger knows filled in; a start it does not know stays None.

    Spark reports no start for a fresh checkpoint's first batch, nor for a partition it discovers
    while running. Batch N of a query starts where its batch N-1 ended (Spark plans N from N-1's
    end offsets), so that end is N's start, when batch N-1 is recorded: an older batch is not, as
    the lost N-1 read from it too. Batch 0 starts at the offsets its generation resolved
    (``first_batch_starts``, keyed by query, topic, partition), which the plan handed Spark.
    """
    own = {(r.query_id, r.batch_id, r.source_index, r.topic, r.partition): r.until_offset for r in ranges}
    out = []
    for r in ranges:
        if r.from_offset is None:
            key = (r.query_id, r.batch_id - 1, r.source_index, r.topic, r.partition)
            start = own.get(key, previous_until.get(key))
            if start is None and r.batch_id == 0:
                start = first_batch_starts.get((r.query_id, r.topic, r.partition))
            if start is not None:
                r = replace(r, from_offset=start)
        out.append(r)
    return out


def compute_range(
    ranges: Sequence[RecordedRange], watermarks: Mapping[TopicPartition, Watermarks] | None = None,
    *, pipeline: str | None = None,
) -> ReplayRange:
    """The replay covering exactly ``ranges``; gaps, overlaps and retention become warnings.

    A range without a start (see ``recover_starts``) makes the whole answer ``ReplayNotExact``:
    dropping its partition, or starting it anywhere else, would silently read other records.
    """
    unknown = [r for r in ranges if r.from_offset is None]
    if unknown:
        where = "; ".join(f"{r.topic}-{r.partition} in batch {r.batch_id} of query {r.query_id} "
                          f"(until offset {r.until_offset})" for r in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ReplayNotExact(
            f"{'pipeline ' + repr(pipeline) + ': ' if pipeline else ''}cannot replay exactly: no start offset is "
            f"recorded or recoverable for {where}{more} (a partition Spark discovered while running, or a first "
            "batch on a checkpoint the restart helper did not hand out); choose batches after it",
            unknown_starts=[{"queryId": r.query_id, "batchId": r.batch_id, "topic": r.topic,
                             "partition": r.partition, "untilOffset": r.until_offset} for r in unknown],
            pipeline=pipeline)
    warnings: list[str] = []
    by_tp: dict[TopicPartition, list[RecordedRange]] = {}
    for r in ranges:
        by_tp.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    lost: list[dict[str, Any]] = []
    records = 0
    for tp in sorted(by_tp, key=lambda t: (t.topic, t.partition)):
        parts = sorted(by_tp[tp], key=lambda r: (r.from_offset or 0, r.until_offset))
        start = min(r.from_offset or 0 for r in parts)
        end = max(r.until_offset for r in parts)
        reach = start
        for r in parts:
            assert r.from_offset is not None
            if r.from_offset > reach:
                warnings.append(f"{tp.topic}-{tp.partition}: offsets {reach}..{r.from_offset - 1} were read by "
                                "none of these batches (a gap), but lie inside the replayed range")
            elif r.from_offset < reach and r.until_offset > r.from_offset:
                warnings.append(f"{tp.topic}-{tp.partition}: batch {r.batch_id} of query {r.query_id} re-read "
                                f"offsets {r.from_offset}..{min(reach, r.until_offset) - 1}; the replay reads them once")
            reach = max(reach, r.until_offset)
        if end <= start:
            continue  # the batches read nothing here: leave the partition out
        starting.setdefault(tp.topic, {})[str(tp.partition)] = start
        ending.setdefault(tp.topic, {})[str(tp.partition)] = end
        records += end - start
        marks = (watermarks or {}).get(tp) if watermarks is not None else None
        if watermarks is not None and marks is None:
            warnings.append(f"{tp.topic}-{tp.partition}: the partition no longer exists on the cluster")
        elif marks is not None:
            if marks.log_start_offset > start:
                gone = min(marks.log_start_offset, end) - start
                lost.append({"topic": tp.topic, "partition": tp.partition, "fromOffset": start,
                             "logStartOffset": marks.log_start_offset, "recordsLost": gone})
                warnings.append(f"{tp.topic}-{tp.partition}: {gone} record(s) from offset {start} were deleted by "
                                f"retention (log-start {marks.log_start_offset}); Spark fails on them unless "
                                "failOnDataLoss=false, and then skips them")
            if marks.log_end_offset < end:
                warnings.append(f"{tp.topic}-{tp.partition}: the log ends at {marks.log_end_offset}, before "
                                f"{end} (topic re-created or truncated?)")
    if not starting:
        warnings.append("these batches read no records")
    batch_keys = tuple(dict.fromkeys((r.query_id, r.batch_id) for r in ranges))
    return ReplayRange(starting, ending, batch_keys, tuple(warnings), tuple(lost), watermarks is not None, records)


def _check_request(batch: int | None, since: datetime | None, until: datetime | None,
                   query_id: str | None, generation: int | None) -> None:
    if batch is None and since is None and until is None:
        raise InvalidInput("name a batch (--batch N) or a time range (--from T --to T)")
    if batch is not None and (since is not None or until is not None):
        raise InvalidInput("give either a batch or a time range, not both")
    if batch is not None and (isinstance(batch, bool) or batch < 0):
        raise InvalidInput(f"invalid batch id {batch!r}: Spark's batch ids are integers >= 0", batch=batch)
    if query_id is not None and generation is not None:
        raise InvalidInput("give either a query id or a generation, not both")
    if query_id is not None:
        check_name("query id", query_id)
    # Bounds of the ledger's columns: anything outside matches nothing and must not reach the driver.
    if batch is not None and batch >= 2**63:
        raise UnknownBatch(f"no batch {batch}", batch=batch)
    if generation is not None and not 1 <= generation < 2**31:
        raise UnknownBatch(f"no checkpoint generation {generation}", generation=generation)
    if since is not None and until is not None and until <= since:
        raise InvalidInput("the time range is empty: --to must be after --from")


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    try:
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    except (OverflowError, ValueError) as exc:  # datetime.max in a zone east of UTC
        raise InvalidInput(f"invalid time bound {value.isoformat()}: outside the range of dates") from exc


def replay(
    ops: Operations, pipeline: str, *, batch: int | None = None,
    since: datetime | None = None, until: datetime | None = None, query_id: str | None = None,
    generation: int | None = None, consumer_group: str | None = None,
) -> ReplayRange:
    """Select the batches in the ledger, then compute their replay (retention checked when ``ops`` has Kafka).

    ``batch`` is Spark's batch id within one query: ``query_id``'s, generation ``generation``'s, or
    by default the current generation's query (else the query of the latest batch). A time range
    (``since`` inclusive, ``until`` exclusive, on batch times) takes every query's batches unless
    ``query_id`` or ``generation`` narrows it.
    """
    # SQLite keeps datetimes as naive UTC text: an aware bound in another zone would be compared by
    # its wall-clock digits there (Postgres converts); naive input means UTC everywhere.
    since, until = _utc(since), _utc(until)
    _check_request(batch, since, until, query_id, generation)
    kafka = ops.kafka if ops.has_kafka else None
    try:
        with ops.engine.connect() as conn:
            group = resolve_group(conn, pipeline, consumer_group)
            chosen = query_id
            if generation is not None or (chosen is None and batch is not None):
                row = q.generation_row(conn, pipeline, group, generation)
                if row is None and generation is not None:
                    raise UnknownBatch(f"pipeline {pipeline!r} has no checkpoint generation {generation}",
                                       pipeline=pipeline, generation=generation)
                chosen = q.query_of_generation(conn, row.id, row.query_id) if row is not None else None
                if chosen is None and generation is not None:
                    raise UnknownBatch(f"generation {generation} of {pipeline!r} has no recorded query yet",
                                       pipeline=pipeline, generation=generation)
                if chosen is None:
                    chosen = q.latest_query(conn, pipeline, group)
            rows = q.batch_ranges(conn, pipeline, group, query_id=chosen, batch_id=batch, since=since, until=until)
            ranges = [RecordedRange(r["query_id"], r["batch_id"], r["topic"], r["partition"], r["from_offset"],
                                    r["until_offset"], r["source_index"]) for r in rows]
            open_starts = [r for r in ranges if r.from_offset is None]
            if open_starts:
                ranges = recover_starts(
                    ranges, q.previous_ends(conn, {(r.query_id, r.batch_id - 1) for r in open_starts if r.batch_id}),
                    q.first_batch_starts(conn, pipeline, group, {r.query_id for r in open_starts if r.batch_id == 0}))

            wrote = outputs_by_batch(conn, pipeline, sorted({(r.query_id, r.batch_id) for r in ranges}))
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading batch ranges") from exc
    if not rows:
        what = (f"batch {batch} of query {chosen}" if batch is not None
                else f"batch in [{since.isoformat() if since else '...'}, {until.isoformat() if until else '...'})"
                + (f" of query {chosen}" if chosen else ""))
        raise UnknownBatch(f"pipeline {pipeline!r} has no recorded {what}", pipeline=pipeline, batch=batch,
                           query_id=chosen)
    watermarks = None
    note = None
    if kafka is not None:
        try:
            watermarks = kafka.watermarks(sorted({r.topic for r in ranges}))
        except KafkaError as exc:
            note = f"retention not checked: {exc.message}"
    result = compute_range(ranges, watermarks, pipeline=pipeline)
    if kafka is None:
        note = "retention not checked: no Kafka bootstrap servers given"
    if note:
        result = ReplayRange(**{**result.__dict__, "warnings": result.warnings + (note,)})
    if wrote:
        result = ReplayRange(**{**result.__dict__, "outputs": tuple(o for key in result.batches for o in wrote.get(key, ()))})
    return result


def replay_range(
    pipeline: str, *, batch: int | None = None, since: datetime | str | int | None = None,
    until: datetime | str | int | None = None, query_id: str | None = None, generation: int | None = None,
    consumer_group: str | None = None, dsn: str | None = None, bootstrap_servers: str | None = None,
    kafka_options: Mapping[str, Any] | None = None,
) -> ReplayRange:
    """The exact records recorded batches read, as options for ``spark.read.format("kafka")``.

    ``batch=N`` is Spark's batch id in the pipeline's current generation (its query; ``query_id``
    or ``generation`` pick another, since batch ids restart at 0 with every checkpoint), or
    ``since``/``until`` (datetime, ISO 8601 or epoch ms; batch times, ``until`` exclusive) select
    every batch in a time range. Per partition the range runs from the first batch's start to the
    last batch's end; untouched partitions are left out, so read with ``assign``::

        r = replay_range("orders", batch=7, dsn=DSN, bootstrap_servers=BOOTSTRAP)
        df = spark.read.format("kafka").option("kafka.bootstrap.servers", BOOTSTRAP).options(**r.options()).load()

    With ``bootstrap_servers`` (default ``OFFSET_LEDGER_BOOTSTRAP_SERVERS``), records retention
    already deleted are reported in ``warnings`` and ``lost``. A range Spark reported without a
    start (a first batch, a partition discovered while running) starts where the ledger knows:
    the query's previous batch's end, or for batch 0 the offsets its generation resolved; when
    neither is recorded the answer is refused (``ReplayNotExact``, naming the partitions), never
    given without that partition. Aware datetimes of any zone select the same batches on every
    database. Raises UnknownPipeline / UnknownBatch when nothing matches.
    """
    start = parse_timestamp(since) if isinstance(since, (str, int)) else since
    end = parse_timestamp(until) if isinstance(until, (str, int)) else until
    ops = Operations.open(LedgerAddress.resolve(dsn), KafkaAddress.resolve(bootstrap_servers, kafka_options))
    try:
        return replay(ops, pipeline, batch=batch, since=start, until=end, query_id=query_id,
                      generation=generation, consumer_group=consumer_group)
    finally:
        ops.close()
