"""Pure: a Spark Structured Streaming checkpoint's files -> the query id and its Kafka positions.

The layout, as Spark writes it (``tests/fixtures/checkpoints`` holds real ones from 3.5 and 4.2):

- ``metadata``: ``{"id": "<query id>"}``.
- ``offsets/<n>``: the batch's *end* offsets, planned before the batch runs (a write-ahead log).
  Line 1 is the format version (``v1``; ``v2`` with ``spark.sql.streaming.offsetLog.formatVersion=2``
  in 4.x), line 2 the batch metadata JSON (may be empty), then one line per source in source
  order: the source's offset JSON, or ``-`` / empty when it had none yet. In ``v2`` each source
  line is ``<source id>:<offset JSON>``.
- ``commits/<n>``: written once batch ``n`` committed (``v1``, or ``v2`` with state checkpoint ids).
- ``sources/<i>/0``: source ``i``'s initial offsets (Kafka: a NUL byte, ``v1``, the JSON).

Only a batch with a commit file is a position: ``offsets/<n>`` without ``commits/<n>`` was planned
and will be re-run by Spark from ``offsets/<n-1>``. A Kafka offset is ``{"topic": {"0": 123}}``,
the next offset to read per partition, exactly the ledger's ``next_offset``. No I/O here: files
come through a ``CheckpointFiles`` (``offset_ledger.capture.checkpoint_files`` reads local and remote ones).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from offset_ledger.errors import CheckpointFormatError, InvalidInput

#: Format versions this module reads; anything newer is an error, never a guess.
OFFSET_LOG_VERSIONS = (1, 2)
COMMIT_LOG_VERSIONS = (1, 2)
INITIAL_OFFSET_VERSIONS = (1,)

SourceKind = Literal["kafka", "other", "none"]
SourceChoice = int | Literal["all"] | None


class CheckpointFiles(Protocol):
    """Read access to one checkpoint directory, by paths relative to it."""

    def list(self, relative_dir: str) -> list[str]:
        """Names of the entries in a subdirectory (empty when it does not exist)."""

    def read(self, relative_path: str) -> bytes | None:
        """A file's bytes, or None when it does not exist."""


@dataclass(frozen=True)
class SourceOffset:
    """One source's offset in one offsets file (or its initial offsets)."""

    index: int  # the source's position in the query: the line order, and ``sources/<index>``
    kind: SourceKind
    raw: str  # the JSON as Spark wrote it ("" for none)
    kafka: Mapping[str, Mapping[int, int]] | None = None  # topic -> partition -> next_offset
    source_id: str | None = None  # the v2 source id

    def describe(self) -> str:
        if self.kind == "kafka":
            assert self.kafka is not None
            return f"source {self.index}: Kafka ({', '.join(sorted(self.kafka))})"
        if self.kind == "none":
            return f"source {self.index}: no offset yet"
        return f"source {self.index}: not Kafka ({self.raw[:60]})"


@dataclass(frozen=True)
class CheckpointState:
    """What a checkpoint says about where its query stands."""

    location: str
    query_id: str
    committed_batch_id: int | None  # the last batch with a commit; None: nothing committed yet
    planned_batch_ids: tuple[int, ...]  # offsets files after it without a commit (Spark re-runs them)
    sources: tuple[SourceOffset, ...]  # the position: end offsets of the committed batch, else initial
    version: int | None = None  # the offsets file's format version (None: initial offsets)
    batch_timestamp_ms: int | None = None

    @property
    def kafka_sources(self) -> tuple[SourceOffset, ...]:
        return tuple(s for s in self.sources if s.kind == "kafka")

    def describe_batch(self) -> str:
        if self.committed_batch_id is None:
            return "no committed batch (initial offsets)"
        return f"batch {self.committed_batch_id}"


@dataclass(frozen=True)
class KafkaPositions:
    """The positions chosen from a checkpoint's Kafka sources."""

    positions: Mapping[str, Mapping[int, int]]  # topic -> partition -> next_offset
    used: tuple[int, ...]  # source indexes taken
    skipped: tuple[str, ...] = field(default=())  # why other sources were not


def _version(line: str, path: str, supported: Sequence[int]) -> int:
    text = line.strip()
    if not (text.startswith("v") and text[1:].isdigit()):
        raise CheckpointFormatError(path, f"first line {text[:40]!r} is not a format version like v1")
    version = int(text[1:])
    if version not in supported:
        raise CheckpointFormatError(
            path, f"format version v{version} is not one this offset-ledger reads "
                  f"({', '.join(f'v{v}' for v in supported)}); it was written by a newer Spark")
    return version


def _text(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointFormatError(path, "not UTF-8 text") from exc


def _lines(text: str) -> list[str]:
    # Like the JVM's line reader Spark uses: a final newline does not make an extra (empty) source.
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def parse_metadata(data: bytes, path: str) -> str:
    """The query id in a checkpoint's ``metadata`` file."""
    try:
        doc = json.loads(_text(data, path))
    except ValueError as exc:
        raise CheckpointFormatError(path, f"not JSON: {exc}") from exc
    query_id = doc.get("id") if isinstance(doc, dict) else None
    if not isinstance(query_id, str) or not query_id:
        raise CheckpointFormatError(path, 'no query "id"')
    return query_id


def classify_offset(raw: str, index: int, path: str, source_id: str | None = None) -> SourceOffset:
    """A source's offset JSON -> a Kafka offset (topic -> partition -> offset), another source's, or none."""
    text = raw.strip()
    if text in ("", "-"):
        return SourceOffset(index, "none", "", source_id=source_id)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CheckpointFormatError(path, f"source {index}'s offset is not JSON: {exc}") from exc
    kafka = _as_kafka(doc)
    if kafka is None:
        return SourceOffset(index, "other", text, source_id=source_id)
    return SourceOffset(index, "kafka", text, kafka, source_id)


def _as_kafka(doc: object) -> dict[str, dict[int, int]] | None:
    """Kafka's offset is an object of topics, each an object of partition numbers to integers.

    File sources write ``{"logOffset": 3}``, rate and memory sources a bare number, continuous rate
    ``{"0": {"value": .., "runTimeMs": ..}}``: none of them has integer values under digit keys
    one level down.
    """
    if not isinstance(doc, dict) or not doc:
        return None
    out: dict[str, dict[int, int]] = {}
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            return None
        out[topic] = {}
        for partition, offset in parts.items():
            if not (isinstance(partition, str) and partition.isdigit()):
                return None
            if isinstance(offset, bool) or not isinstance(offset, int):
                return None
            out[topic][int(partition)] = offset
    return out


def parse_offsets_file(data: bytes, path: str) -> tuple[int, int | None, tuple[SourceOffset, ...]]:
    """(format version, batch timestamp in ms, the sources' offsets) of one ``offsets/<n>`` file."""
    lines = _lines(_text(data, path))
    if not lines:
        raise CheckpointFormatError(path, "empty file")
    version = _version(lines[0], path, OFFSET_LOG_VERSIONS)
    if len(lines) < 2:
        raise CheckpointFormatError(path, "no batch metadata line")
    timestamp_ms = None
    if lines[1].strip():
        try:
            meta = json.loads(lines[1])
        except ValueError as exc:
            raise CheckpointFormatError(path, f"batch metadata is not JSON: {exc}") from exc
        if not isinstance(meta, dict):
            raise CheckpointFormatError(path, "batch metadata is not a JSON object")
        ts = meta.get("batchTimestampMs")
        timestamp_ms = ts if isinstance(ts, int) and not isinstance(ts, bool) else None
    sources = []
    for index, line in enumerate(lines[2:]):
        source_id = None
        if version >= 2:
            # v2 keys each line by the source's id: "<id>:<offset JSON>".
            source_id, sep, line = line.partition(":")
            if not sep or not source_id or source_id.lstrip().startswith(("{", "[", '"')):
                raise CheckpointFormatError(path, f"source line {index} is not '<source id>:<offset>'")
        sources.append(classify_offset(line, index, path, source_id))
    if not sources:
        raise CheckpointFormatError(path, "no source lines")
    return version, timestamp_ms, tuple(sources)


def check_commit_file(data: bytes, path: str) -> None:
    """A ``commits/<n>`` file: a known version line and a JSON object."""
    lines = _lines(_text(data, path))
    if not lines:
        raise CheckpointFormatError(path, "empty file")
    _version(lines[0], path, COMMIT_LOG_VERSIONS)
    if len(lines) > 1 and lines[1].strip():
        try:
            json.loads(lines[1])
        except ValueError as exc:
            raise CheckpointFormatError(path, f"commit metadata is not JSON: {exc}") from exc


def parse_initial_offsets(data: bytes, index: int, path: str) -> SourceOffset:
    """``sources/<i>/0``: Kafka writes a NUL byte (for Spark 2.1 readers), ``v1`` and the JSON."""
    text = _text(data, path).lstrip("\x00")
    if text.startswith("v"):
        first, sep, rest = text.partition("\n")
        if not sep:
            raise CheckpointFormatError(path, "a version line and no offsets")
        _version(first, path, INITIAL_OFFSET_VERSIONS)
        text = rest
    return classify_offset(text, index, path)


def _batch_ids(names: Sequence[str]) -> set[int]:
    # Hadoop leaves ".<n>.crc" and ".<n>.tmp" side files; only bare numbers are log entries.
    return {int(n) for n in names if n.isdigit()}


def read_checkpoint(location: str, files: CheckpointFiles) -> CheckpointState:
    """The checkpoint's query id and the offsets of its last committed batch.

    With no committed batch, the sources' initial offsets (``sources/<i>/0``) are the position.
    Raises CheckpointFormatError naming the file that is missing, corrupt or of an unknown version.
    """
    root = location.rstrip("/")
    meta = files.read("metadata")
    if meta is None:
        raise CheckpointFormatError(f"{root}/metadata", "missing: is this a streaming checkpoint directory?")
    query_id = parse_metadata(meta, f"{root}/metadata")
    planned = _batch_ids(files.list("offsets"))
    committed = _batch_ids(files.list("commits")) & planned
    last = max(committed) if committed else None
    newer = tuple(sorted(b for b in planned if last is None or b > last))
    for batch_id in sorted(committed)[-1:]:
        data = files.read(f"commits/{batch_id}")
        assert data is not None
        check_commit_file(data, f"{root}/commits/{batch_id}")
    if last is not None:
        path = f"{root}/offsets/{last}"
        data = files.read(f"offsets/{last}")
        if data is None:
            raise CheckpointFormatError(path, "listed but unreadable")
        version, timestamp_ms, sources = parse_offsets_file(data, path)
        return CheckpointState(root, query_id, last, newer, sources, version, timestamp_ms)
    # Nothing committed: batch 0 reads from the initial offsets each source wrote when it started.
    indexes = sorted(_batch_ids(files.list("sources")))
    initial = []
    for index in indexes:
        data = files.read(f"sources/{index}/0")
        if data is not None:
            initial.append(parse_initial_offsets(data, index, f"{root}/sources/{index}/0"))
    if not initial:
        raise CheckpointFormatError(f"{root}/commits", "no committed batch and no initial offsets: "
                                    "the query never started reading, there is no position to adopt")
    return CheckpointState(root, query_id, None, newer, tuple(initial))


def kafka_positions(state: CheckpointState, source: SourceChoice = None) -> KafkaPositions:
    """The Kafka positions to adopt: the only Kafka source, source ``source``, or ``"all"`` of them.

    Several sources on one topic partition take the lowest offset (the ledger's rule: from there no
    source skips a record); different topics are merged. Other sources are listed in ``skipped``.
    """
    kafka = state.kafka_sources
    skipped = [s.describe() + ", skipped" for s in state.sources if s.kind != "kafka"]
    if not kafka:
        raise InvalidInput(f"checkpoint {state.location} has no Kafka source at {state.describe_batch()} "
                           f"({'; '.join(s.describe() for s in state.sources)})", checkpoint=state.location)
    if source is None:
        if len(kafka) > 1:
            raise InvalidInput(
                f"checkpoint {state.location} has {len(kafka)} Kafka sources "
                f"({'; '.join(s.describe() for s in kafka)}); choose one with --source N (source=N) "
                f"or import them all with --source all", checkpoint=state.location,
                sources=[s.index for s in kafka])
        chosen = list(kafka)
    elif source == "all":
        chosen = list(kafka)
    else:
        chosen = [s for s in kafka if s.index == source]
        if not chosen:
            raise InvalidInput(f"checkpoint {state.location} has no Kafka source {source} "
                               f"({'; '.join(s.describe() for s in state.sources)})",
                               checkpoint=state.location, source=source)
        skipped += [s.describe() + ", not chosen" for s in kafka if s.index != source]
    merged: dict[str, dict[int, int]] = {}
    for s in chosen:
        assert s.kafka is not None
        for topic, parts in s.kafka.items():
            for partition, next_offset in parts.items():
                seen = merged.setdefault(topic, {}).get(partition)
                merged[topic][partition] = next_offset if seen is None else min(seen, next_offset)
    return KafkaPositions({t: dict(sorted(p.items())) for t, p in sorted(merged.items())},
                          tuple(s.index for s in chosen), tuple(skipped))


def parse_source_choice(value: str | int | None) -> SourceChoice:
    """``--source``: a source index or ``all``."""
    if value is None or value == "all":
        return value  # type: ignore[return-value]
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise InvalidInput(f"invalid source {value!r}: use a source index (0, 1, ...) or 'all'", source=str(value))


@dataclass(frozen=True)
class CommittedBatch:
    """One committed batch as the checkpoint has it: where each source started and ended."""

    batch_id: int
    timestamp_ms: int | None
    #: the sources' offsets when the batch began: ``offsets/<n-1>``, or the initial offsets for
    #: batch 0; None when Spark already purged them (it keeps the last ~100 batches)
    starts: tuple[SourceOffset, ...] | None
    ends: tuple[SourceOffset, ...]


def committed_batch_ids(files: CheckpointFiles) -> list[int]:
    """The batch ids with both an ``offsets/`` and a ``commits/`` entry, ascending (no file is read)."""
    return sorted(_batch_ids(files.list("commits")) & _batch_ids(files.list("offsets")))


def read_committed_batches(
    location: str, files: CheckpointFiles, after_batch_id: int | None = None,
    only: Collection[int] | None = None,
) -> tuple[str | None, list[CommittedBatch]]:
    """(query id, every committed batch after ``after_batch_id``, oldest first) of a checkpoint.

    ``only``: read just these batch ids (those the ledger lacks), not every file Spark keeps.

    A checkpoint Spark has not written yet (no ``metadata``, nothing planned) is (None, []): a
    generation handed out and never started. Raises CheckpointFormatError for anything else that
    cannot be read as Spark writes it.
    """
    root = location.rstrip("/")
    planned = _batch_ids(files.list("offsets"))
    meta = files.read("metadata")
    if meta is None:
        if not planned:
            return None, []
        raise CheckpointFormatError(f"{root}/metadata", "missing although offsets/ has entries")
    query_id = parse_metadata(meta, f"{root}/metadata")
    committed = sorted(_batch_ids(files.list("commits")) & planned)
    wanted = [b for b in committed if (after_batch_id is None or b > after_batch_id)
              and (only is None or b in only)]
    cache: dict[int, tuple[int | None, tuple[SourceOffset, ...]]] = {}

    def offsets_of(batch_id: int) -> tuple[int | None, tuple[SourceOffset, ...]] | None:
        if batch_id not in cache:
            data = files.read(f"offsets/{batch_id}")
            if data is None:
                return None
            _, ts, sources = parse_offsets_file(data, f"{root}/offsets/{batch_id}")
            cache[batch_id] = (ts, sources)
        return cache[batch_id]

    out = []
    for batch_id in wanted:
        data = files.read(f"commits/{batch_id}")
        if data is None:
            raise CheckpointFormatError(f"{root}/commits/{batch_id}", "listed but unreadable")
        check_commit_file(data, f"{root}/commits/{batch_id}")
        ended = offsets_of(batch_id)
        if ended is None:
            raise CheckpointFormatError(f"{root}/offsets/{batch_id}", "listed but unreadable")
        starts: tuple[SourceOffset, ...] | None = None
        if batch_id - 1 in planned:
            before = offsets_of(batch_id - 1)
            starts = before[1] if before is not None else None
        elif batch_id == 0:
            initial = []
            for index in sorted(_batch_ids(files.list("sources"))):
                raw = files.read(f"sources/{index}/0")
                if raw is not None:
                    initial.append(parse_initial_offsets(raw, index, f"{root}/sources/{index}/0"))
            starts = tuple(initial) or None
        out.append(CommittedBatch(batch_id, ended[0], starts, ended[1]))
    return query_id, out
