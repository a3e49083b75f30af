"""Fences per sink (issue 47, case 4), property-tested against the true per-sink history.

A simulated pipeline with several transactional sinks written one after the other in each batch:
drivers die between two sinks' commits, upgrades open fresh generations while the old driver lives on
as a zombie whose late commits land at some sinks (a remote target, Delta, Iceberg: the window those
fences cannot close), and restarts plan with ``rules.sink_ahead.sink_plan`` from what the ledger holds
(the positions the current generation's batches moved, every sink's committed ranges). The oracle is
what each sink really holds, offset by offset:

- every plan starts each partition at the lowest offset a sink lacks (the min over the sinks of
  what each holds), and each sink's skip set is exactly what it holds past that start;
- within a batch a sink drops exactly the records it already holds (``held_in_batch``);
- no sink ever holds a record twice, nor misses one: after the last run every sink holds the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from offset_ledger.rules.sink_ahead import SinkCommitRange, held_in_batch, late_commit, sink_plan

T = "t"


@dataclass
class Driver:
    generation: int
    cursor: dict[int, int]
    alive: bool = True
    batch_id: int = 0
    pending: dict[int, tuple[int, int]] | None = None  # a batch it started and did not finish at every sink
    done_at: set[str] = field(default_factory=set)  # sinks that committed the pending batch
    refused_at: set[str] = field(default_factory=set)  # a zombie: sinks whose fence refused its in-flight batch


@dataclass
class World:
    sinks: list[str]
    partitions: list[int]
    positions: dict[int, int]
    commits: list[tuple[int, SinkCommitRange]] = field(default_factory=list)  # (ledger order, range)
    holds: dict[str, list[int]] = field(default_factory=dict)  # per sink, per record: a list of "p:offset"
    skips: dict[int, dict[str, dict[tuple[str, int], int]]] = field(default_factory=dict)  # per generation
    floors: dict[int, int] = field(default_factory=dict)  # per generation: the ledger order when it opened
    generation: int = 1
    sequence: dict[str, int] = field(default_factory=dict)
    started: dict[int, dict[int, int]] = field(default_factory=dict)  # per generation: where it started

    def plan(self):  # type: ignore[no-untyped-def]
        """What a restart plans from what the ledger holds (the job names its sinks, all of which wrote)."""
        return sink_plan(self.ranges(), pipeline="p", sinks=self.sinks, registered=self.sinks,
                         generation_start={(T, p): o for p, o in self.started[self.generation].items()},
                         positions={(T, p): o for p, o in self.positions.items()})

    def held(self, sink: str, partition: int) -> set[int]:
        return {int(x.split(":")[1]) for x in self.holds.get(sink, []) if int(x.split(":")[0]) == partition}

    def ranges(self) -> list[SinkCommitRange]:
        from dataclasses import replace

        return [replace(r, position=self.positions.get(r.partition)) for _, r in self.commits]


def _late(world: World, generation: int, sink: str) -> bool:
    """Whether an older generation committed past the positions at ``sink`` after ``generation`` opened."""
    from dataclasses import replace

    late = [r for order, r in world.commits if order > world.floors[generation] and r.generation < generation]
    return late_commit([replace(r, position=world.positions.get(r.partition)) for r in late], sink) is not None


def _write(world: World, driver: Driver, sink: str, batch: dict[int, tuple[int, int]]) -> bool:
    """One sink's commit of ``driver``'s batch; False when it is refused (the driver dies there)."""
    current = driver.generation == world.generation
    if (current and _late(world, driver.generation, sink)) or (not current and sink in driver.refused_at):
        return False  # a late commit of this sink's from an older generation after this one opened
    reach = world.skips.get(driver.generation, {}).get(sink, {})
    holding = held_in_batch([(T, p, a, b) for p, (a, b) in sorted(batch.items())], reach)
    # The oracle: what it drops is exactly what it holds of the batch.
    dropped = {(p, o) for _, p, a, b in holding.held for o in range(a if a is not None else 0, b)}
    truly = {(p, o) for p, (a, b) in batch.items() for o in range(a, b) if o in world.held(sink, p)}
    assert dropped == truly, (sink, batch, reach, dropped, truly)
    world.sequence[sink] = world.sequence.get(sink, 0) + 1
    for p, (a, b) in batch.items():
        for o in range(a, b):
            if (p, o) not in dropped:
                world.holds.setdefault(sink, []).append(f"{p}:{o}")
        world.commits.append((len(world.commits) + 1, SinkCommitRange(
            sink, world.sequence[sink], driver.generation, driver.batch_id, None, T, p, a, b, None)))
        if current:
            world.positions[p] = max(world.positions.get(p, 0), b)
    return True


def _run_batch(world: World, driver: Driver, sizes: dict[int, int], dies_before: int | None) -> None:
    batch = driver.pending or {p: (driver.cursor[p], driver.cursor[p] + sizes[p]) for p in world.partitions}
    driver.pending = batch
    for i, sink in enumerate(world.sinks):
        if sink in driver.done_at:
            continue  # a re-run on the same checkpoint: the sink committed it (skipped as a re-run)
        if dies_before == i or (driver.generation != world.generation and not _may_commit_late(sink)):
            driver.alive = False
            return
        if not _write(world, driver, sink, batch):
            driver.alive = False
            return
        driver.done_at.add(sink)
    driver.cursor = {p: b for p, (_, b) in batch.items()}
    driver.pending, driver.done_at = None, set()
    driver.batch_id += 1


def _may_commit_late(sink: str) -> bool:
    """Sinks whose fence has a window a zombie can commit through (in the model: every second one)."""
    return sink in ("a", "c")


def _check_plan(world: World) -> dict[int, int]:
    plan = world.plan()
    counted = set(world.sinks)
    starts = {}
    for p in world.partitions:
        truth = {s: world.held(s, p) for s in counted}
        for s, held in truth.items():  # no sink ever has a hole
            assert held == set(range(max(held) + 1)) if held else True, (s, p, sorted(held))
        lowest = min((max(h) + 1 if h else 0 for h in truth.values()), default=world.positions.get(p, 0))
        start = plan.start((T, p))
        start = world.positions.get(p, 0) if start is None else start
        assert start == lowest, (p, start, lowest, world.positions)
        starts[p] = start
    # Each sink skips exactly what it holds past the start.
    for sink, held in plan.skips().items():
        for _, p, a, b in held:
            assert a == starts[p] and set(range(a, b)) <= world.held(sink, p) and b - 1 == max(world.held(sink, p))
    for s in counted:
        for p in world.partitions:
            beyond = {o for o in world.held(s, p) if o >= starts[p]}
            listed = {o for _, q, a, b in plan.skips().get(s, []) if q == p for o in range(a, b)}
            assert beyond == listed, (s, p, beyond, listed)
    return starts


def _open(world: World, starts: dict[int, int], plan_skips: dict[str, list[tuple[str, int, int, int]]]) -> Driver:
    world.generation += 1
    world.started[world.generation] = dict(starts)
    world.floors[world.generation] = len(world.commits)
    world.skips[world.generation] = {s: {(t, p): b for t, p, _, b in held} for s, held in plan_skips.items()}
    world.positions.update(starts)
    return Driver(world.generation, dict(starts))


events = st.lists(st.tuples(st.sampled_from(["batch", "batch", "batch", "zombie", "restart", "upgrade"]),
                            st.dictionaries(st.integers(0, 1), st.integers(0, 4)),
                            st.one_of(st.none(), st.integers(0, 2))), max_size=30)


@settings(max_examples=300, deadline=None)
@given(n_sinks=st.integers(1, 3), n_partitions=st.integers(1, 2), script=events)
def test_every_plan_starts_where_the_sink_furthest_behind_stopped_and_each_sink_skips_what_it_holds(
        n_sinks: int, n_partitions: int, script: list) -> None:  # type: ignore[type-arg]
    world = World(["a", "b", "c"][:n_sinks], list(range(n_partitions)), {p: 0 for p in range(n_partitions)})
    world.floors[1] = 0
    world.started[1] = {p: 0 for p in world.partitions}
    driver = Driver(1, {p: 0 for p in world.partitions})
    zombie: Driver | None = None
    for kind, sizes, crash in script:
        sizes = {p: sizes.get(p, 2) for p in world.partitions}
        if kind == "batch" and driver.alive:
            _run_batch(world, driver, sizes, crash)
        elif kind == "zombie" and zombie is not None and zombie.alive and driver.batch_id == 0 and not driver.done_at:
            # The batch the old driver had in flight when the upgrade opened this generation (it passed its
            # fence before): it lands at the sinks whose fence has that window, before the new driver's first
            # commit there (after it, it would be a duplicate no ledger can stop), and the driver dies on the
            # next fence.
            _run_batch(world, zombie, sizes, crash)
            zombie.alive = False
        elif kind in ("restart", "upgrade"):
            starts = _check_plan(world)
            plan = world.plan()
            if kind == "upgrade" or plan.fresh:
                zombie = driver if driver.alive else None
                if zombie is not None:  # its in-flight batch passed (or failed) its fences as things stood now
                    zombie.refused_at = {s for s in world.sinks if _late(world, zombie.generation, s)}
                driver = _open(world, starts, plan.skips())
            else:
                driver.alive = True  # resumed: Spark re-runs its pending batch on the same checkpoint
    # The last restart, then every driver but the current one stopped and the job runs to the end.
    starts = _check_plan(world)
    plan = world.plan()
    driver = _open(world, starts, plan.skips()) if plan.fresh or not driver.alive else driver
    driver.alive = True
    end = {p: max([world.positions.get(p, 0), *(max(world.held(s, p), default=-1) + 1 for s in world.sinks)])
           for p in world.partitions}
    for _ in range(40):
        if all(driver.cursor[p] >= end[p] + 2 for p in world.partitions) and driver.pending is None:
            break
        _run_batch(world, driver, {p: 3 for p in world.partitions}, None)
        assert driver.alive
    for sink in world.sinks:
        counts: dict[str, int] = {}
        for x in world.holds.get(sink, []):
            counts[x] = counts.get(x, 0) + 1
        assert all(n == 1 for n in counts.values()), (sink, sorted(k for k, n in counts.items() if n > 1))
        for p in world.partitions:
            assert world.held(sink, p) == set(range(driver.cursor[p])), (sink, p)


@settings(max_examples=300, deadline=None)
@given(held=st.dictionaries(st.sampled_from(["a", "b", "c"]),
                            st.lists(st.tuples(st.integers(0, 30), st.integers(1, 6)), max_size=5), max_size=3))
def test_verify_names_exactly_the_offsets_a_sink_lacks_inside_its_span_that_another_sink_holds(
        held: dict[str, list[tuple[int, int]]]) -> None:
    from offset_ledger.rules.sink_ahead import sink_gaps

    spans = {s: [(a, a + n) for a, n in rs] for s, rs in held.items()}
    sets = {s: {o for a, b in rs for o in range(a, b)} for s, rs in spans.items()}
    found: dict[str, set[int]] = {}
    for g in sink_gaps(T, 0, spans):
        assert g.from_offset < g.until_offset
        piece = set(range(g.from_offset, g.until_offset))
        assert not piece & found.get(g.sink, set())  # each offset named once
        found.setdefault(g.sink, set()).update(piece)
        assert set(g.held_by) == {o for o, theirs in sets.items() if o != g.sink and theirs & piece}
    for s, mine in sets.items():
        others = set().union(*(v for o, v in sets.items() if o != s)) if len(sets) > 1 else set()
        inside = {o for o in others if mine and min(mine) <= o < max(mine) + 1} - mine
        assert found.get(s, set()) == inside, (s, spans)


@settings(max_examples=300, deadline=None)
@given(position=st.integers(0, 20), past=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 8),
                                                             st.booleans()), max_size=4))
def test_one_sink_is_planned_exactly_as_sink_ahead_planned_it(position: int,
                                                               past: list[tuple[int, int, bool]]) -> None:
    """One sink that kept up with the positions (its last commit of the current generation ends there), and
    older generations' commits the ledger learned since, some past the position: the plan, its findings
    and its refusals are ``sink_ahead``'s."""
    import pytest

    from offset_ledger.errors import SinkFenced
    from offset_ledger.rules.sink_ahead import sink_ahead

    kept = [SinkCommitRange("s", 1, 2, 0, None, T, 0, max(position - 3, 0), position, position)]
    older = [SinkCommitRange("s", 2 + i, 1, 5 + i, 7, T, 0, None if unknown else start, start + n, position)
             for i, (start, n, unknown) in enumerate(past)]
    try:
        before = sink_ahead([r for r in older if r.until_offset > position], pipeline="p")
    except SinkFenced as refused:
        with pytest.raises(SinkFenced) as again:
            sink_plan([*kept, *older], pipeline="p", sinks=["s"], registered=["s"],
                      generation_start={(T, 0): 0}, positions={(T, 0): position})
        assert str(again.value) == str(refused)
        return
    plan = sink_plan([*kept, *older], pipeline="p", sinks=["s"], registered=["s"],
                     generation_start={(T, 0): 0}, positions={(T, 0): position})
    assert dict(plan.starts) == dict(before.ends) and plan.findings == before.findings and plan.skips() == {}
