"""Fences per sink in the ledger (SQLite): what a restart reads of each sink's commits, and what a batch skips.

The real-stack case is ``tests/integration/test_sink_fences.py``; the rule's property test is
``tests/unit/rules/test_sink_fences_property.py``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, update

from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.generations import NewGeneration, create_generation, current_generation
from offset_ledger.ledger.sink_store import planned_reach, sink_commits_in_window
from offset_ledger.ledger.tables import batch_offsets, checkpoint_generations, positions, sink_batches, sinks
from offset_ledger.operate.restart_plan import LedgerView, sink_plan_of
from offset_ledger.rules.model import Position
from offset_ledger.rules.restart_options import GroupRef
from offset_ledger.rules.sink_ahead import SinkCommitRange, sink_plan
from offset_ledger.operate.action_answers import verify_answer

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


class Ledger:
    def __init__(self, path: Path) -> None:
        self.engine = make_engine(f"sqlite:///{path}/ledger.db")
        upgrade(self.engine)
        self.current = 0
        self.sequence: dict[str, int] = {}

    def open(self, reason: str, start: int, findings: Any = (), root: str = "/ck") -> int:
        with self.engine.begin() as conn:
            gen, _ = create_generation(conn, NewGeneration(
                                       pipeline="p", consumer_group="p", checkpoint_root=root, app_version=reason,
                                       reason=reason, starting_offsets={"t": {"0": start}},
                                       resolved_offsets={"t": {"0": start}}, restart_findings=list(findings), now=T0))
        self.current = gen.id
        return gen.id

    def commit(self, sink: str, generation_id: int, batch_id: int, read: tuple[int, int], kind: str = "postgres",
               target: str | None = None) -> None:
        """``sink`` commits batch ``batch_id`` of the generation: its range, and the positions when current."""
        self.sequence[sink] = self.sequence.get(sink, 0) + 1
        query = f"q{generation_id}"
        with self.engine.begin() as conn:
            if conn.execute(select(sinks.c.sink).where(sinks.c.sink == sink)).first() is None:
                conn.execute(insert(sinks).values(sink=sink, pipeline="p", consumer_group="p", kind=kind,
                                                  target=target or sink, last_sequence=0, updated_at=T0))
            conn.execute(insert(sink_batches).values(
                sink=sink, pipeline="p", consumer_group="p", sequence=self.sequence[sink], generation_id=generation_id,
                query_id=query, batch_id=batch_id, target=sink, row_count=read[1] - read[0], committed_at=T0,
                recorded_at=T0))
            conn.execute(update(sinks).where(sinks.c.sink == sink).values(
                last_sequence=self.sequence[sink], generation_id=generation_id, batch_id=batch_id))
            if conn.execute(select(batch_offsets.c.batch_id).where(
                    batch_offsets.c.query_id == query, batch_offsets.c.batch_id == batch_id)).first() is None:
                conn.execute(insert(batch_offsets).values(
                    pipeline="p", consumer_group="p", query_id=query, batch_id=batch_id, source_index=0, topic="t",
                    partition=0, from_offset=read[0], until_offset=read[1], batch_time=T0))
            if generation_id == self.current:
                conn.execute(update(positions).where(positions.c.pipeline == "p", positions.c.next_offset < read[1])
                             .values(next_offset=read[1]))

    def view(self, pending: tuple[int, ...] = ()) -> LedgerView:
        with self.engine.connect() as conn:
            pos = conn.execute(select(positions.c.next_offset).where(positions.c.pipeline == "p")).scalar_one()
            gen = current_generation(conn, "p", "p", offsets=False)
        return LedgerView(GroupRef("p", "p", True), (Position("t", 0, pos),), pending, gen)

    def raw(self) -> list[SinkCommitRange]:
        """Every commit range of every sink, unaggregated: the rule's definition."""
        with self.engine.connect() as conn:
            pos = conn.execute(select(positions.c.next_offset).where(positions.c.pipeline == "p")).scalar_one()
            rows = conn.execute(select(sink_batches.c.sink, sink_batches.c.sequence, sink_batches.c.batch_id,
                                       batch_offsets.c.from_offset, batch_offsets.c.until_offset)
                                .join(batch_offsets, (batch_offsets.c.query_id == sink_batches.c.query_id)
                                      & (batch_offsets.c.batch_id == sink_batches.c.batch_id))).all()
        return [SinkCommitRange(r.sink, r.sequence, 1, r.batch_id, None, "t", 0, r.from_offset, r.until_offset, pos)
                for r in rows]


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    led = Ledger(tmp_path)
    yield led
    led.engine.dispose()


def test_a_driver_fenced_between_two_sinks_plans_from_the_sink_behind_and_the_other_skips(ledger: Ledger) -> None:
    g1 = ledger.open("first", 0)
    for batch, read in enumerate([(0, 10), (10, 20)]):
        for sink in ("p:a", "p:b"):
            ledger.commit(sink, g1, batch, read)
    ledger.commit("p:a", g1, 2, (20, 30))  # then the driver is fenced at p:b

    plan = sink_plan_of(ledger.engine, "p", ledger.view())
    assert plan.starts == {("t", 0): 20} and plan.skips() == {"p:a": [("t", 0, 20, 30)]}
    (finding,) = plan.findings
    assert finding.kind == "sink_behind"
    assert finding.message == (
        "the pipeline's sinks stopped at different offsets (sink 'p:a' t[0] 30; sink 'p:b' t[0] 20): the plan starts "
        "each partition where the sink furthest behind stopped (t[0] 30->20), on a fresh checkpoint, and a sink "
        "skips the records it already holds (sink 'p:a' t[0] 20-30), so each sink receives every record once")
    # The aggregated read is the rule over every range.
    assert sink_plan(ledger.raw(), pipeline="p") == plan
    # A pending reset says where every sink reads: nothing is weighed (as sink_ahead).
    assert sink_plan_of(ledger.engine, "p", ledger.view(pending=(7,))).starts == {}
    # Sinks the job does not write with any more hold nothing back.
    assert sink_plan_of(ledger.engine, "p", ledger.view(), ["p:a"]).starts == {}

    # The restart opens generation 2 there; each sink's batch skips exactly what it holds.
    g2 = ledger.open("sink_ahead", 20, plan.findings)
    with ledger.engine.connect() as conn:
        assert planned_reach(conn, g2, "p:a") == {("t", 0): 30}
        assert planned_reach(conn, g2, "p:b") == {} and planned_reach(conn, g1, "p:a") == {}
    # A weightier reason may open the generation (a clamp, a lost checkpoint): the sinks hold what they hold.
    with ledger.engine.begin() as conn:
        other, _ = create_generation(conn, NewGeneration(pipeline="p2", consumer_group="p2", checkpoint_root="/ck",
                                     app_version="x", reason="data_loss", starting_offsets={"t": {"0": 20}},
                                     resolved_offsets={"t": {"0": 20}}, restart_findings=list(plan.findings), now=T0))
        assert planned_reach(conn, other.id, "p:a") == {("t", 0): 30}
    ledger.commit("p:a", g2, 0, (20, 25))  # skipped whole (no rows), recorded
    ledger.commit("p:b", g2, 0, (20, 25))
    # Dies here. The next restart: p:a still holds 25-30, so it skips them again, and nothing else.
    again = sink_plan_of(ledger.engine, "p", ledger.view())
    assert again.starts == {} and again.skips() == {"p:a": [("t", 0, 25, 30)]} and again.fresh
    ledger.commit("p:a", g2, 1, (25, 35))
    ledger.commit("p:b", g2, 1, (25, 35))
    done = sink_plan_of(ledger.engine, "p", ledger.view())
    assert done.starts == {} and done.skips() == {} and not done.findings and not done.fresh


def test_a_sink_that_died_at_its_first_batch_of_the_generation_holds_the_plan_back_when_named(ledger: Ledger) -> None:
    ledger.open("first", 0)
    g2 = ledger.open("reset", 100)  # a deliberate start: older commits are history
    ledger.commit("p:b", 1, 0, (0, 10))  # p:b wrote before (registered)
    ledger.commit("p:a", g2, 0, (100, 110))  # p:a commits generation 2's batch 0, the driver dies before p:b
    # Named, p:b lacks what generation 2 read; not named, nobody can tell it is still the job's.
    assert sink_plan_of(ledger.engine, "p", ledger.view(), ["p:a", "p:b"]).starts == {("t", 0): 100}
    assert sink_plan_of(ledger.engine, "p", ledger.view()).starts == {}


def test_one_sink_is_planned_as_sink_ahead_plans_it(ledger: Ledger) -> None:
    from offset_ledger.ledger.sink_store import older_commits_ahead
    from offset_ledger.rules.sink_ahead import sink_ahead

    g1 = ledger.open("first", 0)
    ledger.commit("p:a", g1, 0, (0, 10))
    ledger.commit("p:a", g1, 1, (10, 20))
    g2 = ledger.open("app_version", 20)
    ledger.commit("p:a", g1, 2, (20, 30))  # a zombie's late commit
    with ledger.engine.connect() as conn:
        ranges, unranged = sink_commits_in_window(conn, "p", "p")
        old = sink_ahead(*older_commits_ahead(conn, "p", "p")[:1], pipeline="p")
    plan = sink_plan(ranges, unranged=unranged, pipeline="p")
    assert dict(plan.starts) == dict(old.ends) == {("t", 0): 30}
    assert plan.findings == old.findings and plan.skips() == {}
    assert g2 == ledger.current


def test_a_batch_that_cannot_tell_held_records_apart_is_refused_naming_the_sink_and_partitions() -> None:
    from offset_ledger.rules.sink_ahead import held_in_batch
    from offset_ledger.sinks.held import refusal

    part = held_in_batch([("t", 0, 20, 30), ("t", 1, 20, 30)], {("t", 0): 25})
    assert part.held == (("t", 0, 20, 25),) and not part.whole
    why = refusal("p:a", part, ["value"])
    assert why is not None and "sink 'p:a' already holds t[0] 20-25" in why
    assert "no topic, partition, offset column(s)" in why
    assert refusal("p:a", part, ["value", "topic", "partition", "offset"]) is None
    whole = held_in_batch([("t", 0, 20, 25), ("t", 1, 20, 20)], {("t", 0): 25})
    assert whole.whole and refusal("p:a", whole, ["value"]) is None  # nothing to tell apart: all of it is held
    assert held_in_batch([("t", 0, 25, 30)], {("t", 0): 25}).held == ()  # nothing held past the reach


def test_verify_is_not_ok_when_a_sink_lacks_records_another_sink_committed(ledger: Ledger) -> None:
    """The state the old plan left (case 4): generation 2 started past the batch only p:a committed."""
    from offset_ledger.operate.operations import Operations
    from offset_ledger.operate.verifying import verify_pipeline

    def verify() -> Any:
        ops = Operations(ledger.engine)
        try:
            return verify_pipeline(ops, "p")
        finally:
            ops.close()

    g1 = ledger.open("first", 0)
    for sink in ("p:a", "p:b"):
        ledger.commit(sink, g1, 0, (0, 10))
    ledger.commit("p:a", g1, 1, (10, 20))
    clean = verify()
    assert clean.ok and clean.sink_gaps == []  # p:b stopped: nothing after its last commit is judged
    g2 = ledger.open("app_version", 20)
    for sink in ("p:a", "p:b"):
        ledger.commit(sink, g2, 0, (20, 30))
    report = verify()
    assert not report.ok
    (gap,) = report.sink_gaps
    assert (gap.sink, gap.topic, gap.partition, gap.from_offset, gap.until_offset, gap.held_by) == (
        "p:b", "t", 0, 10, 20, ("p:a",))
    doc = verify_answer(report)
    assert doc["summary"]["sinkGaps"] == 1 and doc["summary"]["unexplained"] >= 1
    assert doc["sinkGaps"][0]["message"] == (
        "sink 'p:b' lacks t[0] 10-20 (10 records), which 'p:a' committed: a plan started past records this "
        "sink never received")
    assert [r["kind"] for r in report.table_rows()][-1] == "sink_gap"


def test_a_zombie_that_committed_different_ranges_at_two_sinks_moves_the_plan_to_the_lower_end(
        ledger: Ledger) -> None:
    """Generation 1's zombie: batch 2 (20-25) landed at both remote sinks, batch 3 (25-30) at p:a only."""
    g1 = ledger.open("first", 0)
    for batch, read in enumerate([(0, 10), (10, 20)]):
        for sink in ("p:a", "p:b"):
            ledger.commit(sink, g1, batch, read)
    g2 = ledger.open("app_version", 20)
    for sink in ("p:a", "p:b"):
        ledger.commit(sink, g1, 2, (20, 25))
    ledger.commit("p:a", g1, 3, (25, 30))
    plan = sink_plan_of(ledger.engine, "p", ledger.view())
    assert plan.starts == {("t", 0): 25} and plan.skips() == {"p:a": [("t", 0, 25, 30)]}
    assert [f.kind for f in plan.findings] == ["sink_ahead", "sink_behind"]
    assert "t[0] 20->25" in plan.findings[0].message
    g3 = ledger.open("sink_ahead", 25, plan.findings)
    with ledger.engine.connect() as conn:
        assert planned_reach(conn, g3, "p:a") == {("t", 0): 30} and planned_reach(conn, g3, "p:b") == {}
    for sink in ("p:a", "p:b"):
        ledger.commit(sink, g3, 0, (25, 28))
    # The second restart: p:a still holds 28-30; the plan stays at the positions and only p:a skips.
    again = sink_plan_of(ledger.engine, "p", ledger.view())
    assert again.starts == {} and again.skips() == {"p:a": [("t", 0, 28, 30)]}
    assert [f.kind for f in again.findings] == ["sink_behind"] and g2 < g3


class _Frame:
    """A batch's DataFrame as far as a held batch needs one: its columns; writing it fails the test."""

    def __init__(self, columns: list[str]) -> None:
        self.columns = columns

    @property
    def write(self) -> Any:
        raise AssertionError("a batch the sink holds whole is not written")


def test_a_delta_sink_records_a_batch_it_holds_whole_and_refuses_one_it_cannot_split(
        ledger: Ledger, tmp_path: Path) -> None:
    from offset_ledger.errors import SinkFenced
    from offset_ledger.sinks.delta import DeltaSink

    table = str(tmp_path / "lake")
    g1 = ledger.open("first", 0)
    ledger.commit("p:b", g1, 0, (0, 20))
    ledger.commit("p:d", g1, 0, (0, 20), kind="delta", target=table)
    ledger.commit("p:d", g1, 1, (20, 30), kind="delta", target=table)  # then the driver is fenced at p:b
    plan = sink_plan_of(ledger.engine, "p", ledger.view())
    assert plan.starts == {("t", 0): 20} and plan.skips() == {"p:d": [("t", 0, 20, 30)]}
    g2 = ledger.open("sink_ahead", 20, plan.findings, root=str(tmp_path / "ck"))
    with ledger.engine.connect() as conn:
        location = conn.execute(select(checkpoint_generations.c.location)
                                .where(checkpoint_generations.c.id == g2)).scalar_one()
    ck = Path(location)
    (ck / "offsets").mkdir(parents=True)
    (ck / "metadata").write_text('{"id":"q-2"}')
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}'
    for n, end in enumerate([20, 25, 35]):
        (ck / "offsets" / str(n)).write_text(f'v1\n{meta}\n{{"t":{{"0":{end}}}}}\n')
    sink = DeltaSink(path=table, pipeline="p", dsn=str(ledger.engine.url), name="p:d").bind(location)
    done = sink.write(_Frame(["value"]), 1)  # 20-25: all held, no columns needed
    assert done.verdict == "commit"
    with ledger.engine.connect() as conn:
        row = conn.execute(select(sink_batches.c.row_count, sink_batches.c.table_version)
                           .where(sink_batches.c.sink == "p:d", sink_batches.c.generation_id == g2)).one()
        assert tuple(row) == (0, None)
        assert conn.execute(select(positions.c.next_offset)).scalar_one() == 25
    with pytest.raises(SinkFenced, match=r"sink 'p:d' already holds t\[0\] 25-30 of this batch .* no topic, "
                                         r"partition, offset column"):
        sink.write(_Frame(["value"]), 2)  # 25-35: 25-30 held, 30-35 not
    with ledger.engine.connect() as conn:
        assert conn.execute(select(positions.c.next_offset)).scalar_one() == 25  # nothing recorded


def test_a_zombie_commit_between_plan_and_write_fails_its_sink_fence_though_no_position_moved(ledger: Ledger) -> None:
    """Issue 51: the plan weighs the sinks' commits (``sink_plan_of``); a fenced driver of the old generation
    committing after the plan read them moves no position, and only the sink's fence says the plan is stale."""
    from offset_ledger.ledger.restart_state import ledger_now
    from offset_ledger.operate.restart_plan import ClusterView, PlanInputs, read_ledger
    from offset_ledger.rules.restart_requirements import unmet

    g1 = ledger.open("first", 0)
    ledger.commit("p:a", g1, 0, (0, 10))
    ledger.open("app_version", 10)
    view = read_ledger(ledger.engine, GroupRef("p", "p", True), ["t"])
    assert view.sink_fences == {"p:a": 1}
    inputs = PlanInputs(view, ("t",), view.positions, sink_plan_of(ledger.engine, "p", view), False,
                        ClusterView(("t",), {}, None), ("p:a",))
    requirements = inputs.requirements()

    def changes() -> list[str]:
        with ledger.engine.begin() as conn:
            return unmet(requirements, ledger_now(conn, "p", "p", requirements))

    assert changes() == []
    ledger.commit("p:a", g1, 1, (10, 20))  # the zombie: its generation is not the current one, positions stay
    assert read_ledger(ledger.engine, GroupRef("p", "p", True), ["t"]).positions == view.positions
    assert changes() == ["sink 'p:a' committed sequence 2 (the plan read 1)"]
