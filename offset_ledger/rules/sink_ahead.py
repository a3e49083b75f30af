"""Pure: a sink's target holds output past the ledger's positions; the plan moves past it or is refused.

A restart plans from the ledger's positions, and only the authoritative generation's batches move
them. A sink commit of an *older* generation that the ledger learned after a newer generation
opened never moved them: a driver lost between the target's commit and the ledger's, recorded
later by ``sink.reconcile`` (issue 33 case 3: the Delta txn collision's recovery), or a zombie whose
write beat the upgraded job's first one. Its records are in the target once; a plan from the
positions reads them again and the sink writes them a second time under a new sequence.

So, before planning (no pending reset: a reset says where to read, and a re-read is what it asks
for), each such commit whose ranges end past a position either

- moves the plan to the ends it covers, when its ranges are known and, per partition, tile from
  the position without a hole (the target then holds exactly the records the plan skips, once), or
- refuses the restart (``SinkFenced``) naming the table version / sequence and what to do, when its
  start is unknown, it begins past the position (the records in between were never written), the
  partition has no position, or the commit's ranges are unknown.

Which commits count: those of generations from the last *deliberate start* on (a reset, a clamp
after data loss, a stateful rewind, a first run: positions may then legitimately lie behind older
commits) and older than the current one. The current generation's own commits move the positions
as they are recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from offset_ledger.errors import SinkFenced
from offset_ledger.rules.model import Finding

#: Generation reasons whose starting offsets were chosen, not continued: older commits may lie past them.
DELIBERATE_STARTS = frozenset({"first", "reset", "data_loss", "adopted"})


@dataclass(frozen=True)
class SinkCommitRange:
    """One partition range of a sink commit of an older generation, with the ledger's position there."""

    sink: str
    sequence: int
    generation: int  # the generation's number, as the operator sees it
    batch_id: int
    table_version: int | None
    topic: str
    partition: int
    from_offset: int | None  # None: the batch's start is unknown
    until_offset: int  # exclusive end
    position: int | None  # the ledger's next offset on the partition (None: it has none)

    def named(self) -> str:
        version = f"table version {self.table_version}, " if self.table_version is not None else ""
        return (f"sink {self.sink!r} sequence {self.sequence} ({version}batch {self.batch_id} of generation "
                f"{self.generation})")


def window_start(generations: Sequence[tuple[int, str, bool]], current: int) -> int:
    """The oldest generation number whose commits a plan from generation ``current`` must account for.

    ``generations``: (number, reason, rewound) of each generation; ``rewound``: opened by a stateful
    rewind (its start lies deliberately behind what older generations read).
    """
    start = 1
    for number, reason, rewound in sorted(generations):
        if number <= current and (reason in DELIBERATE_STARTS or rewound):
            start = number
    return start


@dataclass(frozen=True)
class SinkAhead:
    """Where the plan starts instead (exclusive ends the targets hold), and the finding that says so."""

    ends: Mapping[tuple[str, int], int]
    findings: tuple[Finding, ...] = ()


def sink_ahead(ranges: Sequence[SinkCommitRange], *, unranged: Sequence[str] = (), pipeline: str) -> SinkAhead:
    """Move the plan past what sinks' targets already hold, or refuse (``SinkFenced``).

    ``ranges``: the partition ranges of older generations' commits that end past the ledger's
    position (or on a partition without one). ``unranged``: commits (named) the ledger learned
    after the current generation opened whose ranges it does not know.
    """
    if unranged:
        raise SinkFenced(
            f"pipeline {pipeline!r}: {', '.join(unranged)} committed after the current generation opened, and "
            f"the ledger does not know which offsets it read: the plan cannot tell whether its records would be "
            f"written again. Nothing was planned. Find where that batch ended (offset-ledger sinks / the "
            f"target's commit log), reset the pipeline there (offset-ledger reset --to-offsets ... --execute) and "
            f"restart", pipeline=pipeline, commits=list(unranged))
    by_partition: dict[tuple[str, int], list[SinkCommitRange]] = {}
    for r in ranges:
        if r.position is None or r.until_offset > r.position:
            by_partition.setdefault((r.topic, r.partition), []).append(r)
    ends: dict[tuple[str, int], int] = {}
    moved: list[dict[str, object]] = []
    names: dict[str, None] = {}
    for (topic, partition), found in sorted(by_partition.items()):
        position = found[0].position
        if position is None:
            _refuse(pipeline, found[0], f"{topic}[{partition}] has no ledger position to continue from")
        assert position is not None
        covered = position
        for r in sorted(found, key=lambda r: (r.from_offset is None, r.from_offset or 0, r.until_offset)):
            if r.from_offset is None:
                _refuse(pipeline, r, f"its start on {topic}[{partition}] is unknown (it ends at {r.until_offset}, "
                                     f"past the position {position})")
            assert r.from_offset is not None
            if r.from_offset > covered:
                _refuse(pipeline, r, f"it read {topic}[{partition}] {r.from_offset}-{r.until_offset}, but the ledger "
                                     f"stands at {covered}: offsets {covered}-{r.from_offset} are in no commit")
            covered = max(covered, r.until_offset)
            names[r.named()] = None
        if covered > position:
            ends[(topic, partition)] = covered
            moved.append({"topic": topic, "partition": partition, "position": position, "starts_at": covered})
    if not ends:
        return SinkAhead({})
    what = "; ".join(names)
    where = ", ".join(f"{m['topic']}[{m['partition']}] {m['position']}->{m['starts_at']}" for m in moved)
    return SinkAhead(ends, (Finding(
        "sink_ahead",  # type: ignore[arg-type]
        f"the sink's target already holds output of an older generation the positions never counted ({what}): "
        f"the plan starts where it ends ({where}), on a fresh checkpoint, so those records are not written again",
        details={"commits": list(names), "moved": moved}),))


def _refuse(pipeline: str, r: SinkCommitRange, why: str) -> None:
    raise SinkFenced(
        f"pipeline {pipeline!r}: the target of sink {r.sink!r} holds {r.named()}, which the positions never counted, "
        f"and the plan cannot start where it ends: {why}. Nothing was planned. Stop any driver still running an "
        f"older generation; then reset the pipeline to where the target's output ends (offset-ledger history "
        f"names the batch's ranges; offset-ledger reset --to-offsets ... --execute) and restart: a pending reset "
        f"is applied as given", pipeline=pipeline, sink=r.sink, sequence=r.sequence, table_version=r.table_version,
        topic=r.topic, partition=r.partition)


def late_commit(ranges: Sequence[SinkCommitRange]) -> str | None:
    """Why the current generation's next batch may not commit: an older generation committed past the
    positions after this generation opened (None: nothing did).

    A zombie that passed its fence before the restart opened this generation and committed after:
    its records are in the target, and the batch now starting at the positions would write them
    again. The batch is refused; the restart the message asks for moves the plan past that commit.
    """
    past = [r for r in ranges if r.position is None or r.until_offset > r.position]
    if not past:
        return None
    r = min(past, key=lambda r: (r.sequence, r.topic, r.partition))
    return (f"{r.named()} committed {r.topic}[{r.partition}] up to {r.until_offset} after this generation "
            f"opened at {r.position}: a driver of an older generation (a zombie) wrote records this batch would "
            f"write again, so it is not written. Stop the older driver, then restart with "
            f"start_from_ledger(..., sinks=[sink]): the plan starts where that commit ended (a sink_ahead finding)")

