"""A property over the true history of one pipeline's runs, through a real ledger (issue 47).

Hypothesis draws what really happened: drivers started (a fresh checkpoint: a new query; or the same
checkpoint again: the same query), each on its own trigger (1 s to 20 min), beating every 10 s with
some beats the ledger could not take (never two in a row); a sink recording the same query's batches;
drivers stopped normally or SIGKILLed; time passing. The ledger gets exactly what the listener, its
heartbeat thread and the sink would write, and after every step the verdict every face shows and the
reset guard must equal what the true history implies:

- ``running`` (a reset refused) while some driver is truly alive, or was killed less than 3 periods
  after its last sign of life (a beat, or a Spark event: the documented bound);
- else ``stale`` when a killed driver was last heard after every normal end (a crash is the latest
  word);
- else ``stopped`` (a later end supersedes a crash; a later run of the same checkpoint that ended
  closes it: only one run writes a checkpoint at a time).
Used by tests/unit/ledger/test_heartbeat_property_sqlite.py and tests/integration/test_heartbeat_pg.py.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from offset_ledger.errors import ActiveRunConflict
from offset_ledger.ledger.activity import last_ends, open_runs, verdict
from offset_ledger.ledger.heartbeats import beat_runs
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import RunEnd, RunHeartbeat, RunStart
from offset_ledger.ledger.reset_store import record_reset
from offset_ledger.rules.resets import ResetPlan

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)
EVERY = 10  # seconds between beats
BOUND = 3 * EVERY

_start = st.tuples(st.just("start"), st.booleans(), st.sampled_from([1, 10, 60, 150, 600, 1200]))  # fresh query?
# Time passing: around the bound after a beat (20-35 s), a trigger or two, and long silences.
_tick = st.tuples(st.just("tick"), st.one_of(st.sampled_from([10, 21, 25, 29, 31, 35, 50, 125, 600]),
                                             st.integers(1, 900)), st.just(0))
_end = st.tuples(st.sampled_from(["stop", "kill"]), st.integers(0, 5), st.just(0))
_sink = st.tuples(st.just("sink"), st.integers(0, 5), st.just(0))
#: One step of the true history (time passing drawn most, then starts and ends).
steps = st.one_of(_tick, _tick, _start, _end, _end, _sink)
histories = st.lists(steps, min_size=1, max_size=20)
_names = itertools.count()
#: Issue 47's case 2, always tried: a driver SIGKILLed, then a fresh checkpoint's run stopped normally.
SUPERSEDED_CRASH = [("start", True, 10), ("tick", 50, 0), ("kill", 0, 0), ("start", True, 10), ("tick", 50, 0),
                    ("stop", 0, 0), ("tick", 30, 0), ("tick", 3 * 3600, 0)]


@dataclass
class Driver:
    query_id: str
    run_id: str
    started: int
    trigger: int
    skipped: set[int]  # beat numbers the ledger could not take
    stopped: int | None = None
    killed: int | None = None
    beats_written: int = 0  # beat numbers up to this one were handed to the ledger
    events_written: int = 0

    def alive(self, t: int) -> bool:
        return self.stopped is None and self.killed is None

    def last_seen(self) -> int:
        """The last sign of life the ledger took: a beat (its start counts as the first) or a Spark event."""
        done = [k for k in range(1, self.beats_written + 1) if k not in self.skipped]
        return max(self.started + EVERY * (done[-1] if done else 0), self.started + self.events_written * self.trigger)


@dataclass
class World:
    pipeline: str
    t: int = 0
    drivers: list[Driver] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)


def _at(t: int) -> datetime:
    return T0 + timedelta(seconds=t)


def _advance(engine: Engine, rec: Recorder, w: World, until: int) -> None:
    """Time passes to ``until``: every live driver beats every EVERY s (skipping its skipped beats) and
    reports at its triggers, in time order, as its heartbeat thread and the listener would."""
    for d in w.drivers:
        if not d.alive(until):
            continue
        for k in range(d.beats_written + 1, (until - d.started) // EVERY + 1):
            if k not in d.skipped:
                assert beat_runs(engine, [d.run_id], _at(d.started + EVERY * k), EVERY * 1000) == 1
            d.beats_written = k
        n = (until - d.started) // d.trigger
        if n > d.events_written:
            rec.record([RunHeartbeat(w.pipeline, w.pipeline, d.query_id, d.run_id, _at(d.started + n * d.trigger))],
                       now=_at(until))
            d.events_written = n
    w.t = until


def _closed(w: World, d: Driver) -> bool:
    """A later run of the same query (the same checkpoint) started after ``d`` was last heard and ended:
    only one run writes a checkpoint at a time, so ``d`` was over by then (Spark's end says so)."""
    later = w.drivers[w.drivers.index(d) + 1:]
    # Started strictly later: runs started in the same instant cannot be told apart by their start.
    return any(o.query_id == d.query_id and o.started > d.started and o.started >= d.last_seen()
               and o.stopped is not None for o in later)


def _expected(w: World) -> str:
    t = w.t
    killed = [d for d in w.drivers if d.killed is not None and not _closed(w, d)]
    if any(d.alive(t) for d in w.drivers) or any(t - d.last_seen() <= BOUND for d in killed):
        return "running"
    last_end = max(w.ends, default=None)
    if any(last_end is None or d.last_seen() > last_end for d in killed):
        return "stale"
    return "stopped"


def _judged(engine: Engine, w: World) -> tuple[str, str]:
    now = _at(w.t)
    with engine.connect() as conn:
        acts = open_runs(conn, w.pipeline, w.pipeline, now=now).get((w.pipeline, w.pipeline), [])
        judged = verdict(acts, last_ends(conn, w.pipeline, w.pipeline).get((w.pipeline, w.pipeline)), now=now)
    return judged.state, judged.reason


def _reset_refused(engine: Engine, w: World) -> bool:
    try:  # a dry run is never refused; an executed one is, while a run is active
        record_reset(engine, lambda _p: ResetPlan("earliest", "clamp", ()), pipeline=w.pipeline,
                     consumer_group=w.pipeline, actor="property", reason="probe", dry_run=False, now=_at(w.t))
    except ActiveRunConflict:
        return True
    return False


def check_history(engine: Engine, history: list[tuple[str, object, int]], skipped_beats: list[int]) -> None:
    w = World(f"hb{next(_names)}")
    rec = Recorder(engine)
    queries = itertools.count()
    try:
        for kind, arg, trigger in history:
            live = [d for d in w.drivers if d.alive(w.t)]
            if kind == "start":
                fresh = bool(arg) or not w.drivers
                query = f"{w.pipeline}-q{next(queries)}" if fresh else w.drivers[-1].query_id
                if any(d.query_id == query for d in live):
                    continue  # Spark refuses a second concurrent run of one checkpoint
                d = Driver(query, f"{w.pipeline}-r{len(w.drivers)}", w.t, trigger,
                           {k for k in skipped_beats if k % 2 == len(w.drivers) % 2})
                w.drivers.append(d)
                rec.record([RunStart(w.pipeline, w.pipeline, query, d.run_id, w.pipeline, _at(w.t),
                                     beat_every_ms=EVERY * 1000)], now=_at(w.t))
            elif kind == "tick":
                until = w.t + int(arg)  # type: ignore[call-overload]
                # Look at the edges of every killed driver's bound on the way: one second before, at, after.
                probes = sorted({d.last_seen() + BOUND + e for d in w.drivers if d.killed is not None
                                 for e in (-1, 0, 1)} & set(range(w.t + 1, until)))
                for at in probes:
                    _advance(engine, rec, w, at)
                    _check(engine, w)
                _advance(engine, rec, w, until)
            elif kind in ("stop", "kill") and live:
                d = live[int(arg) % len(live)]  # type: ignore[call-overload]
                if kind == "stop":
                    d.stopped = w.t
                    w.ends.append(w.t)
                    rec.record([RunEnd(w.pipeline, w.pipeline, d.query_id, d.run_id, _at(w.t))], now=_at(w.t))
                else:
                    d.killed = w.t
            elif kind == "sink" and live:
                d = live[int(arg) % len(live)]  # type: ignore[call-overload]
                sink_run = f"sink:{d.query_id}"
                rec.record([RunStart(w.pipeline, w.pipeline, d.query_id, sink_run, None, _at(w.t)),
                            RunHeartbeat(w.pipeline, w.pipeline, d.query_id, sink_run, _at(w.t))], now=_at(w.t))
            _check(engine, w)
    finally:
        rec.close()


def _check(engine: Engine, w: World) -> None:
    want = _expected(w)
    state, why = _judged(engine, w)
    assert state == want, (w.t, want, state, why, w.drivers, w.ends)
    assert _reset_refused(engine, w) == (want == "running"), (w.t, want, why)
