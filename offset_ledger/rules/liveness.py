"""Pure: whether a run is still going, and a pipeline's running state with the evidence for it.

**A run with a heartbeat** (this release's listener): a daemon thread of the driver process writes
``beat_at`` every ``beat_every_ms`` (``capture.heartbeat``), whatever the trigger interval, the batch's
length or idleness. Such a run is active until Spark reports its termination or its beat is older
than ``BEAT_MISSES`` (3) periods: a 10-minute trigger or a 20-minute batch is alive, and a SIGKILLed
(or hung) driver is seen ended within 3 periods of its last beat (30 s at the default 10 s period).

**A run without a heartbeat** (a listener of an earlier release) keeps the earlier inference from the
gaps between Spark's events: Spark posts a progress or an idle event at least every
``spark.sql.streaming.noDataProgressEventInterval`` (10 s by default), so such a run is active until
it has been silent longer than its *silence bound*::

    max(floor, 3 x its longest batch, 3 x the longest gap the listener observed between its events)

The floor (``OFFSET_LEDGER_RUN_SILENCE_FLOOR``, 60 s) keeps a slow listener bus or a GC pause from
opening a live query to resets; a run heard from not once since its start gets
``OFFSET_LEDGER_RUN_TIMEOUT`` (10 min) if that is longer. A slow trigger's first interval can outlast
it, so the pipeline's state built on such a run is ``uncertain``, never ``running``.

A sink (``sink:<query id>``) or the checkpoint watcher (``checkpoint:<query id>``) records runs too,
but hears only batches. Such a run of a query the listener watched at the time of its last batch
follows that listener run (the listener saw the same Spark run). Otherwise nothing tells whether it
still runs: it is *inferred* active for ``OFFSET_LEDGER_RUN_TIMEOUT`` (10 min, at least 3 x its
longest batch) after its last batch, and the pipeline's state says so (``uncertain``).

The pipeline's state is its latest run's: a run presumed crashed (its beat stopped, or silent past its
bound) is superseded by any recorded end after it was last seen, so a crash followed by a run that
stopped normally reads ``stopped``, not "crashed" forever; the run itself stays in the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal

RunState = Literal["active", "stale", "terminated"]
PipelineState = Literal["running", "uncertain", "stale", "stopped"]

#: Run ids a sink and the checkpoint watcher record under (``sinks.postgres.sink_run_id``,
#: ``capture.reconcile.checkpoint_run_id``): runs that hear batches only, never idle events.
INFERRED_RUN_PREFIXES = ("sink:", "checkpoint:")

DEFAULT_FLOOR = timedelta(seconds=60)
DEFAULT_INFERRED = timedelta(minutes=10)
#: A run with a heartbeat is presumed gone once this many periods passed without a beat.
BEAT_MISSES = 3


@dataclass(frozen=True)
class Bounds:
    """The configured bounds: ``floor`` of a listener run's silence bound; ``inferred``: how long a
    run without listener heartbeats counts as running after its last batch."""

    floor: timedelta = DEFAULT_FLOOR
    inferred: timedelta = DEFAULT_INFERRED


@dataclass(frozen=True)
class RunFacts:
    """What the ledger knows of one run (a ``runs`` row)."""

    run_id: str
    query_id: str
    started_at: datetime
    terminated_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    max_batch_ms: int | None = None
    max_gap_ms: int | None = None  # the longest silence the listener observed between two events
    beat_at: datetime | None = None  # the driver's last heartbeat (0022)
    beat_every_ms: int | None = None  # its period; None: the run has no heartbeat

    @property
    def has_heartbeat(self) -> bool:
        return self.beat_every_ms is not None and self.beat_every_ms > 0 and not self.inferred

    @property
    def inferred(self) -> bool:
        """Recorded by a sink or the watcher: only batches are heard from it."""
        return self.run_id.startswith(INFERRED_RUN_PREFIXES)

    @property
    def last_seen(self) -> datetime:
        """The last sign of life: a Spark event, a batch or (with a heartbeat) the driver's beat."""
        heard = [t for t in (_utc(self.last_heartbeat_at), _utc(self.beat_at)) if t is not None]
        return max(heard) if heard else _utc(self.started_at)  # type: ignore[return-value]

    @property
    def ended(self) -> bool:
        """Terminated, and (for a sink or watcher run) no batch recorded after that end: a later run of
        the query reuses the same sink run id, and its batches mean it is running again."""
        end = _utc(self.terminated_at)
        if end is None:
            return False
        return not (self.inferred and self.last_heartbeat_at is not None and self.last_seen > end)


@dataclass(frozen=True)
class Liveness:
    """One run's state at a moment, its bound, and a sentence that says why."""

    run_id: str
    query_id: str
    state: RunState
    last_seen: datetime
    bound: timedelta
    why: str
    inferred: bool = False      # no listener: the state is inferred from the last batch
    follows: str | None = None  # the listener run a sink/watcher run follows
    heartbeat: bool = False     # judged on the driver's own heartbeat (else inferred from Spark's events)


@dataclass(frozen=True)
class PipelineVerdict:
    """A pipeline's state and the evidence: the run it rests on and a sentence every face shows."""

    state: PipelineState
    reason: str
    run_id: str | None = None
    last_event_at: datetime | None = None


def silence_bound(max_batch_ms: int | None, max_gap_ms: int | None, floor: timedelta) -> timedelta:
    """max(floor, 3 x the longest batch, 3 x the longest observed gap between events)."""
    return max(floor, 3 * timedelta(milliseconds=max_batch_ms or 0), 3 * timedelta(milliseconds=max_gap_ms or 0))


def assess_listener_run(run: RunFacts, *, now: datetime, bounds: Bounds = Bounds()) -> Liveness:
    """The state of a run the listener records: on its driver's heartbeat when it has one, else inferred
    from the gaps between Spark's events."""
    seen = run.last_seen
    silent = _utc(now) - seen  # type: ignore[operator]
    if run.has_heartbeat:
        every = timedelta(milliseconds=run.beat_every_ms or 0)
        bound = BEAT_MISSES * every
        if run.ended:
            return Liveness(run.run_id, run.query_id, "terminated", seen, bound, "Spark reported its termination",
                            heartbeat=True)
        if silent <= bound:
            return Liveness(run.run_id, run.query_id, "active", seen, bound,
                            f"driver heartbeat {human(silent)} ago (every {human(every)}, bound {human(bound)})",
                            heartbeat=True)
        return Liveness(run.run_id, run.query_id, "stale", seen, bound,
                        f"driver heartbeat stopped {human(silent)} ago (every {human(every)}, bound {human(bound)}) "
                        f"and no termination reported: presumed crashed", heartbeat=True)
    bound = silence_bound(run.max_batch_ms, run.max_gap_ms, bounds.floor)
    if run.last_heartbeat_at is None:
        # Nothing heard since the start: its first batch may be a backlog of any length, and no event
        # arrives while a batch runs. Until it reports one, it gets the longer bound.
        bound = max(bound, bounds.inferred)
    if run.ended:
        return Liveness(run.run_id, run.query_id, "terminated", seen, bound, "Spark reported its termination")
    basis = _basis(bound, run.max_batch_ms, run.max_gap_ms)
    if silent <= bound:
        return Liveness(run.run_id, run.query_id, "active", seen, bound,
                        f"no heartbeat: last event {human(silent)} ago ({basis})")
    return Liveness(run.run_id, run.query_id, "stale", seen, bound,
                    f"no heartbeat: no event for {human(silent)} and no termination reported ({basis}): "
                    f"presumed crashed")


def assess_runs(runs: Sequence[RunFacts], *, now: datetime, bounds: Bounds = Bounds()) -> list[Liveness]:
    """Every run's state (same order); a sink/watcher run follows the listener run that covers its last batch."""
    listener = {r.run_id: assess_listener_run(r, now=now, bounds=bounds) for r in runs if not r.inferred}
    out: list[Liveness] = []
    for r in runs:
        if not r.inferred:
            out.append(listener[r.run_id])
            continue
        cover = _covering(r, [x for x in runs if not x.inferred and x.query_id == r.query_id], listener)
        if r.ended:
            out.append(Liveness(r.run_id, r.query_id, "terminated", r.last_seen, bounds.floor,
                                "the query's end was seen", follows=cover.run_id if cover else None))
        elif cover is not None:
            out.append(Liveness(r.run_id, r.query_id, cover.state, r.last_seen, cover.bound,
                                f"follows listener run {short(cover.run_id)}: {cover.why}", follows=cover.run_id,
                                heartbeat=cover.heartbeat))
        else:
            bound = max(bounds.inferred, 3 * timedelta(milliseconds=r.max_batch_ms or 0))
            silent = _utc(now) - r.last_seen  # type: ignore[operator]
            state: RunState = "active" if silent <= bound else "stale"
            why = (f"no listener: running inferred from the last batch {human(silent)} ago (bound {human(bound)})"
                   if state == "active" else
                   f"no listener: no batch for {human(silent)} (bound {human(bound)}): presumed stopped")
            out.append(Liveness(r.run_id, r.query_id, state, r.last_seen, bound, why, inferred=True))
    return out


def _covering(run: RunFacts, candidates: Sequence[RunFacts], assessed: dict[str, Liveness]) -> Liveness | None:
    """The listener run of the same query that was alive when ``run`` recorded its last batch, if any:
    started by then, not ended before it, and (if never ended) heard from within its bound of it —
    a SIGKILL may cut the listener off just before the sink commits the batch it was writing."""
    best: Liveness | None = None
    for c in candidates:
        if _utc(c.started_at) > run.last_seen:  # type: ignore[operator]
            continue
        end = _utc(c.terminated_at)
        if end is not None and end < run.last_seen:
            continue
        lv = assessed[c.run_id]
        if end is None and run.last_seen - c.last_seen > lv.bound:
            continue
        if best is None or lv.last_seen > best.last_seen:
            best = lv
    return best


def pipeline_verdict(runs: Sequence[Liveness], *, now: datetime,
                     last_end: tuple[str, datetime] | None = None) -> PipelineVerdict:
    """The pipeline's state from its runs' (``assess_runs``), with the evidence.

    ``running`` rests on a driver's heartbeat; ``uncertain`` on an inference (a listener run without a
    heartbeat, or a sink's or watcher's batches); ``stale`` on a run presumed crashed that no later
    end superseded; ``stopped`` otherwise. ``last_end``: (run id, time) of the pipeline's most recent
    recorded termination, the evidence of ``stopped``.
    """
    active = [r for r in runs if r.state == "active"]
    beating = [r for r in active if r.heartbeat]
    if beating:
        best = max(beating, key=lambda r: r.last_seen)
        run = best.follows or best.run_id
        return PipelineVerdict("running", f"driver heartbeat {_ago(best.last_seen, now)} ago from run {short(run)} "
                                          f"(bound {human(best.bound)})", run, best.last_seen)
    if active:
        best = max(active, key=lambda r: r.last_seen)
        if best.inferred:
            why = f"no listener: running inferred from the last batch {_ago(best.last_seen, now)} ago"
        else:
            why = f"no heartbeat (an earlier release's listener): last event {_ago(best.last_seen, now)} ago"
        run = best.follows or best.run_id
        return PipelineVerdict("uncertain", f"{why} from run {short(run)} (bound {human(best.bound)})",
                               run, best.last_seen)
    end_at = _utc(last_end[1]) if last_end is not None else None
    # A crash that a later end superseded is history: the pipeline's state is its latest run's.
    stale = [r for r in runs if r.state == "stale" and (end_at is None or r.last_seen > end_at)]
    if stale:
        best = max(stale, key=lambda r: r.last_seen)
        gone = "driver heartbeat stopped" if best.heartbeat else "no event"
        return PipelineVerdict("stale", f"{gone} {_ago(best.last_seen, now)} ago from run {short(best.run_id)} "
                                        f"(bound {human(best.bound)}) and no termination reported: presumed crashed",
                               best.run_id, best.last_seen)
    if last_end is not None:
        run_id, at = last_end
        return PipelineVerdict("stopped", f"query ended {_ago(at, now)} ago (run {short(run_id)})", run_id, _utc(at))
    return PipelineVerdict("stopped", "no run recorded")


def short(run_id: str) -> str:
    """A run id as the faces show it: 8 characters (a sink's or watcher's run: its prefix and 8 of its query id)."""
    for prefix in INFERRED_RUN_PREFIXES:
        if run_id.startswith(prefix):
            return run_id[:len(prefix) + 8]
    return run_id[:8]


def human(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {(seconds % 3600) // 60:02d} min"


def _ago(at: datetime, now: datetime) -> str:
    return human(_utc(now) - _utc(at))  # type: ignore[operator]


def _basis(bound: timedelta, max_batch_ms: int | None, max_gap_ms: int | None) -> str:
    batch = 3 * timedelta(milliseconds=max_batch_ms or 0)
    gap = 3 * timedelta(milliseconds=max_gap_ms or 0)
    if bound == batch and batch > gap:
        return f"bound {human(bound)} = 3 x its longest batch"
    if bound == gap and gap > batch:
        return f"bound {human(bound)} = 3 x the longest gap between its events"
    return f"bound {human(bound)}"


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value
