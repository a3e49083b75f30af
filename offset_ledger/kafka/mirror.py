"""Mirror the ledger's positions into a Kafka consumer group, so Kafka tools see Spark pipelines.

The ledger stays the authority; the group is a copy that follows it. A sync reads the pipeline's
positions (what the recorder actually placed: a foreign run's batches move none, a pending reset
is not in effect yet) and the group's committed offsets, decides what to commit (``plan_commits``,
pure), and commits with the group's offset-commit API *without joining the group*. Kafka accepts
such a commit only while the group has no active members; when someone consumes with the group id,
the mirror refuses once, loudly (a log error and a ``mirror_refused`` finding), and never fights.

Epochs: a committed offset carries metadata naming the pipeline, the batch and the ledger epoch
(the pipeline's current checkpoint-generation id, 0 without one). Within an epoch the mirror only
moves a committed offset forward, so a stale sync (another process, a late retry) never undoes a
newer commit; a newer epoch (a reset or restart applied through ``start_from_ledger``) may move it
backwards, exactly as the pipeline itself was moved.

``KafkaMirror`` is the listener's background mirror: the writer thread tells it which pipelines
moved after each ledger commit (a set insert, never I/O), and its own thread syncs them, retrying
with capped backoff while Kafka is unreachable and always catching up with the *latest* positions.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from sqlalchemy.engine import Connection, Engine

from offset_ledger.errors import KafkaError, LedgerError, MirrorRefused, OffsetLedgerError
from offset_ledger.ledger.audit_store import add_findings
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.mirror_reads import mirror_positions
from offset_ledger.rules.model import Finding, TopicPartition

log = logging.getLogger(__name__)

METADATA_TAG = "offset-ledger"
Action = Literal["commit", "in_sync", "behind_newer_commit", "reset_pending"]


@dataclass(frozen=True)
class LedgerPosition:
    """One ledger position as the mirror needs it."""

    next_offset: int
    query_id: str | None = None
    batch_id: int | None = None
    reset_pending: bool = False


@dataclass(frozen=True)
class MirrorDecision:
    """What the mirror does with one partition."""

    tp: TopicPartition
    ledger_offset: int
    committed_offset: int | None
    action: Action


def metadata(pipeline: str, epoch: int, pos: LedgerPosition) -> str:
    """The offset-commit metadata string: who placed the offset (Kafka keeps it beside the offset)."""
    return json.dumps({"by": METADATA_TAG, "pipeline": pipeline, "epoch": epoch, "batchId": pos.batch_id,
                       "queryId": pos.query_id}, separators=(",", ":"))


def epoch_of(meta: str) -> int | None:
    """The ledger epoch in a committed offset's metadata; None when offset-ledger did not commit it."""
    try:
        doc = json.loads(meta)
    except (TypeError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("by") != METADATA_TAG or not isinstance(doc.get("epoch"), int):
        return None
    return int(doc["epoch"])


def plan_commits(
    pipeline: str, epoch: int, ledger: Mapping[TopicPartition, LedgerPosition],
    committed: Mapping[TopicPartition, tuple[int, str]],
) -> tuple[dict[TopicPartition, tuple[int, str]], list[MirrorDecision]]:
    """(offsets to commit with their metadata, a decision per ledger partition). Pure.

    A committed offset only moves backwards when the ledger's epoch is newer than the one that
    committed it (a reset or restart through a fresh checkpoint generation). A position a pending
    reset placed is not where the pipeline reads yet: it is mirrored once a generation applies it.
    """
    commits: dict[TopicPartition, tuple[int, str]] = {}
    decisions: list[MirrorDecision] = []
    for tp in sorted(ledger):
        pos = ledger[tp]
        now = committed.get(tp)
        current = None if now is None else now[0]
        if pos.reset_pending:
            action: Action = "reset_pending"
        elif current == pos.next_offset:
            action = "in_sync"
        elif current is None or pos.next_offset > current:
            action = "commit"
        else:
            committed_epoch = epoch_of(now[1]) if now is not None else None
            action = "commit" if committed_epoch is not None and committed_epoch < epoch else "behind_newer_commit"
        if action == "commit":
            commits[tp] = (pos.next_offset, metadata(pipeline, epoch, pos))
        decisions.append(MirrorDecision(tp, pos.next_offset, current, action))
    return commits, decisions


# -- ledger side --------------------------------------------------------------------------------


def read_ledger(conn: Connection, pipeline: str, group: str) -> tuple[int, dict[TopicPartition, LedgerPosition]]:
    """(epoch, positions) of one pipeline and group, read in one short transaction."""
    epoch, rows = mirror_positions(conn, pipeline, group)
    return epoch, {
        TopicPartition(r.topic, r.partition): LedgerPosition(int(r.next_offset), r.query_id, r.batch_id,
                                                             r.status == "pending")
        for r in rows}


def record_refusal(engine: Engine, pipeline: str, group: str, message: str, members: int) -> None:
    """A ``mirror_refused`` finding in the ledger (best effort: the refusal is logged either way)."""
    try:
        with engine.begin() as conn:
            add_findings(conn, pipeline, group, [Finding("mirror_refused", message,
                                                         details={"members": members, "kafka_group": group})],
                         datetime.now(timezone.utc))
    except Exception as exc:  # noqa: BLE001 - the finding is a courtesy; the log line already says it
        log.warning("offset-ledger: could not store the mirror_refused finding: %s", exc)


@dataclass(frozen=True)
class SyncResult:
    """One sync of a group: the decisions and what Kafka accepted."""

    pipeline: str
    consumer_group: str
    epoch: int
    decisions: tuple[MirrorDecision, ...]
    committed: int


def sync_group(engine: Engine, kafka: Any, pipeline: str, group: str) -> SyncResult:
    """Bring the Kafka group ``group`` to the ledger's positions of (pipeline, group).

    Raises MirrorRefused when the group has active members, KafkaError/KafkaUnavailable and
    LedgerError as they come (callers decide about retries: ``retriable`` says which).
    """
    from sqlalchemy.exc import SQLAlchemyError

    try:
        with engine.connect() as conn:
            epoch, ledger = read_ledger(conn, pipeline, group)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading") from exc
    members = kafka.group_members([group]).get(group, 0)
    if members:
        raise MirrorRefused(group, members)
    committed = kafka.committed_offsets([group]).get(group, {})
    commits, decisions = plan_commits(pipeline, epoch, ledger, committed)
    if commits:
        refused = kafka.commit_group_offsets(group, commits)
        if refused:
            # A member joined between our look and the commit: the broker refused for it.
            raise MirrorRefused(group, max(members, 1), f"the broker answered {sorted(set(refused.values()))}")
    return SyncResult(pipeline, group, epoch, tuple(decisions), len(commits))


# -- the listener's background mirror ------------------------------------------------------------


@dataclass
class MirrorStats:
    """Counters of a KafkaMirror (syncs that committed, retries, refusals)."""

    syncs: int = 0
    commits: int = 0
    retried: int = 0
    refused: int = 0
    last_error: str | None = None
    last_synced_at: datetime | None = None
    refused_groups: set[tuple[str, str]] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        return {"syncs": self.syncs, "commits": self.commits, "retried": self.retried, "refused": self.refused,
                "lastError": self.last_error,
                "lastSyncedAt": self.last_synced_at.isoformat() if self.last_synced_at else None,
                "refusedGroups": sorted(f"{p}/{g}" for p, g in self.refused_groups)}


class KafkaMirror:
    """Follows ledger commits into Kafka consumer groups on its own thread; ``notify`` never blocks."""

    def __init__(self, engine_factory: Callable[[], Engine], kafka_factory: Callable[[], Any], *,
                 initial_backoff: float = 0.2, max_backoff: float = 30.0,
                 on_error: Callable[[str], None] | None = None, autostart: bool = True) -> None:
        self._engine_factory = engine_factory
        self._kafka_factory = kafka_factory
        self._engine: Engine | None = None
        self._kafka: Any = None
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._on_error = on_error
        self._dirty: set[tuple[str, str]] = set()
        self._busy = False
        self._cond = threading.Condition()
        self._closing = False
        self.stats = MirrorStats()
        self._thread = threading.Thread(target=self._run, name="offset-ledger-mirror", daemon=True)
        if autostart:
            self._thread.start()

    def notify(self, moved: Iterable[Any]) -> None:
        """Positions moved (``RecordOutcome.moved``): schedule their groups. A set insert, no I/O."""
        keys = {(m.pipeline, m.consumer_group) for m in moved}
        if not keys:
            return
        with self._cond:
            self._dirty |= keys
            self._cond.notify_all()

    def wait_synced(self, timeout: float = 30.0) -> bool:
        """Wait until every scheduled group is synced (or refused); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._dirty or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def close(self, timeout: float = 5.0) -> None:
        """Try to finish pending syncs within ``timeout``, then stop; the ledger keeps the truth anyway."""
        self.wait_synced(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(max(0.5, timeout))
        if self._kafka is not None:
            try:
                self._kafka.close()
            except Exception:  # noqa: BLE001
                log.debug("closing the mirror's Kafka client failed", exc_info=True)
        if self._engine is not None:
            self._engine.dispose()

    def _run(self) -> None:
        backoff = 0.0
        while True:
            with self._cond:
                if backoff:
                    self._cond.wait(backoff)  # a close() wakes us; new notifies do not shorten a backoff
                while not self._dirty and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                work, self._dirty = self._dirty, set()
                self._busy = True
            failed = self._sync_all(sorted(work))
            with self._cond:
                # Groups that failed go back; a notify that came meanwhile is merged in (latest wins,
                # since a sync always reads the ledger as it is then).
                self._dirty |= failed
                self._busy = False
                self._cond.notify_all()
            backoff = min(max(backoff * 2, self._initial_backoff), self._max_backoff) if failed else 0.0

    def _sync_all(self, work: list[tuple[str, str]]) -> set[tuple[str, str]]:
        failed: set[tuple[str, str]] = set()
        for key in work:
            try:
                if self._engine is None:
                    self._engine = self._engine_factory()
                if self._kafka is None:
                    self._kafka = self._kafka_factory()
                result = sync_group(self._engine, self._kafka, *key)
            except MirrorRefused as exc:
                self._refused(key, exc)
            except OffsetLedgerError as exc:
                self.stats.last_error = exc.message
                if getattr(exc, "retriable", False) or isinstance(exc, (KafkaError, LedgerError)):
                    self.stats.retried += 1
                    failed.add(key)
                    log.warning("offset-ledger mirror: %s/%s not synced yet, retrying: %s", *key, exc.message)
                else:
                    log.error("offset-ledger mirror: %s/%s: %s", *key, exc.message)
            except Exception as exc:  # noqa: BLE001 - the mirror thread must survive anything
                self.stats.last_error = repr(exc)
                self.stats.retried += 1
                failed.add(key)
                log.warning("offset-ledger mirror: %s/%s failed, retrying: %r", *key, exc)
            else:
                self.stats.syncs += 1
                self.stats.commits += result.committed
                self.stats.last_synced_at = datetime.now(timezone.utc)
                self.stats.refused_groups.discard(key)
        return failed

    def _refused(self, key: tuple[str, str], exc: MirrorRefused) -> None:
        self.stats.last_error = exc.message
        if key in self.stats.refused_groups:
            return  # said once; say it again only after the group was free and taken again
        self.stats.refused_groups.add(key)
        self.stats.refused += 1
        log.error("offset-ledger mirror: %s", exc.message)
        if self._engine is not None:
            record_refusal(self._engine, key[0], key[1], exc.message, exc.members)
        if self._on_error is not None:
            try:
                self._on_error(exc.message)
            except Exception:  # noqa: BLE001
                log.debug("mirror error callback failed", exc_info=True)
