"""Findings that inform instead of flooding, and prune's rules for them (SQLite; Postgres runs the same scenarios).

A repeated finding (same pipeline, consumer group, run, kind, topic, partition) is one row whose
``occurrences`` and ``last_seen_at`` grow; gaps stay one row each. A batch that overtakes a pending
reset on a pipeline without generations moves the position and is a stored ``reset_overtaken`` finding.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.tables import findings
from offset_ledger.rules.authority import PositionState, decide
from tests.unit.ledger.test_recorder_sqlite import T0, _pending_reset, batch, finding_rows, position_map, rec, start


def _clock(i: int) -> datetime:
    return T0 + timedelta(hours=2, seconds=i)


def check_a_held_pipeline_leaves_one_row_per_partition(engine: Engine) -> None:
    recorder = Recorder(engine)
    parts = {("t", p): (None, 100) for p in range(4)}
    recorder.record([start(at=T0 - timedelta(minutes=1)), rec(batch(0, parts))])
    _pending_reset(engine, 1, 20, T0 + timedelta(hours=1))
    # The run that was going when the forced reset came keeps reporting: 30 batches x 4 partitions.
    for b in range(1, 31):
        ends = {("t", p): (100 + b - 1, 100 + b) for p in range(4)}
        out = recorder.record([rec(batch(b, ends))], now=_clock(b))
        assert [f.kind for f in out.findings] == ["pending_reset"] * 4  # each call still says what it saw
    rows = finding_rows(engine)
    assert [(r.kind, r.partition, r.occurrences) for r in rows] == [("pending_reset", p, 30) for p in range(4)]
    for r in rows:
        assert _utc(r.created_at) == _clock(1) and _utc(r.last_seen_at) == _clock(30)
        assert (r.batch_id, r.expected_offset, r.actual_offset) == (30, 20, 130)  # the latest sighting
    assert position_map(engine) == {("t", p): 20 for p in range(4)}
    # Several batches in one transaction count one each.
    recorder.record([rec(batch(b, {("t", p): (100 + b - 1, 100 + b) for p in range(4)})) for b in (31, 32)],
                    now=_clock(32))
    assert [r.occurrences for r in finding_rows(engine)] == [32] * 4
    # Another run of the same pipeline is another row: the count is per run.
    recorder.record([start(run="r2", query="q1", at=T0 - timedelta(seconds=30)),
                     rec(batch(33, {("t", 0): (132, 133)}, run="r2"))], now=_clock(33))
    assert sorted((r.run_id, r.partition, r.occurrences) for r in finding_rows(engine)) == [
        ("r1", 0, 32), ("r1", 1, 32), ("r1", 2, 32), ("r1", 3, 32), ("r2", 0, 1)]


def check_gaps_stay_one_row_each(engine: Engine) -> None:
    recorder = Recorder(engine)
    recorder.record([start(), rec(batch(0, {("t", 0): (None, 10)}))])
    recorder.record([rec(batch(1, {("t", 0): (15, 20)}))])
    recorder.record([rec(batch(2, {("t", 0): (25, 30)}))])
    rows = finding_rows(engine)
    assert [(r.kind, r.expected_offset, r.actual_offset, r.occurrences) for r in rows] == [
        ("gap", 10, 15, 1), ("gap", 20, 25, 1)]


def check_a_reset_overtaken_without_generations_is_a_finding(engine: Engine) -> None:
    recorder = Recorder(engine)
    recorder.record([start(at=T0 - timedelta(minutes=1)), rec(batch(0, {("t", 0): (None, 40), ("t", 1): (None, 40)}))])
    recorder.record([RunEndAt(T0)])
    _pending_reset(engine, 5, 0, T0 + timedelta(hours=1))  # to earliest, while stopped
    # Restarted after the reset, but from the old checkpoint: it starts at 40, not at the reset's 0.
    old = start(run="r2", query="q1", at=T0 + timedelta(hours=2))
    out = recorder.record([old, rec(batch(1, {("t", 0): (40, 50), ("t", 1): (40, 45)}, run="r2"))])
    assert sorted((f.kind, f.partition) for f in out.findings) == [("reset_overtaken", 0), ("reset_overtaken", 1)]
    rows = finding_rows(engine)
    assert [(r.kind, r.expected_offset, r.actual_offset, r.details["position_reset_id"]) for r in rows] == [
        ("reset_overtaken", 0, 50, 5), ("reset_overtaken", 0, 45, 5)]
    assert position_map(engine) == {("t", 0): 50, ("t", 1): 45}
    # A run that starts where the reset put it applied the reset: no finding.
    _pending_reset(engine, 6, 10, T0 + timedelta(hours=3))
    honest = start(run="r3", query="q3", at=T0 + timedelta(hours=4))
    out = recorder.record([honest, rec(batch(0, {("t", 0): (10, 12), ("t", 1): (10, 11)}, query="q3", run="r3"))])
    assert out.findings == () and position_map(engine) == {("t", 0): 12, ("t", 1): 11}


def RunEndAt(at: datetime):  # type: ignore[no-untyped-def]  # noqa: N802 - reads like the record it makes
    from offset_ledger.ledger.records import RunEnd

    return RunEnd("orders", "orders", "q1", "r1", at)


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


FINDING_SCENARIOS = [
    check_a_held_pipeline_leaves_one_row_per_partition, check_gaps_stay_one_row_each,
    check_a_reset_overtaken_without_generations_is_a_finding,
]


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    yield engine
    engine.dispose()


@pytest.mark.parametrize("scenario", FINDING_SCENARIOS, ids=lambda f: f.__name__.removeprefix("check_"))
def test_findings_on_sqlite(scenario, sqlite_engine: Engine) -> None:  # type: ignore[no-untyped-def]
    scenario(sqlite_engine)


def test_decide_reset_overtaken() -> None:
    reset_at = T0 + timedelta(hours=1)
    held = PositionState(0, None, reset_at, reset_pending=True)
    after = dict(query_id="q", run_started_at=reset_at + timedelta(minutes=1), run_generation_id=None,
                 current_generation_id=None)
    assert decide(held, 50, from_offset=40, **after) == "reset_overtaken"  # type: ignore[arg-type]
    assert decide(held, 50, from_offset=0, **after) == "move"  # type: ignore[arg-type]
    assert decide(held, 50, from_offset=None, **after) == "move"  # type: ignore[arg-type]
    before = {**after, "run_started_at": reset_at - timedelta(minutes=1)}
    assert decide(held, 50, from_offset=40, **before) == "pending_reset"  # type: ignore[arg-type]
    ahead = PositionState(100, None, reset_at, reset_pending=True)  # a reset forward, overtaken from behind
    assert decide(ahead, 60, from_offset=40, **after) == "regression"  # type: ignore[arg-type]


def test_prune_keeps_every_finding_and_the_batches_they_name(sqlite_engine: Engine) -> None:
    """Prune's rule for findings: never deleted (they are the audit's evidence, and bounded by the
    repeat rule), and the batch each one names keeps its history."""
    from offset_ledger.ledger.prune import prune
    from offset_ledger.ledger.tables import batches

    check_a_held_pipeline_leaves_one_row_per_partition(sqlite_engine)
    recorder = Recorder(sqlite_engine)
    recorder.record([rec(batch(40, {("t", 0): (133, 141)}))])  # the newest batch of the partition
    report = prune(sqlite_engine, timedelta(days=1), execute=True, now=T0 + timedelta(days=30))
    assert report.batches.deleted > 0
    with sqlite_engine.connect() as conn:
        kept = {r.batch_id for r in conn.execute(select(batches.c.batch_id))}
        named = {r.batch_id for r in conn.execute(select(findings.c.batch_id))}
    assert len(finding_rows(sqlite_engine)) == 5
    assert named <= kept and 40 in kept and 5 not in kept


def test_findings_api_shows_the_count_and_last_sighting(sqlite_engine: Engine) -> None:
    from fastapi.testclient import TestClient

    from offset_ledger.api import create_app
    from offset_ledger.operate.operations import Operations
    from tests.unit.api.test_api_validation import StandInKafka

    check_a_held_pipeline_leaves_one_row_per_partition(sqlite_engine)
    ops = Operations(sqlite_engine, kafka=StandInKafka())  # type: ignore[arg-type]
    client = TestClient(create_app(operations=ops, tokens=[]), base_url="http://localhost")
    got = client.get("/api/v1/pipelines/orders/findings").json()["findings"]
    assert [(f["kind"], f["partition"], f["occurrences"]) for f in got][:1] == [("pending_reset", 0, 1)]  # r2: newest
    assert sorted(f["occurrences"] for f in got) == [1, 32, 32, 32, 32]
    held = [f for f in got if f["occurrences"] == 32]
    assert all(f["lastSeenAt"] == _clock(32).isoformat() and f["createdAt"] == _clock(1).isoformat() for f in held)
