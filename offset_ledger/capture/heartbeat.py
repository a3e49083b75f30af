"""The driver process's heartbeat: a daemon thread that says "still alive" for the runs it records.

Spark's events say a query is alive only when it has something to say: at each trigger, at a batch's
end, every ``noDataProgressEventInterval`` while idle. A 10-minute trigger or a 20-minute batch is
silent for longer than any bound that also catches a SIGKILLed driver in time, so the verdict
"alive" comes from the process itself (issue 47): every ``every`` seconds, whatever the trigger, this
thread writes ``runs.beat_at`` for each run the listener has seen start and not end
(``ledger.heartbeats``). ``rules.liveness`` judges such a run active while its beat is younger than 3
periods; a driver that dies (SIGKILL, OOM, a lost host) stops beating and is seen ended within that.

It never hurts the query and never piles up: the beat runs on its own connection, off the listener
bus and the writer's queue; a beat the ledger cannot take (down, slow, locked) is skipped and
counted, never queued, so a database that comes back gets one fresh beat, not a backlog. Where the
query's handle can be asked (``still_running``), a run whose query stopped without its termination
event reaching the listener (the bus drops events when full) is not beaten for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Protocol

log = logging.getLogger(__name__)

#: The default period (``OFFSET_LEDGER_HEARTBEAT_INTERVAL``): a SIGKILLed driver is seen ended within
#: 3 periods of its last beat.
DEFAULT_EVERY_SECONDS = 10.0


class Beats(Protocol):
    """Where beats go: ``ledger.heartbeats.beat_runs`` over an engine of the beat's own."""

    def __call__(self, run_ids: list[str], at: datetime, every_ms: int) -> int: ...


class Heartbeat:
    """One daemon thread beating for the runs ``live_runs()`` names, every ``every`` seconds.

    ``live_runs`` returns run id -> query id of the runs seen started and not ended (read on this
    thread: it must be safe to call concurrently with the writer, e.g. a copy of a dict).
    ``still_running(run_id, query_id)`` answers True/False when Spark can be asked, None when not.
    ``open_beats`` makes the writer of beats on the thread's first beat (a connection of its own).
    """

    def __init__(self, open_beats: Callable[[], Beats], live_runs: Callable[[], dict[str, str]], *,
                 every: float = DEFAULT_EVERY_SECONDS,
                 still_running: Callable[[str, str], bool | None] | None = None,
                 clock: Callable[[], float] = time.time,
                 on_error: Callable[[str], None] | None = None) -> None:
        if every <= 0:
            raise ValueError("the heartbeat period must be positive")
        self.every = every
        self._open_beats = open_beats
        self._beats: Beats | None = None
        self._live_runs = live_runs
        self._still_running = still_running
        self._clock = clock
        self._on_error = on_error
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.beats = 0      # beats written
        self.skipped = 0    # beats the ledger could not take (skipped, never queued)
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="offset-ledger-heartbeat", daemon=True)

    @property
    def every_ms(self) -> int:
        return int(round(self.every * 1000))

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop beating (the runs it beat for then end by their termination, or 3 periods later) and
        close the beats' connection."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        with self._lock:
            close = getattr(self._beats, "close", None)
            self._beats = None
        if close is not None:
            close()

    def beat_once(self) -> int:
        """One beat now for the live runs: how many runs it moved (0 when skipped)."""
        with self._lock:
            alive = self._alive(self._live_runs())
            if not alive:
                return 0
            at = datetime.fromtimestamp(self._clock(), tz=timezone.utc)
            try:
                if self._beats is None:
                    self._beats = self._open_beats()
                moved = self._beats(sorted(alive), at, self.every_ms)
            except Exception as exc:  # noqa: BLE001 - a beat that cannot land is skipped, never raised or queued
                self.skipped += 1
                self.last_error = f"heartbeat skipped: {exc!r}"[:500]
                log.warning("offset-ledger: %s", self.last_error)
                if self._on_error is not None:
                    self._on_error(self.last_error)
                return 0
            self.beats += 1
            return moved

    def _alive(self, runs: dict[str, str]) -> list[str]:
        if self._still_running is None:
            return list(runs)
        out = []
        for run_id, query_id in runs.items():
            try:
                running = self._still_running(run_id, query_id)
            except Exception:  # noqa: BLE001 - Spark cannot be asked (shutting down): the listener's word stands
                running = None
            if running is not False:
                out.append(run_id)
        return out

    def _run(self) -> None:
        # The first beat one period after the start: the run's own start row counts as its first beat.
        while not self._stop.wait(self.every):
            self.beat_once()

