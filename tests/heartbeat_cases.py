"""The driver heartbeat through a real ledger (issue 47, cases 1 and 2), shared by the SQLite
(tests/unit/ledger/test_heartbeat_sqlite.py) and PostgreSQL (tests/integration/test_heartbeat_pg.py)
runs: the writer's records and the heartbeat thread's beats, then the verdict every face and the
reset guard read (``ledger.activity``, ``ledger.reset_store``)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from offset_ledger.capture.heartbeat import Heartbeat
from offset_ledger.errors import ActiveRunConflict
from offset_ledger.ledger.activity import last_ends, open_runs, verdict
from offset_ledger.ledger.heartbeats import beat_runs
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunEnd, RunStart
from offset_ledger.ledger.reset_store import record_reset
from offset_ledger.ledger.tables import resets, runs
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress
from offset_ledger.rules.resets import ResetPlan

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)
S = timedelta(seconds=1)
EVERY_MS = 10_000


def _batch(pipeline: str, query: str, run: str, n: int, at: datetime) -> BatchRecord:
    ranges = (PartitionRange("t", 0, 10 * n, 10 * (n + 1)),)
    return BatchRecord(pipeline, pipeline, BatchOffsets(query, run, pipeline, n, at, 10,
                                                        (SourceProgress(0, "KafkaV2[Subscribe[t]]", ranges, 10),),
                                                        duration_ms=200))


def _state(engine: Engine, pipeline: str, now: datetime) -> tuple[str, str]:
    with engine.connect() as conn:
        acts = open_runs(conn, pipeline, pipeline, now=now).get((pipeline, pipeline), [])
        judged = verdict(acts, last_ends(conn, pipeline, pipeline).get((pipeline, pipeline)), now=now)
    return judged.state, judged.reason


def _try_reset(engine: Engine, pipeline: str, now: datetime) -> bool:
    """An executed, unforced reset at ``now``: True when it went through, False when refused (409)."""
    try:
        record_reset(engine, lambda _positions: ResetPlan("earliest", "clamp", ()), pipeline=pipeline,
                     consumer_group=pipeline, actor="test", reason="probe", dry_run=False, now=now)
    except ActiveRunConflict:
        return False
    return True


def slow_trigger_is_running_and_refused_a_reset_until_its_beat_stops(engine: Engine) -> None:
    """A 150 s trigger: one batch at the start, then only beats. Refused a reset throughout (the old
    inference let one through 100 s after the first batch); 3 periods after the last beat, accepted."""
    rec = Recorder(engine)
    try:
        rec.record([RunStart("slow", "slow", "q1", "run-1", "slow", T0, beat_every_ms=EVERY_MS),
                    _batch("slow", "q1", "run-1", 0, T0 + S)], now=T0 + S)
    finally:
        rec.close()
    for second in range(10, 400, 10):  # the driver beats every 10 s for 400 s; Spark says nothing
        assert beat_runs(engine, ["run-1"], T0 + second * S, EVERY_MS) == 1
        now = T0 + (second + 9) * S
        state, why = _state(engine, "slow", now)
        assert state == "running" and why.startswith("driver heartbeat 9 s ago from run run-1"), why
        assert not _try_reset(engine, "slow", now)
    # The driver is SIGKILLed right after its beat at 390 s.
    assert _state(engine, "slow", T0 + 420 * S)[0] == "running"
    state, why = _state(engine, "slow", T0 + 421 * S)
    assert state == "stale" and "driver heartbeat stopped 31 s ago" in why
    assert _try_reset(engine, "slow", T0 + 421 * S)
    with engine.connect() as conn:
        assert [r.status for r in conn.execute(select(resets.c.status))] == ["pending"]


def an_end_supersedes_an_earlier_crash(engine: Engine) -> None:
    """Query A's driver was SIGKILLed; query B (a fresh checkpoint) then ran and stopped normally: the
    pipeline is stopped 30 s and 3 h after B's end, not 'stale' for ever; A's run stays in the history."""
    rec = Recorder(engine)
    try:
        rec.record([RunStart("two", "two", "qa", "run-a", "two", T0, beat_every_ms=EVERY_MS),
                    _batch("two", "qa", "run-a", 0, T0 + S)], now=T0 + S)
        beat_runs(engine, ["run-a"], T0 + 20 * S, EVERY_MS)  # then SIGKILL
        rec.record([RunStart("two", "two", "qb", "run-b", "two", T0 + 600 * S, beat_every_ms=EVERY_MS),
                    _batch("two", "qb", "run-b", 0, T0 + 601 * S)], now=T0 + 601 * S)
        beat_runs(engine, ["run-b"], T0 + 610 * S, EVERY_MS)
        assert _state(engine, "two", T0 + 615 * S)[0] == "running"
        rec.record([RunEnd("two", "two", "qb", "run-b", T0 + 620 * S)], now=T0 + 620 * S)
    finally:
        rec.close()
    for later in (30, 3 * 3600):
        state, why = _state(engine, "two", T0 + (620 + later) * S)
        assert (state, why.split(" ago")[0]) == ("stopped", "query ended " + ("30 s" if later == 30 else "3 h 00 min"))
    with engine.connect() as conn:
        kept = {r.run_id: r.terminated_at for r in conn.execute(select(runs.c.run_id, runs.c.terminated_at))}
    assert kept["run-a"] is None and kept["run-b"] is not None  # the crash is history, not erased


def a_beat_never_revives_an_ended_run_and_an_earlier_release_run_is_uncertain(engine: Engine) -> None:
    rec = Recorder(engine)
    try:
        rec.record([RunStart("end", "end", "q1", "run-1", "end", T0, beat_every_ms=EVERY_MS),
                    RunEnd("end", "end", "q1", "run-1", T0 + 5 * S),
                    # An earlier release's listener: no beat period on its start.
                    RunStart("old", "old", "q2", "run-2", "old", T0)], now=T0 + 5 * S)
    finally:
        rec.close()
    assert beat_runs(engine, ["run-1"], T0 + 10 * S, EVERY_MS) == 0
    assert _state(engine, "end", T0 + 11 * S)[0] == "stopped"
    state, why = _state(engine, "old", T0 + 30 * S)
    assert state == "uncertain" and why.startswith("no heartbeat (an earlier release's listener)")
    assert not _try_reset(engine, "old", T0 + 30 * S)  # inferred running: still guarded


def a_beat_the_ledger_cannot_take_is_skipped_not_queued(engine: Engine) -> None:
    """The ledger refuses beats for a while: each one is skipped and counted, and the first beat after
    it comes back is one fresh beat (the clock's now), not a backlog."""
    rec = Recorder(engine)
    try:
        rec.record([RunStart("down", "down", "q1", "run-1", "down", T0, beat_every_ms=EVERY_MS)], now=T0)
    finally:
        rec.close()
    clock = [T0.timestamp()]
    calls: list[datetime] = []
    down = [True]

    def beats(run_ids: list[str], at: datetime, every_ms: int) -> int:
        calls.append(at)
        if down[0]:
            raise ConnectionError("the ledger is down")
        return beat_runs(engine, run_ids, at, every_ms)

    hb = Heartbeat(lambda: beats, lambda: {"run-1": "q1"}, every=10, clock=lambda: clock[0])
    for _ in range(5):
        clock[0] += 10
        assert hb.beat_once() == 0
    assert (hb.beats, hb.skipped) == (0, 5) and "the ledger is down" in (hb.last_error or "")
    down[0] = False
    clock[0] += 10
    assert hb.beat_once() == 1
    assert len(calls) == 6 and calls[-1] == T0 + 60 * S
    with engine.connect() as conn:
        beat_at = conn.execute(select(runs.c.beat_at).where(runs.c.run_id == "run-1")).scalar_one()
    assert beat_at.replace(tzinfo=timezone.utc) == T0 + 60 * S


def a_run_spark_says_has_stopped_gets_no_beat(engine: Engine) -> None:
    """The listener bus dropped the termination event: Spark's handle says the run is over, so no beat."""
    hb = Heartbeat(lambda: (lambda ids, at, ms: len(ids)), lambda: {"run-1": "q1", "run-2": "q2"}, every=10,
                   still_running=lambda run_id, _q: {"run-1": False, "run-2": None}[run_id])
    assert hb.beat_once() == 1  # run-2 only (cannot tell: the listener's word stands)


def stopping_closes_the_beats_connection(engine: Engine) -> None:
    """The listener's close stops the heartbeat, and its connection goes with it (none left behind)."""
    closed: list[bool] = []

    class Beats:
        def __call__(self, run_ids: list[str], at: datetime, every_ms: int) -> int:
            return len(run_ids)

        def close(self) -> None:
            closed.append(True)

    hb = Heartbeat(Beats, lambda: {"run-1": "q1"}, every=10)
    assert hb.beat_once() == 1
    hb.stop()
    assert closed == [True]


CASES = [slow_trigger_is_running_and_refused_a_reset_until_its_beat_stops, an_end_supersedes_an_earlier_crash,
         a_beat_never_revives_an_ended_run_and_an_earlier_release_run_is_uncertain,
         a_beat_the_ledger_cannot_take_is_skipped_not_queued, a_run_spark_says_has_stopped_gets_no_beat,
         stopping_closes_the_beats_connection]
ids = [c.__name__ for c in CASES]
parametrize = pytest.mark.parametrize("case", CASES, ids=ids)
