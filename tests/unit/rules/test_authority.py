"""Authority: which run moves positions. Pure rules, then the recorder, generations and resets on SQLite."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.engine import Engine

from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.ledger.reset_store import record_reset
from offset_ledger.ledger.tables import batch_offsets, findings, positions
from offset_ledger.rules.authority import GenerationRef, PositionState, decide, match_generation, same_location
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress, TopicPartition, Watermarks
from offset_ledger.rules.resets import ResetRequest, plan_reset

T0 = datetime(2026, 11, 23, 9, 0, tzinfo=timezone.utc)


# ----------------------------------------------------------------------------- pure rules


@pytest.mark.parametrize("recorded, handed_out, same", [
    ("file:/ckpt/orders/gen-2-ab12cd34", "/ckpt/orders/gen-2-ab12cd34", True),
    ("file:///ckpt/orders/gen-2-ab12cd34/", "/ckpt/orders/gen-2-ab12cd34", True),
    ("s3a://bucket/cp/gen-1-0011aabb", "s3a://bucket/cp/gen-1-0011aabb", True),
    ("hdfs://nn:8020/cp/gen-1-0011aabb", "hdfs:///cp/gen-1-0011aabb", True),   # same unique directory
    ("file:/ckpt/orders/gen-1-ab12cd34", "/ckpt/orders/gen-2-ab12cd34", False),
    ("file:/ckpt/copy-of-gen-2", "/ckpt/orders/gen-2-ab12cd34", False),
    (None, "/ckpt/orders/gen-2-ab12cd34", False),
])
def test_same_location(recorded: str | None, handed_out: str, same: bool) -> None:
    assert same_location(recorded, handed_out) is same


def test_match_generation_by_location_then_by_claim() -> None:
    g1 = GenerationRef(1, "/c/gen-1-00000001", "q1")
    g2 = GenerationRef(2, "/c/gen-2-00000002", None)
    assert match_generation([g1, g2], checkpoint_location="file:/c/gen-1-00000001", query_id="qx",
                            query_seen_before=True) == g1
    assert match_generation([g1, g2], checkpoint_location="/elsewhere", query_id="q1",
                            query_seen_before=True) is None
    # Unknown location (Spark Connect): the query's own claim, else the newest unclaimed for a new query.
    assert match_generation([g1, g2], checkpoint_location=None, query_id="q1", query_seen_before=True) == g1
    assert match_generation([g1, g2], checkpoint_location=None, query_id="q9", query_seen_before=False) == g2
    # An old query restarted on some checkpoint never claims the new generation.
    assert match_generation([g1, g2], checkpoint_location=None, query_id="q0", query_seen_before=True) is None


def _pos(next_offset: int, query: str | None = "q1", pending: bool = False) -> PositionState:
    return PositionState(next_offset, query, T0, pending)


def test_decide() -> None:
    common = {"query_id": "q1", "run_started_at": T0 + timedelta(minutes=1)}
    assert decide(_pos(10), 12, run_generation_id=2, current_generation_id=2, **common) == "move"
    assert decide(_pos(10), 8, run_generation_id=2, current_generation_id=2, **common) == "regression"
    assert decide(_pos(10), 12, run_generation_id=1, current_generation_id=2, **common) == "foreign_run"
    assert decide(None, 12, run_generation_id=None, current_generation_id=2, **common) == "foreign_run"
    # A pending reset is applied only through a fresh generation, whenever the run started.
    assert decide(_pos(3, None, True), 12, run_generation_id=2, current_generation_id=2, **common) == "pending_reset"
    # Without generations: a run started after the reset may move it (the legacy rule) ...
    assert decide(_pos(3, None, True), 12, run_generation_id=None, current_generation_id=None, **common) == "move"
    # ... and two active queries on one partition are told apart.
    assert decide(_pos(10, "q0"), 12, run_generation_id=None, current_generation_id=None,
                  other_query_active=True, **common) == "shared_position"
    assert decide(_pos(10, "q0"), 12, run_generation_id=None, current_generation_id=None,
                  other_query_active=False, **common) == "move"


# ----------------------------------------------------------------------------- on SQLite


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(eng)
    yield eng
    eng.dispose()


class Ledger:
    """Drives the real recorder, generations and reset store the way the listener and helpers do."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.recorder = Recorder(engine)
        self.clock = itertools.count(1)
        self.ids = itertools.count(1)

    def now(self) -> datetime:
        return T0 + timedelta(seconds=next(self.clock))

    def generation(self, resolved: dict[int, int], consume: list[int] = ()) -> gens.CheckpointGeneration:
        with self.engine.begin() as conn:
            gen, _ = gens.create_generation(conn, gens.NewGeneration(
                pipeline="p", consumer_group="p", checkpoint_root="/ckpt", app_version="1", reason="test",
                starting_offsets={"t": {str(k): v for k, v in resolved.items()}},
                resolved_offsets={"t": {str(k): v for k, v in resolved.items()}},
                consume_reset_ids=list(consume), now=self.now()))
        return gen

    def start(self, query: str, location: str | None) -> str:
        run = f"run-{next(self.ids)}"
        self.recorder.record([RunStart("p", "p", query, run, "p", self.now(), checkpoint_location=location)])
        return run

    def batch(self, query: str, run: str, batch_id: int, ranges: dict[int, tuple[int | None, int]]) -> None:
        parts = tuple(PartitionRange("t", p, f, u) for p, (f, u) in sorted(ranges.items()))
        b = BatchOffsets(query, run, "p", batch_id, self.now(), 0, (SourceProgress(0, "KafkaV2", parts, 0),))
        self.recorder.record([BatchRecord("p", "p", b)])

    def reset(self, targets: dict[int, int]) -> int:
        request = ResetRequest("offsets", offsets={TopicPartition("t", p): o for p, o in targets.items()})
        marks = {TopicPartition("t", p): Watermarks(0, 10**9) for p in range(3)}
        _plan, stored = record_reset(self.engine, lambda pos: plan_reset(request, pos, marks), pipeline="p",
                                     consumer_group="p", actor="test", reason="t", dry_run=False, force=True)
        return stored.reset_id

    def positions(self) -> dict[int, int]:
        with self.engine.connect() as conn:
            return {r.partition: r.next_offset for r in conn.execute(select(positions))}

    def findings(self, kind: str) -> list:
        with self.engine.connect() as conn:
            return list(conn.execute(select(findings).where(findings.c.kind == kind)))


def test_old_generation_run_after_a_reset_is_foreign_and_keeps_the_reset(engine: Engine) -> None:
    ledger = Ledger(engine)
    g1 = ledger.generation({0: 0, 1: 0})
    run1 = ledger.start("q1", "file:" + g1.location)
    ledger.batch("q1", run1, 0, {0: (None, 100), 1: (None, 100)})
    assert ledger.positions() == {0: 100, 1: 100}
    ledger.reset({0: 40, 1: 40})
    # The job restarts on its old checkpoint without the helper: same query, a new run.
    run2 = ledger.start("q1", "file:" + g1.location)
    ledger.batch("q1", run2, 1, {0: (100, 150), 1: (100, 150)})
    assert ledger.positions() == {0: 40, 1: 40}  # the reset stays: a pending reset waits for a fresh generation
    assert len(ledger.findings("pending_reset")) == 2
    # The restart through the helper consumes it; the old checkpoint's runs are foreign from now on.
    g2 = ledger.generation({0: 40, 1: 40})
    ledger.batch("q1", run2, 2, {0: (150, 180), 1: (150, 180)})
    assert ledger.positions() == {0: 40, 1: 40}
    foreign = ledger.findings("foreign_run")
    assert len(foreign) == 1 and foreign[0].run_id == run2 and foreign[0].generation_id == g2.id
    ledger.batch("q1", run2, 3, {0: (180, 190), 1: (180, 190)})
    assert len(ledger.findings("foreign_run")) == 1  # once per run and generation
    run3 = ledger.start("q2", g2.location)
    ledger.batch("q2", run3, 0, {0: (None, 60), 1: (None, 70)})
    assert ledger.positions() == {0: 60, 1: 70}
    with engine.connect() as conn:  # the fresh checkpoint's first batch starts where the generation did
        rows = conn.execute(select(batch_offsets.c.from_offset).where(batch_offsets.c.query_id == "q2")).all()
    assert sorted(r.from_offset for r in rows) == [40, 40]


def test_baseline_lowers_positions_for_a_recreated_topic(engine: Engine) -> None:
    ledger = Ledger(engine)
    g1 = ledger.generation({0: 0})
    run = ledger.start("q1", g1.location)
    ledger.batch("q1", run, 0, {0: (0, 1000)})
    g2 = ledger.generation({0: 0})  # the topic came back empty: the restart clamped to its log-start
    assert ledger.positions() == {0: 0}
    run2 = ledger.start("q2", g2.location)
    ledger.batch("q2", run2, 0, {0: (None, 50)})
    assert ledger.positions() == {0: 50}
    assert not ledger.findings("regression")


def test_unknown_location_claims_the_new_generation_once(engine: Engine) -> None:
    ledger = Ledger(engine)
    ledger.generation({0: 0})
    run = ledger.start("q1", None)  # Spark Connect: no checkpoint location on the client
    ledger.batch("q1", run, 0, {0: (None, 10)})
    intruder = ledger.start("q9", None)  # a second new query cannot claim the same generation
    ledger.batch("q9", intruder, 0, {0: (None, 99)})
    assert ledger.positions() == {0: 10}
    assert [f.run_id for f in ledger.findings("foreign_run")] == [intruder]


_OPS = st.lists(st.one_of(
    st.tuples(st.just("batch"), st.integers(0, 2), st.integers(0, 40)),    # a run of the current generation
    st.tuples(st.just("foreign"), st.integers(0, 2), st.integers(0, 400)),  # an older run keeps going
    st.tuples(st.just("reset"), st.integers(0, 2), st.integers(0, 300)),
    st.tuples(st.just("restart"), st.just(0), st.just(0)),
    st.tuples(st.just("old_checkpoint"), st.just(0), st.just(0)),          # restarted on an old generation
), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_positions_are_what_the_current_generation_committed(tmp_path: Path, ops: list) -> None:
    """Any interleaving of current and foreign batches, resets and restarts: positions equal the model."""
    eng = make_engine(f"sqlite:///{tmp_path / f'p{next(_DB)}.db'}")
    ensure_schema(eng)
    try:
        ledger = Ledger(eng)
        model = {0: 0, 1: 0, 2: 0}
        pending: list[int] = []
        pinned: set[int] = set()  # partitions a pending reset placed
        gen = ledger.generation(model)
        generations = [gen]
        queries = itertools.count(1)
        current = {"query": f"q{next(queries)}", "batch": 0, "read": dict(model)}
        current["run"] = ledger.start(current["query"], gen.location)
        others: list[dict] = []
        for op, partition, amount in ops:
            if op == "batch":
                read = current["read"]
                start, read[partition] = read[partition], read[partition] + amount
                ledger.batch(current["query"], current["run"], current["batch"], {partition: (start, read[partition])})
                current["batch"] += 1
                if partition not in pinned:
                    model[partition] = max(model[partition], read[partition])
            elif op == "foreign" and others:
                run = others[amount % len(others)]
                run["read"] += amount
                ledger.batch(run["query"], run["run"], run["batch"], {partition: (None, run["read"])})
                run["batch"] += 1
            elif op == "reset":
                pending.append(ledger.reset({partition: amount}))
                pinned.add(partition)
                model[partition] = amount
            elif op == "restart":
                gen = ledger.generation(model, consume=pending)
                generations.append(gen)
                pending, pinned = [], set()
                others.append({"query": current["query"], "run": current["run"], "batch": current["batch"] + 100,
                               "read": 0})
                current = {"query": f"q{next(queries)}", "batch": 0, "read": dict(model)}
                current["run"] = ledger.start(current["query"], gen.location)
            elif op == "old_checkpoint" and len(generations) > 1:
                old = generations[0]
                run = {"query": f"old-{next(queries)}", "batch": 0, "read": 0}
                run["run"] = ledger.start(run["query"], "file:" + old.location)
                others.append(run)
            assert ledger.positions() == model, (op, partition, amount)
    finally:
        eng.dispose()


_DB = itertools.count()


def test_concurrent_shifts_on_sqlite_apply_one_after_the_other(engine: Engine) -> None:
    """The reset plan is made under the pipeline lock: no lost update, a chained audit trail."""
    import threading

    ledger = Ledger(engine)
    ledger.generation({0: 1000})
    request = ResetRequest("shift", shift_by=-10)
    marks = {TopicPartition("t", 0): Watermarks(0, 2000)}
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def shift() -> None:
        try:
            barrier.wait()
            record_reset(engine, lambda pos: plan_reset(request, pos, marks), pipeline="p", consumer_group="p",
                         actor="t", reason=None, dry_run=False, force=True)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=shift) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert ledger.positions() == {0: 920}
    from offset_ledger.ledger.tables import reset_partitions

    with engine.connect() as conn:
        chain = conn.execute(select(reset_partitions.c.before_next_offset, reset_partitions.c.after_next_offset)
                             .order_by(reset_partitions.c.reset_id)).all()
    assert [tuple(r) for r in chain] == [(1000 - 10 * i, 990 - 10 * i) for i in range(8)]
