"""Spool files back into events, for the listener's writer: reading the open replay file in order,
adopting the orphaned files of earlier listeners of the same ledger, and what of an abandoned
close's held events still needs a file.

Plain functions over a :class:`~offset_ledger.capture.spool.Spool`: they read and move files and
return what they found. The writer (``offset_ledger.capture.writer.EventWriter``) owns the queue,
the lock, the spool switch and the counters, and books what these return.
"""

from __future__ import annotations

import logging
from pathlib import Path

from offset_ledger.capture.spool import Event, Spool

log = logging.getLogger(__name__)

# The kind of the marker event that follows a replay file's last events: the file is deleted
# once the events before the marker are written (not before, so a crash replays them again).
END_OF_REPLAY = "_end_of_replay"

# An unreadable spool line and why: the writer dead-letters it.
Unreadable = tuple[str, str]


def read_replay(spool: Spool, max_events: int) -> tuple[list[Event], list[Unreadable]]:
    """Up to ``max_events`` next events of the open replay file, and its unreadable lines.

    At the file's end the file is finished at once when no events are left, else the events are
    followed by an ``END_OF_REPLAY`` marker (the writer finishes the file after writing them).
    """
    events, bad, ended = spool.read(max_events)
    unreadable = [(line, f"unreadable spool line: {exc!r}") for line, exc in bad]
    if ended:
        if not events:
            spool.finish_replay()
        else:
            events.append(Event(END_OF_REPLAY, "", 0.0, None, None, None))
    return events, unreadable


def adopt_orphans(spool: Spool) -> tuple[list[Event], list[Unreadable], tuple[str, ...]]:
    """The events of the orphaned spool files of ``spool``'s ledger, oldest file first (the writer
    spills them into its own spool, to replay), their unreadable lines, and the names of the files
    of other ledgers (or of none: an older format), which stay put for their own ledger's listener."""
    adopted, foreign = spool.adopt_orphans()
    events: list[Event] = []
    unreadable: list[Unreadable] = []
    for path, file_events, bad in adopted:
        events.extend(file_events)
        unreadable.extend((line, f"unreadable spool line in {Path(path).name}: {exc!r}") for line, exc in bad)
        log.info("offset-ledger: adopted %d spooled events from %s", len(file_events), Path(path).name)
    if foreign:
        log.warning("offset-ledger: %d spool file(s) in %s belong to another ledger than %s, or name none "
                    "(an older format); left for their own ledger's listener: %s", len(foreign),
                    spool.directory, spool.ledger.identity, ", ".join(foreign))
    return events, unreadable, tuple(foreign)


def held_to_keep(spool: Spool, held: list[Event]) -> list[Event]:
    """Of the events an abandoned close held, those that need a new spool file.

    Held events read from a replay file are still in that file (it is deleted only after they are
    written): the file is left on disk under its replay name, adopted later, and none need a file.
    """
    if spool.leave_replay():
        return []
    return [event for event in held if event.kind != END_OF_REPLAY]
