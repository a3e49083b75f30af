"""The listener's spool: events kept on local disk while the queue is full or the ledger is down.

One writer owns one spool file (``<pid>-<listener id>.jsonl``). While it spools, every new event
goes to that file, so that replay keeps event order; the writer moves the file aside
(``.replay-<x>``) and reads it back once its queue is empty. At an abandoned close the events the
writer still held go to ``.held.jsonl``. A later writer adopts the files of a process that is gone
(orphans). The writer's lock guards the live file; this module never takes it.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

# Listener ids with a running writer in this process: their spool files are not orphans.
_LIVE: set[str] = set()


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
    """One writer's spool files in ``directory``: the live file, its replay, held events, orphans."""

    def __init__(self, directory: Path, listener_id: str) -> None:
        self.directory = Path(directory)
        self.listener_id = listener_id
        self.path = self.directory / f"{os.getpid()}-{listener_id}.jsonl"
        self._file: Any = None
        self.replaying: Path | None = None
        self._lines: Iterator[str] | None = None

    # ------------------------------------------------------------------ the live file

    def append(self, event: Event) -> None:
        if self._file is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._file.write(event.to_line())
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def take(self) -> Path | None:
        """Close the live file and move it aside for replay; None (and deleted) when it is empty."""
        self.close()
        if not self.path.exists() or self.path.stat().st_size == 0:
            self.path.unlink(missing_ok=True)
            return None
        replay = self.path.with_suffix(f".replay-{uuid.uuid4().hex[:6]}")
        self.path.rename(replay)
        return replay

    # ------------------------------------------------------------------ replay

    @property
    def replay_open(self) -> bool:
        return self._lines is not None

    def open_replay(self, path: Path) -> None:
        self.replaying = path
        self._lines = iter(path.open("r", encoding="utf-8"))

    def read(self, max_events: int) -> tuple[list[Event], list[tuple[str, Exception]], bool]:
        """Up to ``max_events`` events of the replay file, its unreadable lines, and whether it ended."""
        events: list[Event] = []
        bad: list[tuple[str, Exception]] = []
        assert self._lines is not None
        for line in self._lines:
            if not line.strip():
                continue
            try:
                events.append(Event.from_line(line))
            except (ValueError, TypeError) as exc:
                bad.append((line, exc))
            if len(events) >= max_events:
                return events, bad, False
        self._lines = None
        return events, bad, True

    def finish_replay(self) -> None:
        if self.replaying is not None:
            self.replaying.unlink(missing_ok=True)
            self.replaying = None

    def leave_replay(self) -> bool:
        """Stop replaying but leave the file on disk under its replay name (adopted later)."""
        was = self.replaying is not None
        self._lines = None
        self.replaying = None
        return was

    def write_held(self, events: list[Event]) -> None:
        """Events a closing writer still held: a file that sorts before its spool, whose events are newer."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".held.jsonl"), "a", encoding="utf-8") as out:
            out.writelines(e.to_line() for e in events)

    # ------------------------------------------------------------------ orphans

    def orphans(self) -> Iterator[Path]:
        """Spool files left by a process that died or closed with the database down, oldest first."""
        if not self.directory.is_dir():
            return

        def order(path: Path) -> tuple[str, int]:
            # Per owner, oldest first: a half-replayed file, then events held at close, then the spool.
            rank = 0 if ".replay-" in path.name else 1 if path.name.endswith(".held.jsonl") else 2
            return path.name.split(".", 1)[0], rank

        paths = sorted(self.directory.glob("*.jsonl"), key=order)
        paths = sorted([*paths, *self.directory.glob("*.replay-*")], key=order)
        for path in paths:
            pid, _, rest = path.name.partition("-")
            owner = rest.split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and _pid_alive(int(pid)):
                continue  # another live process's listener
            if pid.isdigit() and int(pid) == os.getpid() and owner in _LIVE:
                continue  # a live listener of this process (ourselves included)
            yield path
