"""The liveness rule (``rules.liveness``): literals in, states and evidence out, the clock passed in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

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
    running = pipeline_verdict(assess_runs([listener(T0)], now=now), now=now)
    assert (running.state, running.run_id, running.last_event_at) == ("running", RUN, T0)
    assert running.reason == "last event 12 s ago from run 0374a913 (silence bound 60 s)"
    stopped = pipeline_verdict([], now=now, last_end=(RUN, T0 + 4 * S))
    assert stopped.state == "stopped" and stopped.reason == "query ended 8 s ago (run 0374a913)"
    assert pipeline_verdict([], now=now).reason == "no run recorded"


def test_a_run_heard_from_not_once_since_its_start_gets_the_longer_bound() -> None:
    # Its first batch (a backlog) may run for minutes, and no event arrives while a batch runs.
    fresh = RunFacts(RUN, "q1", T0)
    assert assess_listener_run(fresh, now=T0 + 9 * 60 * S).state == "active"
    assert assess_listener_run(fresh, now=T0 + 11 * 60 * S).state == "stale"
    assert assess_listener_run(listener(T0 + S), now=T0 + 62 * S).state == "stale"
