"""Pure: what a restart's plan requires of the ledger when its generation is written.

A plan is computed once, from what the ledger and the cluster said at planning time, outside the
pipeline lock (the cluster is slow; nobody should wait for it). Its requirements say which of the
ledger's facts the plan rests on, each as the value it read: the pipeline's consumer groups (when
none was named: the plan chose among them), the current generation, the pending resets, the
positions, and each sink's fence (its last committed sequence). The write step reads the ledger
again *under the lock* (``ledger.restart_state.ledger_now``) and writes only when every requirement
still holds; a requirement that fails names what changed, and the restart plans again
(``operate.restart``; ``PlanConflict`` after the last attempt). The same idea as a table format's
commit requirements (assert the current snapshot, the schema id, ...), checked by whoever holds
the lock rather than by the one who planned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Union

from offset_ledger.rules.model import Position


@dataclass(frozen=True)
class LedgerNow:
    """The ledger under the pipeline lock, as far as a plan's requirements name it.

    ``positions_moved``: the (topic, partition, next offset) rows of the planned topics that differ
    from what the plan read, counted by the ledger (``rows_moved`` is the same count, pure).
    ``sink_sequences``: each sink's fence, its last committed sequence (a sink not registered: 0).
    """

    groups: tuple[str, ...] = ()
    generation_id: int | None = None
    generation: int | None = None  # the current generation's number, for the message
    pending_reset_ids: tuple[int, ...] = ()
    positions_moved: int = 0
    sink_sequences: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class GroupsUnchanged:
    """Nobody named the consumer group, so the plan chose it among these: a group added or gone re-plans."""

    groups: tuple[str, ...]

    def failure(self, now: LedgerNow) -> str | None:
        before, after = sorted(self.groups), sorted(now.groups)
        return None if before == after else f"consumer groups {before} -> {after}"


@dataclass(frozen=True)
class GenerationUnchanged:
    """The plan resumes or succeeds this generation (None: the pipeline had none)."""

    generation_id: int | None

    def failure(self, now: LedgerNow) -> str | None:
        if now.generation_id == self.generation_id:
            return None
        return f"another restart opened checkpoint generation {now.generation if now.generation is not None else '?'}"


@dataclass(frozen=True)
class PendingResetsUnchanged:
    """The resets the plan carries (and its generation consumes) are exactly the pending ones."""

    reset_ids: tuple[int, ...]

    def failure(self, now: LedgerNow) -> str | None:
        if tuple(now.pending_reset_ids) == tuple(self.reset_ids):
            return None
        return f"pending resets {list(self.reset_ids)} -> {list(now.pending_reset_ids)}"


@dataclass(frozen=True)
class PositionsUnchanged:
    """The positions the plan started from, on the planned topics: no batch or reset moved one since."""

    topics: tuple[str, ...]
    positions: tuple[Position, ...]  # only rows of ``topics``

    @classmethod
    def of(cls, topics: Iterable[str], seen: Iterable[Position]) -> PositionsUnchanged:
        wanted = tuple(topics)
        keep = set(wanted)
        return cls(wanted, tuple(p for p in seen if p.topic in keep))

    def failure(self, now: LedgerNow) -> str | None:
        moved = now.positions_moved
        return f"{moved} position row(s) moved (a batch or a reset committed)" if moved else None


@dataclass(frozen=True)
class SinkFence:
    """A sink the plan weighed (``rules.sink_ahead.sink_plan``) committed nothing since: its fence is where it was."""

    sink: str
    sequence: int  # its last committed sequence when planned (0: none yet)

    def failure(self, now: LedgerNow) -> str | None:
        seen = int(now.sink_sequences.get(self.sink, 0))
        if seen == self.sequence:
            return None
        return f"sink {self.sink!r} committed sequence {seen} (the plan read {self.sequence})"


Requirement = Union[GroupsUnchanged, GenerationUnchanged, PendingResetsUnchanged, PositionsUnchanged, SinkFence]


def unmet(requirements: Iterable[Requirement], now: LedgerNow) -> list[str]:
    """What changed, one line per requirement that no longer holds, in the requirements' order (empty: write)."""
    return [why for why in (r.failure(now) for r in requirements) if why is not None]


def rows_moved(seen: Iterable[Position], now: Iterable[Position], topics: Sequence[str]) -> int:
    """The rows of ``topics`` that differ between two reads of the positions: a moved row counts twice (its
    old and its new value), one that appeared or vanished once (as ``ledger.position_check`` counts them)."""
    wanted = set(topics)
    return len({p for p in seen if p.topic in wanted} ^ {p for p in now if p.topic in wanted})


def positions_requirement(requirements: Iterable[Requirement]) -> PositionsUnchanged | None:
    """The plan's positions requirement, if it has one (the ledger counts the rows that moved for it)."""
    return next((r for r in requirements if isinstance(r, PositionsUnchanged)), None)


def fenced_sinks(requirements: Iterable[Requirement]) -> tuple[str, ...]:
    """The sinks whose fences the plan requires unchanged."""
    return tuple(r.sink for r in requirements if isinstance(r, SinkFence))
