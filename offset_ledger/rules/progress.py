"""Pure parsing of Spark's streaming listener events (their JSON text) into ledger values.

Spark serialises every listener event to JSON on the JVM side (``event.progress.json``); parsing
that one string is far cheaper than walking the progress object field by field over py4j, and it
keeps this module free of Spark: literals in, values out.

Kafka sources are recognised by their description: ``KafkaV2[Subscribe[t]]`` (the micro-batch
stream Spark 3 and 4 use), ``KafkaSourceV1[...]`` (the DSv1 source) and ``KafkaSource[...]``.
Their ``startOffset`` / ``endOffset`` are ``{"topic": {"partition": next_offset}}`` maps, which
Spark emits as JSON objects and PySpark's ``lastProgress`` sometimes as JSON strings; both work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress

KAFKA_SOURCE_PREFIXES = ("KafkaV2[", "KafkaSourceV1[", "KafkaSource[")


class ProgressParseError(ValueError):
    """The event text is not a streaming listener event this parser understands."""


@dataclass(frozen=True)
class QueryStarted:
    """A query run began (Spark's QueryStartedEvent)."""

    query_id: str
    run_id: str
    query_name: str | None
    started_at: datetime


@dataclass(frozen=True)
class QueryIdle:
    """A query run is alive and waiting for data (Spark's QueryIdleEvent): a heartbeat."""

    query_id: str
    run_id: str
    at: datetime


@dataclass(frozen=True)
class QueryTerminated:
    """A query run ended, with the exception text when it failed."""

    query_id: str
    run_id: str
    exception: str | None
    error_class: str | None


def is_kafka_source(description: str) -> bool:
    """Whether a progress source description names one of Spark's Kafka sources."""
    return description.startswith(KAFKA_SOURCE_PREFIXES)


def parse_timestamp(text: str) -> datetime:
    """Spark's ``2026-11-22T20:42:12.804Z`` as an aware UTC datetime."""
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProgressParseError(f"not a timestamp: {text!r}") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _loads(text: str | bytes | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(text, Mapping):
        return text
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ProgressParseError(f"not JSON: {exc}") from exc
    if not isinstance(value, Mapping):
        raise ProgressParseError("event JSON is not an object")
    return value


def _offsets(value: Any, what: str) -> dict[tuple[str, int], int] | None:
    """``{"t": {"0": 5}}`` (object or JSON string) -> ``{("t", 0): 5}``; None stays None."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ProgressParseError(f"{what} is not JSON: {value!r}") from exc
        if value is None:
            return None
    if not isinstance(value, Mapping):
        raise ProgressParseError(f"{what} is not a topic -> partition map: {value!r}")
    out: dict[tuple[str, int], int] = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, Mapping):
            raise ProgressParseError(f"{what} of topic {topic!r} is not a partition map")
        for partition, next_offset in partitions.items():
            try:
                key = (str(topic), int(partition))
            except (TypeError, ValueError) as exc:
                raise ProgressParseError(f"{what}: partition {partition!r} of {topic!r} is not an int") from exc
            if isinstance(next_offset, bool) or not isinstance(next_offset, int):
                raise ProgressParseError(f"{what}: offset of {topic}-{partition} is not an int: {next_offset!r}")
            out[key] = next_offset
    return out


def _int(value: Any, default: int = 0) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _is_count(value: Any) -> bool:
    """Whether ``value`` is a row count Spark reported (an int, or its text), not absent or null."""
    if value is None or isinstance(value, bool):
        return False
    try:
        int(value)
    except (TypeError, ValueError):
        return False
    return True


def parse_progress(text: str | bytes | Mapping[str, Any]) -> BatchOffsets:
    """A StreamingQueryProgress JSON -> the batch with the ranges of each of its Kafka sources.

    Non-Kafka sources are left out (``source_index`` keeps their position in ``sources`` so two
    Kafka sources of one query stay distinct); ``non_kafka_sources`` counts them, since their rows
    are in the batch's ``numInputRows``. A Kafka source without an ``endOffset`` (nothing planned
    yet) contributes no ranges; one without ``numInputRows`` has ``rows_reported`` False.
    """
    doc = _loads(text)
    try:
        query_id = str(doc["id"])
        run_id = str(doc["runId"])
        batch_id = int(doc["batchId"])
        batch_time = parse_timestamp(doc["timestamp"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProgressParseError(f"progress JSON lacks id/runId/batchId/timestamp: {exc}") from exc
    name = doc.get("name")
    raw_sources = doc.get("sources") or ()
    if not isinstance(raw_sources, (list, tuple)):
        raise ProgressParseError("progress JSON 'sources' is not a list")
    sources: list[SourceProgress] = []
    others = 0
    for index, source in enumerate(raw_sources):
        if not isinstance(source, Mapping):
            raise ProgressParseError(f"source {index} is not an object")
        description = str(source.get("description", ""))
        if not is_kafka_source(description):
            others += 1  # its rows are in the batch total, never in a Kafka source's count
            continue
        start = _offsets(source.get("startOffset"), "startOffset")
        end = _offsets(source.get("endOffset"), "endOffset")
        ranges: tuple[PartitionRange, ...] = ()
        if end is not None:
            ranges = tuple(
                PartitionRange(topic, partition, (start or {}).get((topic, partition)), until_offset)
                for (topic, partition), until_offset in sorted(end.items())
            )
        rows = source.get("numInputRows")
        # Absent is not 0: a count nobody reported says nothing about what the source read.
        sources.append(SourceProgress(index, description, ranges, _int(rows), rows_reported=_is_count(rows)))
    return BatchOffsets(
        query_id=query_id,
        run_id=run_id,
        query_name=str(name) if name is not None else None,
        batch_id=batch_id,
        batch_time=batch_time,
        input_rows=_int(doc.get("numInputRows")),
        sources=tuple(sources),
        non_kafka_sources=others,
        duration_ms=_duration_ms(doc.get("durationMs")),
        **_event_time(doc.get("eventTime")),  # type: ignore[arg-type]
        **_state_rows(doc.get("stateOperators")),  # type: ignore[arg-type]
    )


def _event_time(event_time: object) -> dict[str, datetime | None]:
    """Spark's ``eventTime`` map (``watermark``, ``min``, ``max``, ``avg``; present only with a
    watermark, and without min/max when the batch saw no rows) as BatchOffsets fields."""
    out: dict[str, datetime | None] = {"watermark": None, "event_time_min": None, "event_time_max": None}
    if not isinstance(event_time, Mapping):
        return out
    for key, field_name in (("watermark", "watermark"), ("min", "event_time_min"), ("max", "event_time_max")):
        value = event_time.get(key)
        if value is not None:
            try:
                out[field_name] = parse_timestamp(str(value))
            except ProgressParseError:
                # The offsets are what the ledger exists for: an odd figure never costs the batch.
                out[field_name] = None
    return out


def _state_rows(operators: object) -> dict[str, int | None]:
    """Spark's ``stateOperators`` list summed over operators (a query may have several)."""
    keys = (("numRowsTotal", "state_rows_total"), ("numRowsUpdated", "state_rows_updated"),
            ("numRowsDroppedByWatermark", "state_rows_dropped_by_watermark"))
    out: dict[str, int | None] = {name: None for _, name in keys}
    if not isinstance(operators, (list, tuple)):
        return out
    for op in operators:
        if not isinstance(op, Mapping):
            continue
        for key, name in keys:
            if op.get(key) is not None:
                out[name] = (out[name] or 0) + _int(op.get(key))
    return out


def _duration_ms(durations: object) -> int | None:
    """The batch's wall time (Spark's ``durationMs.triggerExecution``), None when not reported."""
    if not isinstance(durations, Mapping) or "triggerExecution" not in durations:
        return None
    value = _int(durations.get("triggerExecution"), -1)
    return value if value >= 0 else None


def is_no_data(batch: BatchOffsets) -> bool:
    """A progress report that moved nothing: no rows and every Kafka range starts where it ends.

    Spark 3.x repeats such reports while a query waits for data (Spark 4 sends QueryIdleEvent
    instead); recording them as batches would rewrite history, so they only count as heartbeats.
    """
    if batch.input_rows:
        return False
    ranges = [r for s in batch.sources for r in s.ranges]
    return all(r.from_offset is not None and r.from_offset == r.until_offset for r in ranges)


def parse_started(text: str | bytes | Mapping[str, Any]) -> QueryStarted:
    """A QueryStartedEvent JSON -> QueryStarted."""
    doc = _loads(text)
    try:
        return QueryStarted(str(doc["id"]), str(doc["runId"]),
                            str(doc["name"]) if doc.get("name") is not None else None,
                            parse_timestamp(doc["timestamp"]))
    except KeyError as exc:
        raise ProgressParseError(f"started event lacks {exc}") from exc


def parse_idle(text: str | bytes | Mapping[str, Any]) -> QueryIdle:
    """A QueryIdleEvent JSON -> QueryIdle."""
    doc = _loads(text)
    try:
        return QueryIdle(str(doc["id"]), str(doc["runId"]), parse_timestamp(doc["timestamp"]))
    except KeyError as exc:
        raise ProgressParseError(f"idle event lacks {exc}") from exc


def parse_terminated(text: str | bytes | Mapping[str, Any]) -> QueryTerminated:
    """A QueryTerminatedEvent JSON -> QueryTerminated."""
    doc = _loads(text)
    try:
        exception = doc.get("exception")
        error_class = doc.get("errorClassOnException")
        return QueryTerminated(str(doc["id"]), str(doc["runId"]),
                               str(exception) if exception is not None else None,
                               str(error_class) if error_class is not None else None)
    except KeyError as exc:
        raise ProgressParseError(f"terminated event lacks {exc}") from exc
