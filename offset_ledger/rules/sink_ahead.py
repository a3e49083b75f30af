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

**Fences per sink** (issue 47, case 4). The positions are the pipeline's, but what a sink holds is
its own fact: a driver fenced at sink B after it committed a batch into sink A (or a zombie whose
late commit landed at A only) leaves A ahead of B. ``sink_plan`` therefore judges each sink on its
own commits since the last deliberate start (its *reach* per partition: where its output ends,
behind the positions when it lacks a batch another sink committed, past them when an older
generation's commit it holds tiles from them), and the plan starts each partition at the lowest
reach of the pipeline's sinks: never past a record one of them lacks. A sink then skips, within a
batch, the records it already holds (``held_in_batch``: offsets below its reach), so each sink
receives every record once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

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
    _refuse_unranged(unranged, pipeline)
    by_partition: dict[tuple[str, int], list[SinkCommitRange]] = {}
    for r in ranges:
        if r.position is None or r.until_offset > r.position:
            by_partition.setdefault((r.topic, r.partition), []).append(r)
    ends: dict[tuple[str, int], int] = {}
    moved: list[dict[str, object]] = []
    names: dict[str, None] = {}
    for (topic, partition), found in sorted(by_partition.items()):
        position = found[0].position
        covered = _tile(pipeline, found, names)
        if covered > position:  # type: ignore[operator]
            ends[(topic, partition)] = covered
            moved.append({"topic": topic, "partition": partition, "position": position, "starts_at": covered})
    if not ends:
        return SinkAhead({})
    return SinkAhead(ends, (_ahead_finding(names, moved),))


def _refuse_unranged(unranged: Sequence[str], pipeline: str) -> None:
    if unranged:
        raise SinkFenced(
            f"pipeline {pipeline!r}: {', '.join(unranged)} committed after the current generation opened, and "
            f"the ledger does not know which offsets it read: the plan cannot tell whether its records would be "
            f"written again. Nothing was planned. Find where that batch ended (offset-ledger sinks / the "
            f"target's commit log), reset the pipeline there (offset-ledger reset --to-offsets ... --execute) and "
            f"restart", pipeline=pipeline, commits=list(unranged))


def _tile(pipeline: str, found: Sequence[SinkCommitRange], names: dict[str, None]) -> int:
    """Where the commits ``found`` (one partition's ranges ending past its position) end, when they tile
    from the position without a hole; ``SinkFenced`` otherwise. Names the commits walked into ``names``."""
    topic, partition, position = found[0].topic, found[0].partition, found[0].position
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
    return covered


def _ahead_finding(names: Mapping[str, None], moved: Sequence[Mapping[str, object]]) -> Finding:
    what = "; ".join(names)
    where = ", ".join(f"{m['topic']}[{m['partition']}] {m['position']}->{m['starts_at']}" for m in moved)
    return Finding(
        "sink_ahead",  # type: ignore[arg-type]
        f"the sink's target already holds output of an older generation the positions never counted ({what}): "
        f"the plan starts where it ends ({where}), on a fresh checkpoint, so those records are not written again",
        details={"commits": list(names), "moved": list(moved)})


Partition = tuple[str, int]


@dataclass(frozen=True)
class SinkPlan:
    """Where a plan starts when the pipeline's sinks are judged each on its own commits (``sink_plan``).

    ``starts``: the partitions whose plan is not the ledger's position, and where it starts instead
    (the lowest reach of the sinks). ``reaches``: per sink, where its output ends on each partition it
    committed. ``positions``: the ledger's positions the reaches were judged against.
    """

    starts: Mapping[Partition, int] = field(default_factory=dict)
    reaches: Mapping[str, Mapping[Partition, int]] = field(default_factory=dict)
    positions: Mapping[Partition, int | None] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()

    @property
    def fresh(self) -> bool:
        """Whether the plan needs a fresh checkpoint: it starts elsewhere than the positions, or a sink must
        skip records it holds past the plan (only a new generation's batches are skipped by reach)."""
        return bool(self.starts) or any(self.skips().values())

    def start(self, partition: Partition) -> int | None:
        return self.starts.get(partition, self.positions.get(partition))

    def skips(self) -> dict[str, list[tuple[str, int, int, int]]]:
        """Per sink, the (topic, partition, from, until) it holds past the plan's start: what it skips."""
        out: dict[str, list[tuple[str, int, int, int]]] = {}
        for sink, reach in sorted(self.reaches.items()):
            for (topic, partition), end in sorted(reach.items()):
                start = self.start((topic, partition))
                if start is not None and end > start:
                    out.setdefault(sink, []).append((topic, partition, start, end))
        return out


def sink_plan(ranges: Sequence[SinkCommitRange], *, unranged: Sequence[str] = (), pipeline: str,
              sinks: Collection[str] | None = None, registered: Collection[str] = (),
              generation_start: Mapping[Partition, int] | None = None,
              positions: Mapping[Partition, int] | None = None) -> SinkPlan:
    """Judge each sink on its own commits; the plan starts each partition at the lowest sink's reach.

    ``ranges``: every partition range the sinks committed since the last deliberate start (older
    generations' and the current one's), each with the ledger's position on its partition.
    ``unranged``: commits learned after the current generation opened whose ranges the ledger lacks
    (refused, as ``sink_ahead``). ``sinks``: the sinks the job writes with (None: every sink that
    committed; a sink not named is no longer the pipeline's and holds nothing back).

    A sink's reach on a partition is where its output ends: the end of its last commit there when
    that is not past the position (behind it, when the sink lacks batches another sink committed:
    a driver fenced between two sinks' commits), else the end of its commits past the position when
    they tile from it (``sink_ahead``'s rule, refused as there when they do not). The plan starts at
    the lowest reach: every sink then receives what it lacks, and skips what it holds
    (``held_in_batch``). With one sink, or sinks that agree, this is ``sink_ahead`` exactly.

    A sink the job writes with (named in ``sinks``) that wrote before (``registered``) and holds no
    commit on a partition since the last deliberate start (it died at its first batch of the
    generation, after another sink committed it) reaches where the current generation started
    there (``generation_start``): it lacks what was read since. ``positions``: the ledger's, for
    partitions no commit names.
    """
    _refuse_unranged(unranged, pipeline)
    by_sink: dict[tuple[str, str, int], list[SinkCommitRange]] = {}
    at: dict[Partition, int | None] = dict(positions or {})
    for r in ranges:
        if sinks is not None and r.sink not in sinks:
            continue
        by_sink.setdefault((r.sink, r.topic, r.partition), []).append(r)
        at[(r.topic, r.partition)] = r.position
    positions = at
    reaches: dict[str, dict[Partition, int]] = {}
    names: dict[str, None] = {}
    past_names: dict[Partition, dict[str, None]] = {}
    for (sink, topic, partition), found in sorted(by_sink.items()):
        position = found[0].position
        past = [r for r in found if position is None or r.until_offset > position]
        if past:
            walked: dict[str, None] = {}
            reach = _tile(pipeline, past, walked)
            past_names.setdefault((topic, partition), {}).update(walked)
        else:
            reach = max(r.until_offset for r in found)
        reaches.setdefault(sink, {})[(topic, partition)] = reach
    if sinks is not None and generation_start:
        for sink in sorted({*reaches, *(set(registered) & set(sinks))}):
            mine = reaches.setdefault(sink, {})
            for tp, start in generation_start.items():
                if tp not in mine and positions.get(tp) is not None:
                    mine[tp] = start
    starts: dict[Partition, int] = {}
    for tp, position in sorted(positions.items(), key=lambda kv: kv[0]):
        held = [reach[tp] for reach in reaches.values() if tp in reach]
        if held and min(held) != position:
            starts[tp] = min(held)
    reaches = {sink: reach for sink, reach in reaches.items() if reach}
    plan = SinkPlan(starts, reaches, positions)
    findings: list[Finding] = []
    moved = [{"topic": t, "partition": p, "position": positions[(t, p)], "starts_at": s}
             for (t, p), s in sorted(starts.items())
             if positions[(t, p)] is not None and s > positions[(t, p)]]  # type: ignore[operator]
    if moved:
        for m in moved:
            names.update(past_names.get((str(m["topic"]), int(m["partition"])), {}))  # type: ignore[call-overload]
        findings.append(_ahead_finding(names, moved))
    behind = [(tp, s) for tp, s in sorted(starts.items()) if s < positions[tp]]  # type: ignore[operator]
    skips = plan.skips()
    if behind or skips:
        findings.append(_behind_finding(plan, behind, skips))
    return SinkPlan(starts, reaches, positions, tuple(findings))


def _behind_finding(plan: SinkPlan, behind: Sequence[tuple[Partition, int]],
                    skips: Mapping[str, Sequence[tuple[str, int, int, int]]]) -> Finding:
    differ = {tp for tp, _ in behind} | {(t, p) for held in skips.values() for t, p, _, _ in held}
    stood = "; ".join(
        f"sink {sink!r} " + ", ".join(f"{t}[{p}] {end}" for (t, p), end in sorted(reach.items()) if (t, p) in differ)
        for sink, reach in sorted(plan.reaches.items()) if any(tp in differ for tp in reach))
    where = ", ".join(f"{t}[{p}] {plan.positions[(t, p)]}->{s}" for (t, p), s in behind)
    skipped = "; ".join(f"sink {sink!r} " + ", ".join(f"{t}[{p}] {a}-{b}" for t, p, a, b in held)
                        for sink, held in skips.items())
    moved = (f"the plan starts each partition where the sink furthest behind stopped ({where})" if behind
             else "the plan starts at the positions")
    return Finding(
        "sink_behind",  # type: ignore[arg-type]
        f"the pipeline's sinks stopped at different offsets ({stood}): {moved}, on a fresh checkpoint, "
        f"and a sink skips the records it already holds ({skipped or 'none'}), so each sink receives every "
        f"record once",
        details={"reaches": {sink: {f"{t}:{p}": end for (t, p), end in sorted(reach.items()) if (t, p) in differ}
                             for sink, reach in sorted(plan.reaches.items())},
                 "moved": [{"topic": t, "partition": p, "position": plan.positions[(t, p)], "starts_at": s}
                           for (t, p), s in behind],
                 "skips": {sink: [list(h) for h in held] for sink, held in skips.items()}})


@dataclass(frozen=True)
class BatchHolding:
    """What a sink already holds of the batch it is about to write (``held_in_batch``)."""

    #: (topic, partition, from, until) of the batch's records the sink holds: offsets in [from, until)
    #: (``from`` None: the batch's start is unknown; every offset below ``until`` of the batch)
    held: tuple[tuple[str, int, int | None, int], ...] = ()
    whole: bool = False  # it holds every record of the batch: nothing to write

    def partitions(self) -> str:
        return ", ".join(f"{t}[{p}] {'' if f is None else f}-{u}" for t, p, f, u in self.held)


def held_in_batch(batch: Sequence[tuple[str, int, int | None, int]], reach: Mapping[Partition, int]) -> BatchHolding:
    """The records of ``batch`` ((topic, partition, from, until) per partition) below the sink's ``reach``.

    A sink's output since the last deliberate start is contiguous up to its reach (the plan never
    starts past a record a sink lacks), so the offsets of the batch below it are exactly what the
    sink already holds: it drops them and writes the rest.
    """
    held: list[tuple[str, int, int | None, int]] = []
    whole = True
    for topic, partition, start, until in batch:
        if start is not None and start >= until:
            continue  # nothing read there
        end = reach.get((topic, partition))
        if end is None or (start is not None and end <= start):
            whole = False
            continue
        held.append((topic, partition, start, min(until, end)))
        if end < until:
            whole = False
    return BatchHolding(tuple(held), whole and bool(held))


def _refuse(pipeline: str, r: SinkCommitRange, why: str) -> None:
    raise SinkFenced(
        f"pipeline {pipeline!r}: the target of sink {r.sink!r} holds {r.named()}, which the positions never counted, "
        f"and the plan cannot start where it ends: {why}. Nothing was planned. Stop any driver still running an "
        f"older generation; then reset the pipeline to where the target's output ends (offset-ledger history "
        f"names the batch's ranges; offset-ledger reset --to-offsets ... --execute) and restart: a pending reset "
        f"is applied as given", pipeline=pipeline, sink=r.sink, sequence=r.sequence, table_version=r.table_version,
        topic=r.topic, partition=r.partition)


def late_commit(ranges: Sequence[SinkCommitRange], sink: str | None = None) -> str | None:
    """Why the current generation's next batch may not commit: an older generation committed past the
    positions after this generation opened (None: nothing did).

    A zombie that passed its fence before the restart opened this generation and committed after:
    its records are in the target, and the batch now starting at the positions would write them
    again. The batch is refused; the restart the message asks for moves the plan past that commit.
    ``sink``: only that sink's commits (another sink's late commit is no record this one holds).
    """
    past = [r for r in ranges if (r.position is None or r.until_offset > r.position) and sink in (None, r.sink)]
    if not past:
        return None
    r = min(past, key=lambda r: (r.sequence, r.topic, r.partition))
    return (f"{r.named()} committed {r.topic}[{r.partition}] up to {r.until_offset} after this generation "
            f"opened at {r.position}: a driver of an older generation (a zombie) wrote records this batch would "
            f"write again, so it is not written. Stop the older driver, then restart with "
            f"start_from_ledger(..., sinks=[sink]): the plan starts where that commit ended (a sink_ahead finding)")



@dataclass(frozen=True)
class SinkGap:
    """Offsets of a partition that another sink holds and ``sink`` does not, inside its own output's span."""

    sink: str
    topic: str
    partition: int
    from_offset: int
    until_offset: int
    held_by: tuple[str, ...]

    def message(self) -> str:
        return (f"sink {self.sink!r} lacks {self.topic}[{self.partition}] {self.from_offset}-{self.until_offset} "
                f"({self.until_offset - self.from_offset} records), which {', '.join(repr(s) for s in self.held_by)} "
                f"committed: a plan started past records this sink never received")


def _merged(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def sink_gaps(topic: str, partition: int, held: Mapping[str, Sequence[tuple[int, int]]]) -> list[SinkGap]:
    """Per sink, the stretches of one partition another sink holds and it lacks, inside its own span.

    ``held``: per sink, the [from, until) ranges its commits read there. What lies before a sink's
    first commit or after its last is not counted (a sink added later, or one the job no longer
    writes): only a hole in the middle of what a sink wrote, which the other sinks' output fills,
    says that a plan skipped records for it (issue 47, case 4).
    """
    merged = {sink: _merged(spans) for sink, spans in held.items()}
    out: list[SinkGap] = []
    for sink, mine in sorted(merged.items()):
        others = _merged([r for other, theirs in merged.items() if other != sink for r in theirs])
        for (_, start), (end, _) in zip(mine, mine[1:]):  # the holes inside the sink's own span
            for a, b in others:
                x, y = max(a, start), min(b, end)
                if x < y:
                    by = tuple(sorted(o for o, theirs in merged.items() if o != sink and
                                      any(max(c, x) < min(d, y) for c, d in theirs)))
                    out.append(SinkGap(sink, topic, partition, x, y, by))
    return out
