"""The listener's spool: events spilled to a local file while the queue is full, replayed in order.

One file per writer, ``<pid>-<listener id>.jsonl``: a header line naming the ledger the events
belong to (``{"offset_ledger_spool": 1, "ledger": <ledger_fingerprint>}``, no secrets), then one
``Event`` per line. The writer replays it by renaming it to ``....replay-<random>`` and deleting
that once its events are written; on an abandoned close, events still held in memory go to
``....held.jsonl``. A file whose owner is gone (a process that died, a listener that closed with
the database down) is an orphan: the next writer *of the same ledger* adopts it, oldest first per
owner. Orphans of another ledger are left alone and reported; so are files without a header
(written before spool files named their ledger): nothing proves which ledger they belong to, so
an operator says so with :func:`claim_spool_file`, and the next writer of that ledger adopts them.

Events that can never be written (unparsable, rejected by the database for good) go to a
dead-letter file next to the spool, ``dead-letter/<pid>-<listener id>.jsonl``, one JSON line per
event with the reason and the time: nothing the listener accepted is dropped silently.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

# Listener ids with a running writer in this process: their spool files are not orphans.
_LIVE: set[str] = set()

END_OF_REPLAY = "_end_of_replay"
_HEADER_KEY = "offset_ledger_spool"
DEAD_LETTER_DIR = "dead-letter"


def header_line(ledger: str) -> str:
    return json.dumps({_HEADER_KEY: 1, "ledger": ledger}, separators=(",", ":")) + "\n"


def _header_ledger(line: str) -> tuple[bool, str | None]:
    """(is a header, its ledger) of one spool line."""
    try:
        doc = json.loads(line)
    except ValueError:
        return False, None
    if isinstance(doc, dict) and _HEADER_KEY in doc:
        return True, str(doc.get("ledger")) if doc.get("ledger") else None
    return False, None


def file_ledger(path: Path) -> tuple[bool, str | None]:
    """(has a header, the ledger it names) of a spool file; (True, None) for an empty file."""
    with path.open("r", encoding="utf-8") as f:
        first = f.readline()
    if not first.strip():
        return True, None  # nothing in it to misplace
    return _header_ledger(first)


class Event(NamedTuple):
    """One listener event as received: its JSON text plus the settings of the listener that got it."""

    kind: str
    payload: str
    received_at: float
    pipeline: str | None
    consumer_group: str | None
    app_version: str | None

    def to_line(self) -> str:
        return json.dumps(self._asdict(), separators=(",", ":")) + "\n"

    @classmethod
    def from_line(cls, line: str) -> Event:
        return cls(**json.loads(line))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Spool:
    """One writer's spool file, the replay of spooled files, and the search for orphans.

    Not thread-safe on its own: the writer calls :meth:`append` and :meth:`detach` under its lock.
    """

    def __init__(self, spool_dir: Path, listener_id: str, ledger: str) -> None:
        self.dir = Path(spool_dir)
        self.listener_id = listener_id
        self.ledger = ledger
        self.path = self.dir / f"{os.getpid()}-{listener_id}.jsonl"
        self.dead_letter_path = self.dir / DEAD_LETTER_DIR / f"{os.getpid()}-{listener_id}.jsonl"
        self._file: Any = None
        # While active every new event goes to the file, so replay keeps event order.
        self.active = False
        self.replaying: Path | None = None
        self._replay_lines: Iterator[str] | None = None
        _LIVE.add(listener_id)

    def release(self) -> None:
        """This writer stopped: its files (if any) become orphans for the next writer."""
        _LIVE.discard(self.listener_id)

    # ------------------------------------------------------------------ spilling

    def append(self, event: Event) -> None:
        if self._file is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            if self._file.tell() == 0:
                self._file.write(header_line(self.ledger))
        self._file.write(event.to_line())
        self._file.flush()
        self.active = True

    def close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    # ------------------------------------------------------------------ replay

    @property
    def replay_open(self) -> bool:
        return self._replay_lines is not None

    def detach(self) -> Path | None:
        """Take the spool file for replay (renamed); None, and spooling over, when it is empty."""
        self.close_file()
        if not self.path.exists() or self.path.stat().st_size == 0:
            self.path.unlink(missing_ok=True)
            self.active = False  # nothing left: callbacks may use the queue again
            return None
        replay = self.path.with_suffix(f".replay-{uuid.uuid4().hex[:6]}")
        self.path.rename(replay)
        return replay

    def open_replay(self, path: Path) -> None:
        self.replaying = path
        self._replay_lines = iter(path.open("r", encoding="utf-8"))

    def read_replay(self, max_events: int, on_unreadable: Callable[[str, Exception], None]) -> list[Event]:
        """Up to ``max_events`` events of the file being replayed; at its end, an END_OF_REPLAY marker."""
        events: list[Event] = []
        assert self._replay_lines is not None
        for line in self._replay_lines:
            if not line.strip() or _header_ledger(line)[0]:
                continue
            try:
                events.append(Event.from_line(line))
            except (ValueError, TypeError) as exc:
                on_unreadable(line, exc)
            if len(events) >= max_events:
                return events
        # End of file: it is deleted once these last events are written (see EventWriter._write).
        self._replay_lines = None
        if not events:
            self.finish_replay()
        else:
            events.append(Event(END_OF_REPLAY, "", 0.0, None, None, None))
        return events

    def finish_replay(self) -> None:
        if self.replaying is not None:
            self.replaying.unlink(missing_ok=True)
            self.replaying = None

    def abandon_replay(self) -> bool:
        """Stop replaying; the file stays on disk under its replay name, adopted later. True if one was open."""
        if self.replaying is None:
            return False
        self._replay_lines = None
        self.replaying = None
        return True

    def hold(self, events: list[Event]) -> None:
        """Keep events held in memory at an abandoned close: a file that sorts before this spool's."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".held.jsonl"), "a", encoding="utf-8") as out:
            if out.tell() == 0:
                out.write(header_line(self.ledger))
            out.writelines(e.to_line() for e in events)

    # ------------------------------------------------------------------ dead letters

    def dead_letter(self, error: str, event: Event | None = None, line: str | None = None,
                    kind: str | None = None) -> None:
        """Keep an event that can never be written, with the reason: one JSON line, flushed."""
        entry = {"at": datetime.now(timezone.utc).isoformat(), "error": error, "ledger": self.ledger,
                 "listener_id": self.listener_id, "kind": event.kind if event is not None else kind,
                 "event": event._asdict() if event is not None else None, "line": line}
        self.dead_letter_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.dead_letter_path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry, separators=(",", ":")) + "\n")

    # ------------------------------------------------------------------ orphans

    def orphans(self) -> Orphans:
        """Spool files of writers that are gone, per owner oldest first: this ledger's, and the others."""
        found = Orphans()
        if not self.dir.is_dir():
            return found

        def order(path: Path) -> tuple[str, int]:
            # Per owner, oldest first: a half-replayed file, then events held at close, then the spool.
            rank = 0 if ".replay-" in path.name else 1 if path.name.endswith(".held.jsonl") else 2
            return path.name.split(".", 1)[0], rank

        paths = sorted(self.dir.glob("*.jsonl"), key=order)
        paths = sorted([*paths, *self.dir.glob("*.replay-*")], key=order)
        for path in paths:
            pid, _, rest = path.name.partition("-")
            owner = rest.split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and _pid_alive(int(pid)):
                continue  # another live process's listener
            if pid.isdigit() and int(pid) == os.getpid() and owner in _LIVE:
                continue  # a live listener of this process (ourselves included)
            try:
                marked, ledger = file_ledger(path)
            except OSError:
                continue  # gone meanwhile (another writer adopted it), or unreadable: not ours to take
            if marked and ledger in (None, self.ledger):
                found.mine.append(path)
            else:
                found.foreign.append(path)  # another ledger's, or unmarked: left where it is
        return found


@dataclass
class Orphans:
    """Orphaned spool files: ``mine`` to adopt, ``foreign`` (another ledger's, or unmarked) to leave."""

    mine: list[Path] = field(default_factory=list)
    foreign: list[Path] = field(default_factory=list)


def take_lines(path: Path) -> list[str] | None:
    """Read and delete an orphaned spool file (its header dropped); None when it cannot be."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        path.unlink()
    except OSError:
        return None
    return [line for line in lines if line.strip() and not _header_ledger(line)[0]]


def claim_spool_file(path: str | Path, dsn: str | None = None) -> Path:
    """Declare that an unmarked spool file (written before files named their ledger) belongs to ``dsn``.

    Writes the ledger header in front of its events (atomically: a new file renamed over it); the
    next listener of that ledger adopts it. Refuses a file that already names a ledger.
    """
    from offset_ledger.errors import InvalidInput
    from offset_ledger.ledger.engine import ledger_fingerprint

    path = Path(path)
    marked, ledger = file_ledger(path)
    if marked:
        raise InvalidInput(f"spool file {path} already belongs to ledger {ledger!r}", path=str(path),
                           ledger=ledger)
    staged = path.with_name(path.name + ".claim")
    staged.write_text(header_line(ledger_fingerprint(dsn)) + path.read_text(encoding="utf-8"), encoding="utf-8")
    staged.replace(path)
    return path
