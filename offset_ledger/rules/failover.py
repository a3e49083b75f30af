"""Failing a pipeline over to a MirrorMaker 2 backup cluster: MM2's records, topic names, the plan. Pure.

MirrorMaker 2's checkpoint connector translates each consumer group's committed offsets to the
target cluster and writes them to ``<source alias>.checkpoints.internal`` there. offset-ledger's
consumer-group mirror commits a pipeline's positions to a Kafka group, so MM2 translates them like
any group's; this module reads those records and turns them into ``startingOffsets`` on the backup.

Checkpoint records (``org.apache.kafka.connect.mirror.Checkpoint``) use Kafka's protocol types,
big-endian: a STRING is an int16 byte length and UTF-8 bytes, INT32/INT64 fixed width.

- key: consumer group (STRING), topic (STRING, the *target* cluster's name), partition (INT32);
- value: a header, the format version (INT16, 0 is the only one), then the upstream offset
  (INT64), the downstream offset (INT64) and the committed metadata (STRING).

Both offsets follow Kafka's committed-offset convention: the *next* offset to read, on the source
and on the target cluster. MM2's translation is conservative: the downstream offset never lies
past the replica of the upstream one, so a failover re-reads records and never skips any. How
many at most: everything the backup holds from the downstream start on (``reread_max``), of which
``U - C`` upstream offsets (ledger position minus the checkpoint's upstream offset) are certain.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from offset_ledger.addresses import KafkaAddress
from offset_ledger.errors import ConfigError, FailoverRefused, InvalidInput, KafkaError
from offset_ledger.rules.model import Finding, TopicPartition, Watermarks

Uncheckpointed = Literal["fail", "earliest"]
ReplicationPolicy = Literal["default", "identity"]
PartitionStatus = Literal["translated", "earliest", "new_partition"]

#: The only checkpoint value format MM2 writes (Checkpoint.VERSION).
CHECKPOINT_VERSION = 0


def checkpoints_topic(source_alias: str) -> str:
    """MM2's checkpoints topic on the target for flows from ``source_alias``."""
    return f"{source_alias}.checkpoints.internal"


@dataclass(frozen=True)
class Mm2Checkpoint:
    """One MM2 checkpoint: a group's committed offset on the source and its translation on the target."""

    consumer_group: str
    topic: str  # the target cluster's topic name (already renamed by the replication policy)
    partition: int
    upstream_next_offset: int
    downstream_next_offset: int
    metadata: str = ""

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.at, self.what = data, 0, what

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise KafkaError(f"MM2 checkpoint {self.what} is truncated ({len(self.data)} bytes)")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        length = self.take(">h")
        if length < 0 or self.at + length > len(self.data):
            raise KafkaError(f"MM2 checkpoint {self.what} has a bad string length {length}")
        raw = self.data[self.at:self.at + length]
        self.at += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise KafkaError(f"MM2 checkpoint {self.what} has a string that is not UTF-8") from exc


def decode_checkpoint(key: bytes, value: bytes) -> Mm2Checkpoint:
    """A checkpoint record's key and value; KafkaError on a truncated record or an unknown version."""
    if key is None or value is None:
        raise KafkaError("MM2 checkpoint record without key or value")
    k = _Reader(bytes(key), "key")
    group, topic, partition = k.string(), k.string(), k.take(">i")
    v = _Reader(bytes(value), "value")
    version = v.take(">h")
    if version != CHECKPOINT_VERSION:
        raise KafkaError(f"MM2 checkpoint value format version {version} is unknown (this offset-ledger "
                         f"reads version {CHECKPOINT_VERSION}); refusing to guess", version=version)
    upstream, downstream, meta = v.take(">q"), v.take(">q"), v.string()
    return Mm2Checkpoint(group, topic, partition, upstream, downstream, meta)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def encode_checkpoint(cp: Mm2Checkpoint) -> tuple[bytes, bytes]:
    """(key, value) exactly as MM2 writes them; for tests and fixtures."""
    key = _string(cp.consumer_group) + _string(cp.topic) + struct.pack(">i", cp.partition)
    value = struct.pack(">hqq", CHECKPOINT_VERSION, cp.upstream_next_offset, cp.downstream_next_offset) \
        + _string(cp.metadata)
    return key, value


def latest_checkpoints(records: Sequence[Mm2Checkpoint], consumer_group: str) -> dict[TopicPartition, Mm2Checkpoint]:
    """The newest checkpoint per target partition of one group (records in topic order; the last wins,
    as in the compacted topic)."""
    out: dict[TopicPartition, Mm2Checkpoint] = {}
    for cp in records:
        if cp.consumer_group == consumer_group:
            out[cp.tp] = cp
    return out


# -- topic names ---------------------------------------------------------------------------------


def target_topic(topic: str, *, source_alias: str, target_alias: str | None = None,
                 policy: ReplicationPolicy = "default", separator: str = ".") -> str:
    """The name MM2 gives ``topic`` of cluster ``source_alias`` on the target cluster.

    ``default`` (DefaultReplicationPolicy) prefixes the source alias: ``orders`` -> ``primary.orders``;
    a topic that came from the target in the first place (``backup.orders`` failing back to
    ``backup``) maps to its original name, as MM2's checkpoint connector does. ``identity``
    (IdentityReplicationPolicy) keeps the name.
    """
    if policy == "identity":
        return topic
    if policy != "default":
        raise InvalidInput(f"unknown replication policy {policy!r} (default or identity)")
    if not separator:
        raise InvalidInput("the replication policy separator must not be empty")
    head, sep, rest = topic.partition(separator)
    if target_alias is not None and sep and head == target_alias and rest:
        return rest
    return f"{source_alias}{separator}{topic}"


def returns_home(topic: str, *, target_alias: str | None, policy: ReplicationPolicy = "default",
                 separator: str = ".") -> bool:
    """Whether ``topic`` is a replica MM2 made *from* ``target_alias`` (failing back to where it came from).

    MM2 (3.5 and later) never checkpoints such a topic in the reverse flow: the reverse source
    connector skips a topic whose source is its own target (cycle detection), so the reverse flow
    has no offset syncs for it and its checkpoint connector translates nothing. Only knowable with
    the default policy (``identity`` keeps no trace of where a topic came from).
    """
    if policy != "default" or target_alias is None or not separator:
        return False
    head, sep, rest = topic.partition(separator)
    return bool(sep and rest and head == target_alias)


# -- the request ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailoverRequest:
    """What a failover is asked to do, checked when built: bad input raises here, before anything connects.

    ``to_bootstrap`` and ``kafka_options`` (Spark-style, the target's) reach the target cluster, the
    one MirrorMaker 2 fills from ``source_alias``: ``target`` is that cluster's ``KafkaAddress``, built
    once here (never from ``OFFSET_LEDGER_BOOTSTRAP_SERVERS``, which names the source);
    ``target_alias``, ``replication_policy`` and ``separator`` are MM2's naming (``target_topic``);
    ``uncheckpointed`` decides the partitions MM2 gives no safe translation for; ``topics`` are the
    ledger topics carried over (None: all of the pipeline's); ``checkpoint_root`` and ``app_version``
    are the new generation's (None: the current generation's). Built once by ``offset_ledger.failover(...)`` and the CLI; the verb
    ``operate.failover.fail_over(ops, pipeline, request)`` takes it as it is.
    """

    to_bootstrap: str
    source_alias: str = "primary"
    target_alias: str | None = None
    replication_policy: ReplicationPolicy = "default"
    separator: str = "."
    uncheckpointed: Uncheckpointed = "fail"
    topics: tuple[str, ...] | None = None
    checkpoint_root: str | None = None
    app_version: str | None = None
    kafka_options: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    target: KafkaAddress = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.to_bootstrap or not str(self.to_bootstrap).strip():
            raise ConfigError("failover needs the target cluster's bootstrap servers (to_bootstrap)",
                              option="to_bootstrap")
        if not self.source_alias:
            raise ConfigError("failover needs MirrorMaker 2's source cluster alias (source_alias)",
                              option="source_alias")
        if self.replication_policy not in ("default", "identity"):
            raise InvalidInput(f"unknown replication policy {self.replication_policy!r} (default or identity)",
                               option="replication_policy")
        if self.replication_policy == "default" and not self.separator:
            raise InvalidInput("the replication policy separator must not be empty", option="separator")
        if self.uncheckpointed not in ("fail", "earliest"):
            raise InvalidInput(f"uncheckpointed must be 'fail' or 'earliest', not {self.uncheckpointed!r}",
                               option="uncheckpointed")
        if self.topics is not None:
            if isinstance(self.topics, str):  # a bare name would be read as its letters
                raise InvalidInput(f"topics must be a list of topic names, not the string {self.topics!r}",
                                   option="topics")
            topics = tuple(self.topics)
            if not topics:  # failing over no topic would drop every position of the pipeline
                raise InvalidInput("topics is empty: name the topics to carry over, or omit it for all",
                                   option="topics")
            object.__setattr__(self, "topics", topics)
        object.__setattr__(self, "kafka_options", dict(self.kafka_options or {}))
        object.__setattr__(self, "target", KafkaAddress(str(self.to_bootstrap), self.kafka_options))

    def target_topic(self, topic: str) -> str:
        """The name MM2 gives ``topic`` on the target cluster (``target_topic`` under this request's naming)."""
        return target_topic(topic, source_alias=self.source_alias, target_alias=self.target_alias,
                            policy=self.replication_policy, separator=self.separator)

    def returns_home(self, topic: str) -> bool:
        """Whether ``topic`` is a replica MM2 made from ``target_alias`` (``returns_home``)."""
        return returns_home(topic, target_alias=self.target_alias, policy=self.replication_policy,
                            separator=self.separator)


# -- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailoverPartition:
    """One partition of the failover: where the ledger was, what MM2 translated, where the backup starts."""

    source_topic: str
    target_topic: str
    partition: int
    status: PartitionStatus
    ledger_next_offset: int | None          # on the source cluster
    checkpoint_upstream_offset: int | None  # the group's committed offset MM2 last translated
    start_next_offset: int                  # on the target cluster (a number, never a sentinel)
    #: Upstream offsets the ledger is past MM2's checkpoint: records certainly read again.
    behind_checkpoint: int
    #: Records the backup holds from the start on when planned: the most the pipeline re-reads.
    reread_max: int
    #: Timestamps (epoch ms) of the first and last record that may be read again; None when unknown.
    reread_from_ms: int | None = None
    reread_until_ms: int | None = None

    def details(self) -> dict[str, Any]:
        """This partition as the failover finding records it (stored in the ledger: the names never change)."""
        return {"sourceTopic": self.source_topic, "targetTopic": self.target_topic, "partition": self.partition,
                "status": self.status, "ledgerNextOffset": self.ledger_next_offset,
                "checkpointUpstreamOffset": self.checkpoint_upstream_offset,
                "startNextOffset": self.start_next_offset, "behindCheckpoint": self.behind_checkpoint,
                "rereadMax": self.reread_max, "rereadFromMs": self.reread_from_ms,
                "rereadUntilMs": self.reread_until_ms}


@dataclass(frozen=True)
class FailoverProblem:
    """A partition the translation cannot start safely; ``uncheckpointed`` decides what happens."""

    source_topic: str
    target_topic: str
    partition: int
    reason: Literal["no_checkpoint", "not_translated_back", "checkpoint_ahead", "below_log_start", "beyond_log_end"]
    detail: str

    def details(self) -> dict[str, Any]:
        """This problem as a refusal's ``problems`` and a finding's details record it (stored: names fixed)."""
        return {"sourceTopic": self.source_topic, "targetTopic": self.target_topic, "partition": self.partition,
                "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class FailoverPlan:
    """Where a pipeline starts on the target cluster, partition by partition."""

    topic_map: Mapping[str, str]
    partitions: tuple[FailoverPartition, ...]
    problems: tuple[FailoverProblem, ...] = ()
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def starting_offsets(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for p in self.partitions:
            out.setdefault(p.target_topic, {})[str(p.partition)] = p.start_next_offset
        return out

    @property
    def reread_max(self) -> int:
        return sum(p.reread_max for p in self.partitions)


def plan_failover(
    ledger: Mapping[TopicPartition, int],
    checkpoints: Mapping[TopicPartition, Mm2Checkpoint],
    target_watermarks: Mapping[TopicPartition, Watermarks],
    topic_map: Mapping[str, str],
    *,
    uncheckpointed: Uncheckpointed = "fail",
    returning: Collection[str] = (),
) -> FailoverPlan:
    """The failover plan from the ledger's positions (source names, next offsets), MM2's checkpoints
    (target names) and the target's watermarks, for the topics in ``topic_map`` (source -> target).

    Every target partition of a mapped topic gets a start. A partition the ledger never read starts
    at the log start (a new partition, as on any restart). A partition the ledger read but MM2 has
    no safe translation for (no checkpoint yet, a checkpoint *ahead* of the ledger, which would skip
    records, or a translation outside the target's log) is a problem: ``uncheckpointed="fail"``
    raises FailoverRefused naming them all; ``"earliest"`` starts it at the log start and says what
    that re-reads. Nothing is ever started past what the ledger read.

    ``returning`` names source topics that are MM2's replicas of the target's own topics (failing
    back: ``returns_home`` by name, or the target topic's Kafka id is one the pipeline read before):
    MM2 has no valid translation for them, so their partitions are refused with
    ``not_translated_back`` and a message that says waiting will not help.
    """
    if uncheckpointed not in ("fail", "earliest"):
        raise InvalidInput(f"uncheckpointed must be 'fail' or 'earliest', not {uncheckpointed!r}")
    by_target: dict[str, dict[int, Watermarks]] = {}
    for tp, wm in target_watermarks.items():
        by_target.setdefault(tp.topic, {})[tp.partition] = wm
    missing_topics = sorted(t for s, t in topic_map.items() if t not in by_target)
    if missing_topics:
        raise FailoverRefused(
            f"not on the target cluster: {', '.join(missing_topics)} (is MirrorMaker 2 replicating them, and "
            "is the source alias right?)", reason="topic_missing", topics=missing_topics)
    parts: list[FailoverPartition] = []
    problems: list[FailoverProblem] = []
    lost: list[str] = []
    for source in sorted(topic_map):
        target = topic_map[source]
        on_target = by_target[target]
        ledger_parts = {tp.partition for tp in ledger if tp.topic == source}
        for p in sorted(ledger_parts - set(on_target)):
            lost.append(f"{source}:{p}")
        for p in sorted(on_target):
            wm = on_target[p]
            upstream = ledger.get(TopicPartition(source, p))
            cp = checkpoints.get(TopicPartition(target, p))
            if upstream is None:
                parts.append(FailoverPartition(source, target, p, "new_partition", None, None, wm.log_start_offset,
                                               0, wm.log_end_offset - wm.log_start_offset))
                continue
            problem = _problem(source, target, p, upstream, cp, wm, source in returning)
            if problem is not None:
                problems.append(problem)
                parts.append(FailoverPartition(
                    source, target, p, "earliest", upstream, cp.upstream_next_offset if cp else None,
                    wm.log_start_offset, 0, wm.log_end_offset - wm.log_start_offset))
                continue
            assert cp is not None
            start = cp.downstream_next_offset
            parts.append(FailoverPartition(source, target, p, "translated", upstream, cp.upstream_next_offset, start,
                                           upstream - cp.upstream_next_offset, wm.log_end_offset - start))
    if lost:
        raise FailoverRefused(
            f"partitions the ledger read are not on the target cluster: {', '.join(lost)}; starting without "
            "them would skip their records", reason="partition_missing", partitions=lost)
    back = [x for x in problems if x.reason == "not_translated_back"]
    if back and uncheckpointed == "fail":
        names = ", ".join(f"{x.source_topic}:{x.partition}" for x in back)
        raise FailoverRefused(
            f"failing back: MirrorMaker 2 does not translate offsets on {names} back to the cluster the topic "
            "came from (the reverse flow never replicates a topic whose source is its target cluster, so it has "
            "no offset syncs for it and checkpoints none of it; with the identity policy it replicates the copy "
            "back onto the original topic; waiting does not help); choose --uncheckpointed "
            "earliest to read the original topic from its log start (nothing skipped; the plan states how many "
            "records are read again)",
            reason="uncheckpointed", problems=[x.details() for x in problems])
    if problems and uncheckpointed == "fail":
        names = ", ".join(f"{x.target_topic}:{x.partition} ({x.reason})" for x in problems)
        raise FailoverRefused(
            f"no safe MM2 translation for {len(problems)} partition(s): {names}; wait for MirrorMaker 2 to "
            "checkpoint them, or choose --uncheckpointed earliest to read them from the start of the backup's log",
            reason="uncheckpointed", problems=[x.details() for x in problems])
    return FailoverPlan(dict(topic_map), tuple(parts), tuple(problems))


def _problem(source: str, target: str, p: int, upstream: int, cp: Mm2Checkpoint | None,
             wm: Watermarks, returning: bool = False) -> FailoverProblem | None:
    if returning and cp is None:
        return FailoverProblem(source, target, p, "not_translated_back",
                               f"MirrorMaker 2 does not translate offsets on {source} back to the cluster it came from")
    if returning:
        # A checkpoint onto the topic the pipeline already read there cannot be a position among its
        # own records: IdentityReplicationPolicy has no cycle detection, so the reverse flow appends
        # the backup's copy to the original topic and translates into that copy (past records that
        # never reached the backup); MM2 before 3.5 "translated" topics it had no offset sync for
        # as the same number on the other cluster.
        return FailoverProblem(source, target, p, "not_translated_back",
                               f"MM2's checkpoint (offset {cp.downstream_next_offset}) lands on the topic the pipeline "
                               f"read before the failover: not a translation of {source}'s records back")
    if cp is None:
        return FailoverProblem(source, target, p, "no_checkpoint", "MirrorMaker 2 has not checkpointed it")
    if cp.upstream_next_offset > upstream:
        # The group was committed past the ledger (by someone else, or before a reset moved the
        # pipeline back): its translation would skip what the pipeline has not read.
        return FailoverProblem(source, target, p, "checkpoint_ahead",
                               f"MM2 translated upstream offset {cp.upstream_next_offset}, the ledger is at {upstream}")
    if cp.downstream_next_offset < wm.log_start_offset:
        return FailoverProblem(source, target, p, "below_log_start",
                               f"translated offset {cp.downstream_next_offset} is below the backup's log start "
                               f"{wm.log_start_offset} (retention)")
    if cp.downstream_next_offset > wm.log_end_offset:
        return FailoverProblem(source, target, p, "beyond_log_end",
                               f"translated offset {cp.downstream_next_offset} is past the backup's log end "
                               f"{wm.log_end_offset} (the topic was re-created?)")
    return None


def with_time_spans(plan: FailoverPlan, first_ms: Mapping[TopicPartition, int],
                    last_ms: Mapping[TopicPartition, int]) -> FailoverPlan:
    """The plan with each partition's re-read time span (timestamps read from the target, by target name)."""
    from dataclasses import replace

    parts = tuple(replace(p, reread_from_ms=first_ms.get(TopicPartition(p.target_topic, p.partition)),
                          reread_until_ms=last_ms.get(TopicPartition(p.target_topic, p.partition)))
                  if p.reread_max > 0 else p for p in plan.partitions)
    return replace(plan, partitions=parts)


def failover_findings(plan: FailoverPlan, *, source_alias: str, target_bootstrap: str,
                      target_cluster_id: str | None, source_cluster_id: str | None) -> tuple[Finding, ...]:
    """The stored findings: one ``failover`` finding stating the translation gap, one per problem."""
    spans = [(p.reread_from_ms, p.reread_until_ms) for p in plan.partitions
             if p.reread_from_ms is not None and p.reread_until_ms is not None]
    span_ms = (max(u for _, u in spans) - min(f for f, _ in spans)) if spans else 0
    translated = sum(1 for p in plan.partitions if p.status == "translated")
    summary = Finding(
        "failover",
        f"failed over from {source_alias} to {target_bootstrap}: {translated} partition(s) translated by "
        f"MirrorMaker 2, {len(plan.problems)} from the target's log start; at most {plan.reread_max} record(s) "
        f"are read again, spanning {span_ms / 1000:.1f} s of record time",
        details={"source_alias": source_alias, "target_bootstrap": target_bootstrap,
                 "source_cluster_id": source_cluster_id, "target_cluster_id": target_cluster_id,
                 "topic_map": dict(plan.topic_map), "reread_max": plan.reread_max, "reread_span_ms": span_ms,
                 "partitions": [p.details() for p in plan.partitions]})
    extra = tuple(Finding("failover", f"{x.target_topic}:{x.partition} starts at the target's log start: {x.detail}",
                          topic=x.target_topic, partition=x.partition, details=x.details()) for x in plan.problems)
    return (summary, *extra)
