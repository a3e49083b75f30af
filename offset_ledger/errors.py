"""The one exception tree of offset-ledger.

::

    OffsetLedgerError                 every error this package raises on purpose
    ├── ConfigError                   a setting or argument is missing or malformed
    ├── InvalidInput                  a user's request is malformed (bad JSON, bad offsets, ...)
    │   ├── UnknownPipeline           no ledger entries for that pipeline
    │   ├── UnknownConsumerGroup      the pipeline has no ledger entries under that consumer group
    │   ├── UnknownTopic              the topic does not exist on the cluster (or the pipeline does not read it)
    │   ├── UnknownPartition          the partition does not exist on the topic
    │   ├── InvalidDuration           a duration is not ISO 8601 (PT30M) nor a number and unit (30m, 10 minutes)
    │   ├── InvalidOffset             an offset is not an integer >= 0 (or -2 earliest / -1 latest)
    │   ├── OffsetOutOfRange          reset targets outside [log-start, log-end] with outOfRange=refuse
    │   ├── CheckpointFormatError     a Spark checkpoint file is missing, corrupt or of an unknown version
    │   ├── AdoptionRefused           importing a checkpoint into a pipeline that already has positions
    │   ├── UnknownBatch              no such batch (or no batch in the time range) to replay
    │   ├── ReplayNotExact            a replayed range has a start the ledger neither recorded nor can recover
    │   ├── FailoverRefused           no safe MirrorMaker 2 translation for a failover (names the partitions)
    │   ├── SinkTargetChanged         a sink name the ledger bound to one target asked to write another
    │   ├── SinkInputRefused          a sink's batch lacks what the sink needs (KafkaSink: the source columns)
    │   └── InvalidRestartOptions     a restart option (first_run, on_data_loss, topics) is malformed
    │       ├── AmbiguousConsumerGroup    no consumer group given and the pipeline has several
    │       └── FirstRunRefused           the ledger knows the pipeline, but not under this group/topics
    ├── ActiveRunConflict             a reset was refused because the pipeline is running
    ├── SinkFenced                    a sink commit from a checkpoint that is no longer the pipeline's authority
    ├── DataLossError                 restart offsets fall outside the broker's log (policy "fail")
    ├── LedgerError                   the ledger database failed
    │   ├── LedgerUnavailable         the ledger cannot be reached or is failing over (retriable)
    │   ├── PlanConflict              the ledger kept changing while a restart planned (retriable)
    │   └── LedgerWithoutSchema       the database has no offset-ledger schema (run db upgrade)
    └── KafkaError                    the Kafka cluster failed
        ├── KafkaUnavailable          the brokers cannot be reached (retriable)
        ├── KafkaAuthenticationFailed the brokers refused the login or the access (SASL, ACLs)
        └── MirrorRefused             the consumer group has active members; the mirror leaves it alone

``exit_code`` maps the tree onto the command line's exit codes (one table, docs/cli.md).

Driver errors (SQLAlchemy, kafka-python) are translated at the adapter edge with ``raise ... from``.
Exceptions carry the data they talk about (``details``, under their Python names), so the API and CLI
can render them without parsing text; how the faces write them (camelCase JSON) is
``offset_ledger.operate.answers.error_answer``'s, not this tree's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class OffsetLedgerError(Exception):
    """Base of every error offset-ledger raises on purpose."""

    #: Whether retrying the same call later may succeed (read by retry loops instead of type lists).
    retriable: bool = False
    #: Whether the command printed its answer before raising (verify's report): the error is then only
    #: the exit code and a line on stderr, not a second answer (the CLI's ``-f json`` error body).
    after_answer: bool = False

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details


class ConfigError(OffsetLedgerError):
    """A setting or argument is missing or malformed."""


class InvalidInput(OffsetLedgerError):
    """A user's request is malformed; nothing was written."""


def name_list(kind: str, wanted: str, known: Sequence[str], limit: int = 10) -> str:
    """``(did you mean 'orders'? pipelines: a, b, ...)``: what does exist, so a typo is seen at once."""
    if not known:
        return f"(the ledger has no {kind})"
    import difflib

    close = difflib.get_close_matches(wanted, known, n=1)
    shown = ", ".join(known[:limit]) + (f", ... {len(known) - limit} more" if len(known) > limit else "")
    return f"({f'did you mean {close[0]!r}? ' if close else ''}{kind}: {shown})"


class UnknownPipeline(InvalidInput):
    """The ledger has no entries for this pipeline."""

    def __init__(self, pipeline: str, known: Sequence[str] | None = None) -> None:
        where = "" if known is None else " " + name_list("pipelines", pipeline, known)
        super().__init__(f"unknown pipeline {pipeline!r}{where}", pipeline=pipeline,
                         **({} if known is None else {"known": list(known)}))
        self.pipeline = pipeline


class UnknownConsumerGroup(InvalidInput):
    """The pipeline exists, but the ledger has nothing of it under this consumer group."""

    def __init__(self, pipeline: str, consumer_group: str, known: Sequence[str]) -> None:
        super().__init__(f"consumer group {consumer_group!r} is not used by pipeline {pipeline!r} "
                         f"{name_list('groups', consumer_group, known)}",
                         pipeline=pipeline, consumer_group=consumer_group, known=list(known))
        self.pipeline = pipeline
        self.consumer_group = consumer_group


class UnknownTopic(InvalidInput):
    """The topic does not exist on the Kafka cluster."""

    def __init__(self, topic: str, pipeline: str | None = None, known: Sequence[str] | None = None) -> None:
        # With a pipeline: the topic is not one the pipeline reads (it may well exist on the cluster).
        if pipeline is None:
            message, details = f"unknown topic {topic!r}", {}
        else:
            message = f"topic {topic!r} is not read by pipeline {pipeline!r} {name_list('topics', topic, known or [])}"
            details = {"pipeline": pipeline, "known": list(known or [])}
        super().__init__(message, topic=topic, **details)
        self.topic = topic


class UnknownPartition(InvalidInput):
    """The partition does not exist on the topic."""

    def __init__(self, topic: str, partition: int, existing: Sequence[int] | None = None) -> None:
        # Naming the partitions that exist makes "orders:9" for "orders:0" a typo seen at once.
        where = "" if existing is None else (
            f" (partitions: {_ranges(sorted(existing))})" if existing else " (it has no partitions)")
        super().__init__(f"unknown partition {partition} of topic {topic!r}{where}", topic=topic, partition=partition,
                         **({} if existing is None else {"known": sorted(existing)}))
        self.topic = topic
        self.partition = partition


def _ranges(numbers: Sequence[int]) -> str:
    """``0-11, 14``: a topic of 200 partitions is one short line (runs of four or more collapse)."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 3 else ", ".join(map(str, r)) for r in runs)


class InvalidDuration(InvalidInput):
    """A duration (an option, variable or API field) is not in the one grammar (``rules.durations``)."""

    def __init__(self, text: str, name: str = "duration", reason: str | None = None) -> None:
        shown = text if len(text) <= 60 else text[:57] + "..."
        why = reason or ("use ISO 8601 (PT30M, P30D) or a number and unit (30m, 10min, 10 minutes, 12h, 30d)")
        super().__init__(f"invalid {name} {shown!r}: {why}", duration=shown, option=name)
        self.text = text
        self.name = name


class InvalidOffset(InvalidInput):
    """An offset is not an integer >= 0, nor -2 (earliest) or -1 (latest)."""

    def __init__(self, topic: str, partition: int | str, value: Any) -> None:
        super().__init__(
            f"invalid offset {value!r} for {topic}:{partition}: use an integer >= 0, -2 (earliest) or -1 (latest)",
            topic=topic, partition=partition, value=value if isinstance(value, (int, str)) else repr(value),
        )
        self.topic = topic
        self.partition = partition
        self.value = value


class OffsetOutOfRange(InvalidInput):
    """Reset targets fall outside [log-start, log-end] and the out-of-range policy is ``refuse``."""

    def __init__(self, out_of_range: Sequence[Mapping[str, Any]]) -> None:
        names = ", ".join(f"{x['topic']}:{x['partition']}" for x in out_of_range)
        super().__init__(
            f"reset targets outside the log for {names}; use --out-of-range clamp (API: outOfRange) to clamp them",
            out_of_range=[dict(x) for x in out_of_range],
        )
        self.out_of_range = [dict(x) for x in out_of_range]


class CheckpointFormatError(InvalidInput):
    """A Spark checkpoint file is missing, corrupt or of a format version this package does not read."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"checkpoint file {path}: {reason}", path=path, reason=reason)
        self.path = path
        self.reason = reason


class AdoptionRefused(InvalidInput):
    """A checkpoint import was refused: the pipeline's consumer group already has positions or generations."""

    def __init__(self, pipeline: str, consumer_group: str, footprint: Mapping[str, Any]) -> None:
        super().__init__(
            f"pipeline {pipeline!r} (consumer group {consumer_group!r}) already has "
            f"{len(footprint.get('topics', []))} topic(s) with positions and {footprint.get('generations', 0)} "
            f"checkpoint generation(s) in the ledger; importing a checkpoint would replace them. Pass --force "
            f"to make the checkpoint the pipeline's authority anyway",
            pipeline=pipeline, consumer_group=consumer_group, ledger=dict(footprint))


class UnknownBatch(InvalidInput):
    """No recorded batch matches: an unknown batch id, query or generation, or an empty time range."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message, **details)


class ReplayNotExact(InvalidInput):
    """A replay would not be exact: a range's start was never recorded and the ledger cannot recover it."""

    def __init__(self, message: str, *, unknown_starts: Sequence[Mapping[str, Any]], **details: Any) -> None:
        super().__init__(message, unknown_starts=[dict(x) for x in unknown_starts], **details)
        self.unknown_starts = [dict(x) for x in unknown_starts]


class FailoverRefused(InvalidInput):
    """A failover has no safe MirrorMaker 2 translation (partitions uncheckpointed, topics missing, ...)."""


class SinkTargetChanged(InvalidInput):
    """A sink name is bound to the target of its first write; a sink of that name writing elsewhere is refused."""


class SinkInputRefused(InvalidInput):
    """A sink cannot write the batch as given (``KafkaSink``: no source ``topic``/``partition``/``offset``); nothing
    was written."""


class InvalidRestartOptions(InvalidInput):
    """A restart option (first_run, on_data_loss, topics, explicit offsets) is malformed."""


class StatefulRestartRefused(InvalidRestartOptions):
    """A windowed (stateful) restart cannot be computed exactly from what the ledger holds."""

    def __init__(self, message: str, pipeline: str, **details: Any) -> None:
        super().__init__(message, pipeline=pipeline, **details)
        self.pipeline = pipeline


class AmbiguousConsumerGroup(InvalidRestartOptions):
    """No consumer group was named and the ledger has several for the pipeline."""

    def __init__(self, pipeline: str, groups: Sequence[str]) -> None:
        super().__init__(
            f"pipeline {pipeline!r} has several consumer groups in the ledger ({', '.join(groups)}); "
            f"name one with --consumer-group",
            pipeline=pipeline, consumer_groups=list(groups))
        self.groups = list(groups)


class FirstRunRefused(InvalidRestartOptions):
    """The ledger has history for the pipeline, but no position for this consumer group and these topics."""

    def __init__(self, pipeline: str, consumer_group: str, topics: Sequence[str],
                 footprint: Mapping[str, Mapping[str, Any]]) -> None:
        known = "; ".join(
            f"consumer group {g!r}: " + ", ".join(
                part for part in (
                    f"positions on {', '.join(f['topics'])}" if f.get("topics") else "",
                    f"{f['batches']} batches" if f.get("batches") else "",
                    f"{f['runs']} runs" if f.get("runs") else "",
                    f"{f['generations']} checkpoint generations" if f.get("generations") else "",
                ) if part)
            for g, f in sorted(footprint.items()))
        super().__init__(
            f"pipeline {pipeline!r} is in the ledger ({known}) but has no position under consumer group "
            f"{consumer_group!r} for topics {', '.join(topics)}: starting it as a first run would re-read or "
            f"skip records. Name the consumer group it ran under, or give --first-run ... with "
            f"--allow-first-run to start over on purpose",
            pipeline=pipeline, consumer_group=consumer_group, topics=list(topics),
            ledger={g: dict(f) for g, f in footprint.items()})
        self.footprint = {g: dict(f) for g, f in footprint.items()}


class ActiveRunConflict(OffsetLedgerError):
    """A reset was refused because the pipeline has an active run (use force to override)."""

    def __init__(self, pipeline: str, run_ids: Sequence[str], evidence: str | None = None) -> None:
        # ``evidence``: the pipelines list's state reason ("running: last event 12 s ago from run 0374a913 ...").
        said = f" ({evidence})" if evidence else ""
        super().__init__(
            f"pipeline {pipeline!r} has an active run ({', '.join(run_ids)}){said}; stop it first or force the reset",
            pipeline=pipeline, run_ids=list(run_ids), **({"evidence": evidence} if evidence else {}),
        )
        self.pipeline = pipeline
        self.run_ids = list(run_ids)
        self.evidence = evidence


class SinkFenced(OffsetLedgerError):
    """A transactional sink refused a batch: its checkpoint generation is no longer the pipeline's current one."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message, **details)


class DataLossError(OffsetLedgerError):
    """Restart offsets fall outside the broker's log and the policy is ``fail``."""

    def __init__(self, message: str, lost: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(message, lost=[dict(x) for x in lost])
        self.lost = [dict(x) for x in lost]


class HistoryUnverified(OffsetLedgerError):
    """``verify`` found stretches of the recorded history (gaps, overlaps) that nothing explains."""

    after_answer = True


class LedgerError(OffsetLedgerError):
    """The ledger database failed."""


class LedgerUnavailable(LedgerError):
    """The ledger database cannot be reached, or cannot take the write right now (failover, shutdown, busy)."""

    retriable = True


class LedgerWithoutSchema(LedgerError):
    """The database is reachable but has no offset-ledger schema: ``offset-ledger db upgrade`` creates it."""


class KafkaError(OffsetLedgerError):
    """The Kafka cluster failed or refused a request."""


class KafkaUnavailable(KafkaError):
    """The Kafka brokers cannot be reached."""

    retriable = True


class KafkaAuthenticationFailed(KafkaError):
    """The brokers refused the client's credentials (SASL) or its access (ACLs)."""


class MirrorRefused(KafkaError):
    """The consumer group has active members (someone consumes with it); the mirror does not touch it."""

    def __init__(self, group: str, members: int, detail: str = "") -> None:
        super().__init__(
            f"consumer group {group!r} has {members} active member(s); offset-ledger does not commit offsets "
            f"for a group someone else consumes with{': ' + detail if detail else ''}",
            consumer_group=group, members=members)
        self.group = group
        self.members = members


class PlanConflict(LedgerError):
    """A restart's plan went stale on every attempt: positions, resets or generations changed meanwhile."""

    retriable = True

    def __init__(self, pipeline: str, attempts: int, changed: Sequence[str]) -> None:
        super().__init__(
            f"the ledger of pipeline {pipeline!r} changed while the restart was planning, {attempts} times in a row "
            f"({'; '.join(changed)}); nothing was written. Is the old job still running? Stop it, or retry",
            pipeline=pipeline, attempts=attempts, changed=list(changed))


def install_hint(extra: str) -> str:
    """How to add an optional extra. No release is published: from the checkout this package runs from
    (an editable or source install), else from a checkout of the repository."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    where = str(root) if (root / "pyproject.toml").is_file() else "/path/to/offset-ledger-checkout"
    return f"pip install '{where}[{extra}]'"


# -- exit codes ----------------------------------------------------------------------------

EXIT_OK = 0
EXIT_INTERNAL = 1     # a bug, or a failure nothing more specific describes
EXIT_USAGE = 2        # bad arguments or input; nothing was written
EXIT_REFUSED = 3      # understood, but refused: active run, targets out of range, group in use, ...
EXIT_DATA_LOSS = 4    # offsets fall outside the broker's log and the policy is fail
EXIT_UNAVAILABLE = 5  # the ledger database or Kafka cannot be reached, or refused the login
EXIT_UNVERIFIED = 6   # verify: the history has gaps or overlaps nothing explains (the report says which)

_EXIT_CODES: tuple[tuple[type[OffsetLedgerError], int], ...] = (
    # Most specific first: refusals are InvalidInput subclasses, so they come before it.
    (OffsetOutOfRange, EXIT_REFUSED),
    (AdoptionRefused, EXIT_REFUSED),
    (FailoverRefused, EXIT_REFUSED),
    (SinkTargetChanged, EXIT_REFUSED),
    (FirstRunRefused, EXIT_REFUSED),
    (StatefulRestartRefused, EXIT_REFUSED),
    (ActiveRunConflict, EXIT_REFUSED),
    (PlanConflict, EXIT_REFUSED),
    (MirrorRefused, EXIT_REFUSED),
    (SinkFenced, EXIT_REFUSED),
    (DataLossError, EXIT_DATA_LOSS),
    (HistoryUnverified, EXIT_UNVERIFIED),
    (LedgerUnavailable, EXIT_UNAVAILABLE),
    (KafkaUnavailable, EXIT_UNAVAILABLE),
    (KafkaAuthenticationFailed, EXIT_UNAVAILABLE),
    (InvalidInput, EXIT_USAGE),
    (ConfigError, EXIT_USAGE),
    (LedgerWithoutSchema, EXIT_USAGE),
)


def exit_code(exc: BaseException) -> int:
    """The command line's exit code for ``exc`` (docs/cli.md has the table)."""
    for kind, code in _EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return EXIT_INTERNAL
