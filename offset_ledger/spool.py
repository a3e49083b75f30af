"""The listener's spool: events spilled to a local file while the queue is full, replayed in order.

One file per writer, ``<pid>-<listener id>.jsonl`` (one ``Event`` per line). The writer replays it
by renaming it to ``....replay-<random>`` and deleting that once its events are written; on an
abandoned close, events still held in memory go to ``....held.jsonl``. A file whose owner is gone
(a process that died, a listener that closed with the database down) is an orphan: the next
writer adopts it, oldest first per owner.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

# Listener ids with a running writer in this process: their spool files are not orphans.
_LIVE: set[str] = set()

END_OF_REPLAY = "_end_of_replay"


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

    def __init__(self, spool_dir: Path, listener_id: str) -> None:
        self.dir = Path(spool_dir)
        self.listener_id = listener_id
        self.path = self.dir / f"{os.getpid()}-{listener_id}.jsonl"
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

    def read_replay(self, max_events: int, on_unreadable: Any) -> list[Event]:
        """Up to ``max_events`` events of the file being replayed; at its end, an END_OF_REPLAY marker."""
        events: list[Event] = []
        assert self._replay_lines is not None
        for line in self._replay_lines:
            if not line.strip():
                continue
            try:
                events.append(Event.from_line(line))
            except (ValueError, TypeError) as exc:
                on_unreadable(exc)
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
            out.writelines(e.to_line() for e in events)

    # ------------------------------------------------------------------ orphans

    def orphans(self) -> list[Path]:
        """Spool files of writers that are gone, per owner oldest first."""
        if not self.dir.is_dir():
            return []

        def order(path: Path) -> tuple[str, int]:
            # Per owner, oldest first: a half-replayed file, then events held at close, then the spool.
            rank = 0 if ".replay-" in path.name else 1 if path.name.endswith(".held.jsonl") else 2
            return path.name.split(".", 1)[0], rank

        paths = sorted(self.dir.glob("*.jsonl"), key=order)
        paths = sorted([*paths, *self.dir.glob("*.replay-*")], key=order)
        found = []
        for path in paths:
            pid, _, rest = path.name.partition("-")
            owner = rest.split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and _pid_alive(int(pid)):
                continue  # another live process's listener
            if pid.isdigit() and int(pid) == os.getpid() and owner in _LIVE:
                continue  # a live listener of this process (ourselves included)
            found.append(path)
        return found


def take_lines(path: Path) -> list[str] | None:
    """Read and delete an orphaned spool file; None when it cannot be (gone, unreadable)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        path.unlink()
    except OSError:
        return None
    return lines
