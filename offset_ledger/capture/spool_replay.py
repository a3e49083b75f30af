"""The writer's side of the spool: reading spooled events back in order, adopting the orphaned files
of earlier listeners of the same ledger, and spooling everything unwritten on an abandoned close.

A mixin of ``offset_ledger.capture.writer.EventWriter``: it uses the writer's queue, lock, counters
and spool."""

from __future__ import annotations

import logging
import queue

from offset_ledger.capture.spool import Event

log = logging.getLogger(__name__)


class SpoolReplay:
    """The part of ``EventWriter`` moved here (see its module); ``EventWriter`` inherits it."""

    def _next_spooled(self) -> list[Event]:
        """The next events from the spool, oldest file first; only called when the queue is empty."""
        if not self._spool.replay_open:
            with self._lock:
                if not self._spooling:
                    return []
                replay = self._spool.take()
                if replay is None:
                    self._spooling = False  # nothing left: callbacks may use the queue again
                    return []
            self._spool.open_replay(replay)
        return self._read_replay()

    def _read_replay(self) -> list[Event]:
        events, bad, ended = self._spool.read(self._max_batch)
        for line, exc in bad:
            self._count_failure(f"unreadable spool line: {exc!r}", line=line)
            self._settle(1)
        if not ended:
            return events
        # End of file: it is deleted once these last events are written (see _write).
        if not events:
            self._spool.finish_replay()
        else:
            events.append(Event("_end_of_replay", "", 0.0, None, None, None))
        return events

    def _adopt_orphans(self) -> None:
        """Orphaned spool files of this writer's ledger get replayed; those of other ledgers stay put."""
        adopted, foreign = self._spool.adopt_orphans()
        for path, events, bad in adopted:
            with self._lock:
                for event in events:
                    self._spill_locked(event)
                    self._accepted += 1
            for line, exc in bad:
                self._count_failure(f"unreadable spool line in {path.name}: {exc!r}", line=line)
            log.info("offset-ledger: adopted %d spooled events from %s", len(events), path.name)
        self._foreign = tuple(foreign)
        if foreign:
            log.warning("offset-ledger: %d spool file(s) in %s belong to another ledger than %s, or name none "
                        "(an older format); left for their own ledger's listener: %s", len(foreign),
                        self._spool.directory, self._spool.ledger.identity, ", ".join(foreign))

    def _spool_everything(self, held: list[Event]) -> None:
        """On an abandoned close: keep every unwritten event on disk, in order, for the next listener.

        Held events read from a replay file are still in that file (it is deleted only after they
        are written), so only events held from the queue, and the queue itself, need a file: one
        that sorts before this listener's spool, whose events are newer.
        """
        if self._spool.leave_replay():  # left on disk under its replay name: adopted later
            held = []
        with self._lock:
            rest = [e for e in held if e.kind != "_end_of_replay"]
            while True:
                try:
                    rest.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if rest:
                self._spool.write_held(rest)
                self._counts["spilled"] += len(rest)
            self._spool.close()
