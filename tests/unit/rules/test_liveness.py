"""The liveness rule (``rules.liveness``): literals in, states and evidence out, the clock passed in.

``listener(...)`` is a run of an earlier release's listener (no driver heartbeat: inferred from Spark's
events); ``beating(...)`` one of this release's (judged on the driver's heartbeat)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from offset_ledger.rules.liveness import (
    Bounds,
    RunFacts,
    assess_listener_run,
    assess_runs,
    pipeline_verdict,
    silence_bound,
)

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
S = timedelta(seconds=1)
RUN = "0374a913-5b8e-4c1f-9d2a-5c7e0d1b2a33"


def listener(at: datetime, *, batch_ms: int | None = None, gap_ms: int | None = None,
             ended: datetime | None = None, run_id: str = RUN, started: datetime = T0) -> RunFacts:
    return RunFacts(run_id, "q1", started, ended, at, batch_ms, gap_ms)


def beating(beat: datetime, *, event: datetime | None = None, every_ms: int = 10_000,
            ended: datetime | None = None, run_id: str = RUN, started: datetime = T0,
            query_id: str = "q1") -> RunFacts:
    return RunFacts(run_id, query_id, started, ended, event, None, None, beat, every_ms)


def sink(at: datetime, *, ended: datetime | None = None, started: datetime = T0) -> RunFacts:
    return RunFacts("sink:q1", "q1", started, ended, at)


def test_the_bound_is_the_largest_of_floor_three_batches_and_three_gaps() -> None:
    floor = 60 * S
    assert silence_bound(None, None, floor) == 60 * S
    assert silence_bound(2_000, 10_000, floor) == 60 * S  # Spark's 10 s idle events: the floor holds
    assert silence_bound(30_000, 10_000, floor) == 90 * S  # 3 x a 30 s batch
    assert silence_bound(1_000, 300_000, floor) == 900 * S  # a 5 min trigger interval: 3 x the gap


def test_a_listener_run_is_active_within_its_bound_and_stale_after() -> None:
    run = listener(T0, gap_ms=10_000)
    assert assess_listener_run(run, now=T0 + 60 * S).state == "active"
    late = assess_listener_run(run, now=T0 + 61 * S)
    assert late.state == "stale" and "no event for 61 s" in late.why and "presumed crashed" in late.why
    # A long batch widens it: no event arrives while a batch runs.
    assert assess_listener_run(listener(T0, batch_ms=40_000), now=T0 + 119 * S).state == "active"
    assert assess_listener_run(listener(T0, batch_ms=40_000), now=T0 + 121 * S).state == "stale"
    # So does a long gap the listener observed between events (a trigger interval).
    long_gap = assess_listener_run(listener(T0, gap_ms=100_000), now=T0 + 299 * S)
    assert long_gap.state == "active" and "3 x the longest gap" in long_gap.why


def test_a_configured_floor_replaces_sixty_seconds() -> None:
    short = Bounds(floor=5 * S)
    assert assess_listener_run(listener(T0), now=T0 + 6 * S, bounds=short).state == "stale"
    assert assess_listener_run(listener(T0, gap_ms=1_000), now=T0 + 5 * S, bounds=short).state == "active"


def test_a_terminated_run_is_terminated_whatever_the_clock() -> None:
    assert assess_listener_run(listener(T0, ended=T0 + S), now=T0 + 2 * S).state == "terminated"


def test_a_sink_run_follows_the_listener_run_that_saw_its_last_batch() -> None:
    now = T0 + 20 * S
    lives = {lv.run_id: lv for lv in assess_runs([listener(T0 + 10 * S), sink(T0 + 9 * S)], now=now)}
    assert lives["sink:q1"].state == "active" and lives["sink:q1"].follows == RUN
    assert not lives["sink:q1"].inferred
    # The driver was SIGKILLed after the sink committed a batch the listener never reported: the sink
    # run follows the listener run into stale, within the listener's bound, not 10 minutes.
    killed = [listener(T0 + 10 * S), sink(T0 + 12 * S)]
    lives = {lv.run_id: lv for lv in assess_runs(killed, now=T0 + 80 * S)}
    assert lives[RUN].state == "stale" and lives["sink:q1"].state == "stale"
    assert pipeline_verdict(list(lives.values()), now=T0 + 80 * S).state == "stale"


def test_a_sink_run_without_a_listener_is_inferred_for_the_run_timeout() -> None:
    lives = assess_runs([sink(T0)], now=T0 + 12 * S)
    assert lives[0].state == "active" and lives[0].inferred
    assert lives[0].why.startswith("no listener: running inferred from the last batch 12 s ago")
    verdict = pipeline_verdict(lives, now=T0 + 12 * S)
    assert verdict.state == "uncertain" and verdict.run_id == "sink:q1"
    assert verdict.reason.startswith("no listener: running inferred from the last batch 12 s ago from run sink:q1")
    gone = assess_runs([sink(T0)], now=T0 + 11 * 60 * S)
    assert gone[0].state == "stale" and pipeline_verdict(gone, now=T0 + 11 * 60 * S).state == "stale"


def test_a_listener_run_silent_long_before_the_sink_batch_does_not_cover_it() -> None:
    # The listener was dropped from the job after a crash: its old run says nothing about today's batches.
    old = listener(T0, run_id="old-run-0000")
    lives = {lv.run_id: lv for lv in assess_runs([old, sink(T0 + 3600 * S)], now=T0 + 3610 * S)}
    assert lives["sink:q1"].inferred and lives["sink:q1"].state == "active"


def test_a_sink_run_ended_with_its_query_runs_again_when_a_later_batch_arrives() -> None:
    ended = sink(T0 + 5 * S, ended=T0 + 6 * S)
    assert assess_runs([ended], now=T0 + 7 * S)[0].state == "terminated"
    again = sink(T0 + 30 * S, ended=T0 + 6 * S)
    assert assess_runs([again], now=T0 + 31 * S)[0].state == "active"
    # A listener run's termination is Spark's word: a heartbeat after it does not reopen it.
    assert assess_listener_run(listener(T0 + 30 * S, ended=T0 + 6 * S), now=T0 + 31 * S).state == "terminated"


def test_the_verdict_names_the_run_and_how_long_ago() -> None:
    now = T0 + 12 * S
    running = pipeline_verdict(assess_runs([beating(T0 + 5 * S)], now=now), now=now)
    assert (running.state, running.run_id, running.last_event_at) == ("running", RUN, T0 + 5 * S)
    assert running.reason == "driver heartbeat 7 s ago from run 0374a913 (bound 30 s)"
    # An earlier release's listener (no heartbeat): the same inference as before, but said to be one.
    older = pipeline_verdict(assess_runs([listener(T0)], now=now), now=now)
    assert (older.state, older.run_id) == ("uncertain", RUN)
    assert older.reason == ("no heartbeat (an earlier release's listener): last event 12 s ago from run 0374a913 "
                            "(bound 60 s)")
    stopped = pipeline_verdict([], now=now, last_end=(RUN, T0 + 4 * S))
    assert stopped.state == "stopped" and stopped.reason == "query ended 8 s ago (run 0374a913)"
    assert pipeline_verdict([], now=now).reason == "no run recorded"


def test_a_run_heard_from_not_once_since_its_start_gets_the_longer_bound() -> None:
    # Its first batch (a backlog) may run for minutes, and no event arrives while a batch runs.
    fresh = RunFacts(RUN, "q1", T0)
    assert assess_listener_run(fresh, now=T0 + 9 * 60 * S).state == "active"
    assert assess_listener_run(fresh, now=T0 + 11 * 60 * S).state == "stale"
    assert assess_listener_run(listener(T0 + S), now=T0 + 62 * S).state == "stale"


# ---------------------------------------------------------------- the driver's heartbeat (issue 47)


def test_a_slow_trigger_is_alive_while_its_driver_beats() -> None:
    # A 10-minute trigger: Spark's last event 9 minutes ago, the driver's beat 4 s ago.
    run = beating(T0 + 600 * S, event=T0 + 60 * S)
    lv = assess_listener_run(run, now=T0 + 604 * S)
    assert lv.state == "active" and lv.heartbeat and lv.why.startswith("driver heartbeat 4 s ago")
    # Its first interval too: nothing from Spark since the start but the beats.
    assert assess_listener_run(beating(T0 + 170 * S), now=T0 + 175 * S).state == "active"


def test_a_stopped_beat_is_a_crash_within_three_periods() -> None:
    run = beating(T0 + 100 * S)
    assert assess_listener_run(run, now=T0 + 130 * S).state == "active"
    gone = assess_listener_run(run, now=T0 + 131 * S)
    assert gone.state == "stale" and "driver heartbeat stopped 31 s ago" in gone.why and "presumed crashed" in gone.why
    verdict = pipeline_verdict([gone], now=T0 + 131 * S)
    assert verdict.state == "stale" and verdict.reason.startswith("driver heartbeat stopped 31 s ago from run 0374a913")


def test_a_later_end_supersedes_a_crash_and_a_later_crash_shows_again() -> None:
    # Query A's driver was SIGKILLed at 100 s; query B (a fresh checkpoint) then ran and stopped at 500 s.
    killed = beating(T0 + 100 * S, run_id="aaaaaaaa-kill", query_id="qa")
    now = T0 + 3 * 3600 * S
    lives = assess_runs([killed], now=now)
    assert lives[0].state == "stale"
    verdict = pipeline_verdict(lives, now=now, last_end=("bbbbbbbb-stop", T0 + 500 * S))
    assert (verdict.state, verdict.run_id) == ("stopped", "bbbbbbbb-stop")
    # A crash after that end is the latest word again.
    later = beating(T0 + 900 * S, run_id="cccccccc-kill", query_id="qc", started=T0 + 600 * S)
    verdict = pipeline_verdict(assess_runs([killed, later], now=now), now=now,
                               last_end=("bbbbbbbb-stop", T0 + 500 * S))
    assert (verdict.state, verdict.run_id) == ("stale", "cccccccc-kill")


def test_a_sink_run_follows_a_beating_listener_run_into_running() -> None:
    now = T0 + 400 * S
    lives = {lv.run_id: lv for lv in assess_runs([beating(T0 + 395 * S, event=T0 + 60 * S), sink(T0 + 59 * S)],
                                                 now=now)}
    assert lives["sink:q1"].state == "active" and lives["sink:q1"].heartbeat and lives["sink:q1"].follows == RUN
    assert pipeline_verdict(list(lives.values()), now=now).state == "running"


@dataclass(frozen=True)
class TrueRun:
    """What really happened to one run: started at ``start`` s, its trigger every ``trigger`` s, and it
    stopped normally (``stop``) or was killed (``kill``) at that second, or still runs (both None)."""

    run_id: str
    start: int
    trigger: int
    stop: int | None
    kill: int | None
    skipped: frozenset[int]  # beat numbers the ledger could not take (never two in a row)


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[TrueRun], int, int]:
    every = draw(st.sampled_from([2, 5, 10, 30]))
    out = []
    t = 0
    for i in range(draw(st.integers(1, 4))):
        start = t + draw(st.integers(0, 300))
        trigger = draw(st.sampled_from([1, 10, 60, 150, 600, 1200]))
        fate = draw(st.sampled_from(["runs", "stop", "kill"]))
        length = draw(st.integers(1, 4000))
        beats = length // every + 1
        skipped = frozenset(k for k in draw(st.sets(st.integers(1, max(1, beats)), max_size=5))
                            if k % 2 == 0)  # even beats only: never two in a row
        out.append(TrueRun(f"{i:08d}-run", start, trigger, start + length if fate == "stop" else None,
                           start + length if fate == "kill" else None, skipped))
        if fate == "runs":
            break
        t = start + length
    now = draw(st.integers(0, t + 5000))
    return out, every, now


def _ledger_row(run: TrueRun, every: int, now: int) -> RunFacts | None:
    """What the ledger holds of ``run`` at ``now``: its beats, its last Spark event, its end."""
    if run.start > now:
        return None
    alive_until = min(now, run.stop if run.stop is not None else now, run.kill if run.kill is not None else now)
    beats = [run.start + k * every for k in range((alive_until - run.start) // every + 1)
             if k == 0 or k not in run.skipped]
    events = run.start + ((alive_until - run.start) // run.trigger) * run.trigger
    ended = T0 + run.stop * S if run.stop is not None and run.stop <= now else None
    return RunFacts(run.run_id, run.run_id, T0 + run.start * S, ended, T0 + events * S, None, None,
                    T0 + beats[-1] * S, every * 1000)


@settings(max_examples=400, deadline=None)
@given(histories())
def test_the_verdict_equals_what_the_true_history_implies(case: tuple[list[TrueRun], int, int]) -> None:
    runs, every, now = case
    rows = [r for r in (_ledger_row(run, every, now) for run in runs) if r is not None]
    at = T0 + now * S
    lives = {lv.run_id: lv for lv in assess_runs(rows, now=at)}
    ends = [(r.run_id, T0 + r.stop * S) for r in runs if r.stop is not None and r.stop <= now]
    verdict = pipeline_verdict([lv for lv in lives.values() if lv.state != "terminated"], now=at,
                               last_end=max(ends, key=lambda e: e[1]) if ends else None)
    bound = 3 * every
    truly_alive = {r.run_id for r in runs if r.start <= now and (r.stop is None or r.stop > now)
                   and (r.kill is None or r.kill > now)}
    # A killed driver's last sign of life (its last beat, or a Spark event after it when that beat was
    # missed), and whether it is still inside its bound (then it may read alive).
    last_seen = {r.run_id: int((max(row.beat_at, row.last_heartbeat_at) - T0).total_seconds()) for r, row in
                 ((r, _ledger_row(r, every, now)) for r in runs) if row is not None}
    killed = {r.run_id for r in runs if r.kill is not None and r.kill <= now}
    in_bound = {k for k in killed if now - last_seen[k] <= bound}
    # Safety: a live run is active whatever its trigger; a dead one is seen within 3 periods of its last sign of life.
    for run_id in truly_alive:
        assert lives[run_id].state == "active", (run_id, lives[run_id].why)
    for run_id in killed - in_bound:
        assert lives[run_id].state == "stale", (run_id, lives[run_id].why)
    # The pipeline's state (and so the reset guard) is the latest run's.
    if truly_alive or in_bound:
        assert verdict.state == "running"
    else:
        last_normal_end = max((e[1] for e in ends), default=None)
        crashed_after = [k for k in killed if last_normal_end is None or T0 + last_seen[k] * S > last_normal_end]
        assert verdict.state == ("stale" if crashed_after else "stopped"), verdict.reason
