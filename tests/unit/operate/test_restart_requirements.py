"""A plan's requirements (``rules.restart_requirements``, built by ``restart_plan.PlanInputs.requirements``):
they all hold iff the ledger state they name did not change between the plan and the write.

The ledger is an in-memory state here (groups, current generation, pending resets, positions, sink
fences); the plan reads one state, the write step sees another, drawn by Hypothesis as any mix of
changes to named and unnamed parts. The real lock-and-read path is tested on SQLite below (a real
``restart`` with a reset landing mid-plan: tests/unit/operate/test_ground_truth_property.py) and on
Postgres in tests/integration/test_restart_requirements.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from offset_ledger.ledger.generations import CheckpointGeneration
from offset_ledger.operate.restart_plan import ClusterView, LedgerView, PlanInputs
from offset_ledger.rules.model import Position
from offset_ledger.rules.restart_options import GroupRef
from offset_ledger.rules.restart_requirements import (
    GenerationUnchanged,
    GroupsUnchanged,
    LedgerNow,
    PendingResetsUnchanged,
    PositionsUnchanged,
    SinkFence,
    rows_moved,
    unmet,
)
from offset_ledger.rules.sink_ahead import SinkPlan

TOPICS = ("a", "b", "c")
PLANNED = ("a", "b")  # the plan's topics; "c" is the pipeline's too, but not in this plan
SINKS = ("s1", "s2", "s3")


@dataclass(frozen=True)
class State:
    """The ledger as far as a restart's plan can rest on it."""

    groups: tuple[str, ...]
    generation: int | None  # the current generation's id (its number is id + 100)
    pending: tuple[int, ...]
    positions: frozenset[Position]
    fences: tuple[tuple[str, int], ...]

    def view(self, named: bool) -> LedgerView:
        gen = None if self.generation is None else CheckpointGeneration(
            self.generation, "p", "p", self.generation + 100, "/ck", f"/ck/gen-{self.generation}", "1", "first",
            datetime(2026, 1, 1, tzinfo=timezone.utc), None)
        return LedgerView(GroupRef("p", "p", named), tuple(sorted(self.positions, key=lambda p: (p.topic, p.partition))),
                          self.pending, gen, {g: {} for g in self.groups}, sink_fences=dict(self.fences))

    def now(self, seen: State) -> LedgerNow:
        """What the write step reads under the lock (``ledger.restart_state.ledger_now``), in memory."""
        return LedgerNow(self.groups, self.generation, None if self.generation is None else self.generation + 100,
                         self.pending, rows_moved(seen.positions, self.positions, PLANNED), dict(self.fences))


positions = st.frozensets(st.builds(Position, st.sampled_from(TOPICS), st.integers(0, 2), st.integers(0, 4)),
                          max_size=6).map(lambda ps: frozenset({(p.topic, p.partition): p for p in ps}.values()))
states = st.builds(
    State,
    groups=st.lists(st.sampled_from(("p", "q", "r")), unique=True, max_size=3).map(lambda g: tuple(sorted(g))),
    generation=st.none() | st.integers(1, 3),
    pending=st.lists(st.integers(1, 4), unique=True, max_size=3).map(lambda r: tuple(sorted(r))),
    positions=positions,
    fences=st.dictionaries(st.sampled_from(SINKS), st.integers(0, 3), max_size=3).map(lambda d: tuple(sorted(d.items()))),
)


def _inputs(state: State, named: bool, sinks: tuple[str, ...] | None) -> PlanInputs:
    ledger = state.view(named)
    return PlanInputs(ledger, PLANNED, ledger.positions, SinkPlan(), False, ClusterView(PLANNED, {}, None), sinks)


@settings(max_examples=500, deadline=None)
@given(before=states, after=states, named=st.booleans(),
       sinks=st.none() | st.lists(st.sampled_from(SINKS), unique=True).map(tuple))
def test_the_requirements_hold_iff_what_they_name_did_not_change(
    before: State, after: State, named: bool, sinks: tuple[str, ...] | None,
) -> None:
    requirements = _inputs(before, named, sinks).requirements()
    failed = unmet(requirements, after.now(before))
    same = (
        (named or before.groups == after.groups)
        and before.generation == after.generation
        and before.pending == after.pending
        and {p for p in before.positions if p.topic in PLANNED} == {p for p in after.positions if p.topic in PLANNED}
        and all(dict(before.fences).get(s, 0) == dict(after.fences).get(s, 0) for s in sinks or ())
    )
    assert (failed == []) == same, (failed, before, after)
    # One line per requirement that fails, in the requirements' order (what PlanConflict reports).
    assert len(failed) == sum(r.failure(after.now(before)) is not None for r in requirements)


@given(state=states, named=st.booleans())
def test_a_state_nothing_touched_meets_every_requirement(state: State, named: bool) -> None:
    assert unmet(_inputs(state, named, SINKS).requirements(), state.now(state)) == []


def test_what_a_plan_requires_and_the_words_for_what_changed() -> None:
    before = State(("p",), 1, (), frozenset({Position("a", 0, 3), Position("c", 0, 1)}), (("s1", 2),))
    requirements = _inputs(before, False, ("s1", "s2")).requirements()
    assert requirements == (
        GroupsUnchanged(("p",)), GenerationUnchanged(1), PendingResetsUnchanged(()),
        PositionsUnchanged(PLANNED, (Position("a", 0, 3),)),  # only the plan's topics
        SinkFence("s1", 2), SinkFence("s2", 0))  # a sink with no fence row yet: 0
    assert not any(isinstance(r, GroupsUnchanged) for r in _inputs(before, True, None).requirements())
    assert not any(isinstance(r, SinkFence) for r in _inputs(before, False, None).requirements())
    after = replace(before, groups=("p", "q"), generation=2, pending=(7,),
                    positions=frozenset({Position("a", 0, 4), Position("c", 0, 9)}), fences=(("s1", 3),))
    assert unmet(requirements, after.now(before)) == [
        "consumer groups ['p'] -> ['p', 'q']",
        "another restart opened checkpoint generation 102",
        "pending resets [] -> [7]",
        "2 position row(s) moved (a batch or a reset committed)",
        "sink 's1' committed sequence 3 (the plan read 2)",
    ]
