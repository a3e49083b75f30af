"""The listener's spool: events kept on local disk while the queue is full or the ledger is down.

One writer owns one spool file (``<pid>-<listener id>.jsonl``). While it spools, every new event
goes to that file, so that replay keeps event order; the writer moves the file aside
(``.replay-<x>``) and reads it back once its queue is empty. At an abandoned close the events the
writer still held go to ``.held.jsonl``. A later writer adopts the files of a process that is gone
(orphans). The writer's lock guards the live file; this module never takes it.

A spool file belongs to one ledger. Its first line names it (:func:`ledger_id`: dialect, host,
port and database of the DSN, or the SQLite file's absolute path, never a user or password), and
a writer adopts only orphans of its own ledger. Files of other ledgers are left where they are and
reported (``ListenerHealth.foreign_spool_paths``). A file without that line (written before spool
files named their ledger) is never adopted either: which ledger it was meant for cannot be known,
and a wrong guess writes another pipeline's batches into this ledger. It is reported the same way;
:func:`claim` gives it a ledger when an operator knows which one it is.

Events the ledger rejects for good go to a dead-letter file beside the spool
(``dead-letter/<pid>-<listener id>.jsonl``), one JSON line each, with the error and the time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from offset_ledger.errors import InvalidInput
from offset_ledger.pids import pid_exists

log = logging.getLogger(__name__)

# Listener ids with a running writer in this process: their spool files are not orphans.
LIVE_WRITERS: set[str] = set()


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


_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306, "mssql": 1433, "oracle": 1521}
_HEADER = '{"spool":'


@dataclass(frozen=True)
class LedgerId:
    """Which ledger database a DSN points at, without its secrets: ``identity`` is safe to show."""

    identity: str

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.identity.encode()).hexdigest()[:20]


def ledger_id(dsn: str) -> LedgerId:
    """The ledger behind ``dsn``: the same database gives the same id whatever the driver, user or password."""
    try:
        url = make_url(dsn)
    except ArgumentError:
        # Not a URL (the writer will say so); the text may hold a password, so only its hash is kept.
        return LedgerId("unparsable-dsn:" + hashlib.sha256(dsn.encode()).hexdigest()[:20])
    backend = url.get_backend_name()
    if backend == "sqlite":
        database = url.database or ":memory:"
        if database != ":memory:" and not database.startswith("file:"):
            database = str(Path(database).expanduser().resolve())
        return LedgerId(f"sqlite://{database}")
    query = dict(url.query)
    host = url.host or str(query.get("host") or "")  # libpq takes a socket directory as ?host=
    port = url.port or (int(str(query["port"])) if str(query.get("port", "")).isdigit() else None)
    port = port or _DEFAULT_PORTS.get(backend)
    return LedgerId(f"{backend}://{host.lower()}:{port or ''}/{url.database or ''}")


def _header(ledger: LedgerId) -> str:
    return json.dumps({"spool": 1, "ledger": ledger.fingerprint, "ledger_identity": ledger.identity},
                      separators=(",", ":")) + "\n"


def spool_ledger(path: Path) -> tuple[str, str] | None:
    """(fingerprint, identity) of the ledger a spool file belongs to; None when it does not say."""
    with path.open("r", encoding="utf-8") as f:
        first = f.readline()
    if not first.startswith(_HEADER):
        return None
    doc = json.loads(first)
    return str(doc["ledger"]), str(doc.get("ledger_identity", ""))


def claim(path: str | Path, dsn: str) -> LedgerId:
    """Give a spool file that names no ledger (an older format) the ledger of ``dsn``.

    The next listener of that ledger then adopts it. Refused for a file that already names one.
    """
    path = Path(path)
    if spool_ledger(path) is not None:
        raise InvalidInput(f"spool file {path} already belongs to a ledger; it is adopted by that ledger's "
                           "listeners only", path=str(path))
    ledger = ledger_id(dsn)
    claimed = path.with_name(path.name + ".claiming")
    claimed.write_text(_header(ledger) + path.read_text(encoding="utf-8"), encoding="utf-8")
    claimed.replace(path)
    return ledger


def is_header(line: str) -> bool:
    return line.startswith(_HEADER)


class Spool:
    """One writer's spool files in ``directory``: the live file, its replay, held events, orphans."""

    def __init__(self, directory: Path, listener_id: str, ledger: LedgerId) -> None:
        self.directory = Path(directory)
        self.listener_id = listener_id
        self.ledger = ledger
        self.path = self.directory / f"{os.getpid()}-{listener_id}.jsonl"
        self.dead_letter_path = self.directory / "dead-letter" / f"{os.getpid()}-{listener_id}.jsonl"
        self._dead_lock = threading.Lock()  # callbacks and the writer thread both dead-letter
        self._file: Any = None
        self.replaying: Path | None = None
        self._lines: Iterator[str] | None = None

    # ------------------------------------------------------------------ the live file

    def append(self, event: Event) -> None:
        if self._file is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            if self._file.tell() == 0:
                self._file.write(_header(self.ledger))
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
            if not line.strip() or line.startswith(_HEADER):
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
            if out.tell() == 0:
                out.write(_header(self.ledger))
            out.writelines(e.to_line() for e in events)

    def dead_letter(self, error: str, event: Event | None = None, line: str | None = None) -> Path:
        """Keep an event the ledger will never take (or an unreadable spool line) with its reason."""
        entry = {"at": datetime.now(timezone.utc).isoformat(), "error": error, "listener_id": self.listener_id,
                 "ledger": self.ledger.identity, "event": event._asdict() if event is not None else None}
        if line is not None:
            entry["line"] = line.rstrip("\n")
        with self._dead_lock:
            self.dead_letter_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.dead_letter_path, "a", encoding="utf-8") as out:
                out.write(json.dumps(entry, separators=(",", ":"), default=str) + "\n")
        return self.dead_letter_path

    # ------------------------------------------------------------------ orphans

    def orphans(self) -> Iterator[Path]:
        """Spool files left by a process that died or closed with the database down, oldest first.

        Of every ledger: the caller asks :func:`spool_ledger` which of them are its own.
        """
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
            if pid.isdigit() and int(pid) != os.getpid() and pid_exists(int(pid)):
                continue  # another live process's listener
            if pid.isdigit() and int(pid) == os.getpid() and owner in LIVE_WRITERS:
                continue  # a live listener of this process (ourselves included)
            yield path

    def adopt_orphans(self) -> tuple[list[tuple[Path, list[Event], list[tuple[str, Exception]]]], list[str]]:
        """Take the orphans of this ledger off disk: (path, events, unreadable lines) each; and the
        paths of the others (another ledger's, or naming none), which stay where they are."""
        adopted: list[tuple[Path, list[Event], list[tuple[str, Exception]]]] = []
        foreign: list[str] = []
        for path in self.orphans():
            try:
                owner = spool_ledger(path)
                if owner is None and path.stat().st_size == 0:
                    path.unlink()
                    continue
                if owner is None or owner[0] != self.ledger.fingerprint:
                    foreign.append(str(path))
                    continue
                lines = path.read_text(encoding="utf-8").splitlines()
                path.unlink()
            except (OSError, ValueError, KeyError):
                continue
            events: list[Event] = []
            bad: list[tuple[str, Exception]] = []
            for line in lines:
                if not line.strip() or is_header(line):
                    continue
                try:
                    events.append(Event.from_line(line))
                except (ValueError, TypeError) as exc:
                    bad.append((line, exc))
            adopted.append((path, events, bad))
        return adopted, foreign
