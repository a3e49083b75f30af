"""The spool knows its ledger, and nothing accepted is dropped: adoption by ledger, dead letters."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from offset_ledger.capture.spool import Event, claim, ledger_id, spool_ledger
from offset_ledger.errors import InvalidInput
from tests.unit.capture.test_writer import FakeStore, ev, progress, writer

PG = "postgresql+psycopg2://etl:s3cret-pw@db.example.com:5432/ledger"


# ----------------------------------------------------------------------------- the fingerprint

def test_the_ledger_id_never_holds_a_user_or_password() -> None:
    lid = ledger_id(PG)
    assert lid.identity == "postgresql://db.example.com:5432/ledger"
    assert "s3cret" not in lid.identity + lid.fingerprint and "etl" not in lid.identity
    assert "s3cret" not in ledger_id("not a url with s3cret-pw").identity


@pytest.mark.parametrize("same", [
    "postgresql://other:different@db.example.com/ledger",          # another user, the default port
    "postgresql+psycopg2://etl@DB.example.com:5432/ledger",         # host case, no password
    "postgresql+psycopg://etl:x@db.example.com:5432/ledger?sslmode=require",  # driver, options
])
def test_the_same_database_gives_the_same_fingerprint(same: str) -> None:
    assert ledger_id(same).fingerprint == ledger_id(PG).fingerprint


@pytest.mark.parametrize("other", [
    "postgresql://etl:s3cret-pw@db.example.com:5432/ledger2",      # another database
    "postgresql://etl:s3cret-pw@db2.example.com:5432/ledger",      # another server
    "postgresql://etl:s3cret-pw@db.example.com:5433/ledger",       # another port
    "sqlite:////var/lib/ledger",
])
def test_another_database_gives_another_fingerprint(other: str) -> None:
    assert ledger_id(other).fingerprint != ledger_id(PG).fingerprint


def test_sqlite_is_identified_by_its_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert ledger_id("sqlite:///ledger.db") == ledger_id(f"sqlite:///{tmp_path / 'ledger.db'}")
    assert ledger_id("sqlite:///ledger.db").identity == f"sqlite://{tmp_path / 'ledger.db'}"
    assert ledger_id("sqlite:///a.db") != ledger_id("sqlite:///b.db")


# ----------------------------------------------------------------------------- adoption

def _spill_while_down(tmp_path: Path, dsn: str, n: int) -> FakeStore:
    store = FakeStore()
    store.down.set()
    w = writer(store, tmp_path, queue_size=2, ledger=dsn)
    for i in range(n):
        w.submit(ev("progress", progress(i)))
    assert not w.close(0.3)
    return store


def _spool_files(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "spool").iterdir() if p.is_file())


def test_only_a_writer_of_the_same_ledger_adopts_an_orphan(tmp_path: Path) -> None:
    _spill_while_down(tmp_path, PG, 6)
    files = _spool_files(tmp_path)
    assert files and all(spool_ledger(p) == (ledger_id(PG).fingerprint, ledger_id(PG).identity) for p in files)

    other_store = FakeStore()
    other = writer(other_store, tmp_path, ledger="postgresql://u:p@db.example.com:5432/other")
    health = other.health()
    assert other.close(5)
    assert other_store.records == []  # its ledger gets nothing
    assert _spool_files(tmp_path) == files  # left untouched
    assert health.foreign_spool_files == len(files)
    assert sorted(health.foreign_spool_paths) == [str(p) for p in files]

    own_store = FakeStore()
    own = writer(own_store, tmp_path, ledger="postgresql://etl:rotated@db.example.com/ledger")
    assert own.health().foreign_spool_files == 0
    assert own.close(5)
    assert own_store.batch_ids() == list(range(6))
    assert _spool_files(tmp_path) == []


def _old_format_file(tmp_path: Path, n: int) -> Path:
    """A spool file as written before spool files named their ledger: event lines only."""
    spool = tmp_path / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    path = spool / "999999999-0123456789abcdef.jsonl"  # no such pid: an orphan
    path.write_text("".join(ev("progress", progress(i)).to_line() for i in range(n)))
    return path


def test_an_old_format_file_is_never_adopted_until_claimed(tmp_path: Path) -> None:
    path = _old_format_file(tmp_path, 3)
    store = FakeStore()
    w = writer(store, tmp_path, ledger=PG)
    assert w.health().foreign_spool_paths == (str(path),)
    assert w.close(5)
    assert store.records == [] and path.exists()

    assert claim(path, PG) == ledger_id(PG)
    with pytest.raises(InvalidInput, match="already belongs to a ledger"):
        claim(path, "postgresql://u:p@elsewhere/x")
    again = FakeStore()
    assert writer(again, tmp_path, ledger=PG).close(5)
    assert again.batch_ids() == [0, 1, 2] and not path.exists()


# ----------------------------------------------------------------------------- dead letters

def _dead_letters(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((tmp_path / "spool" / "dead-letter").glob("*.jsonl"))
            for line in p.read_text().splitlines()]


def test_a_rejected_event_is_dead_lettered_with_its_reason_never_dropped(tmp_path: Path) -> None:
    store = FakeStore()
    store.reject_batch = 1
    w = writer(store, tmp_path, autostart=False, ledger=PG)
    for i in range(3):
        w.submit(ev("progress", progress(i)))
    w.submit(ev("progress", "{not json"))
    w.start()
    assert w.close(5)
    assert store.batch_ids() == [0, 2]
    health = w.health()
    assert (health.failed, health.written) == (2, 2)
    dead = sorted(_dead_letters(tmp_path), key=lambda d: d["error"].startswith("unparsable"))
    assert health.dead_letter_path == str(tmp_path / "spool" / "dead-letter" / f"{os.getpid()}-{w.listener_id}.jsonl")
    assert [Event(**d["event"]).payload for d in dead] == [progress(1), "{not json"]
    assert "value out of range" in dead[0]["error"] and "unparsable" in dead[1]["error"]
    assert all(d["at"] and d["ledger"] == ledger_id(PG).identity for d in dead)
    assert "s3cret" not in json.dumps(dead)


def test_retriable_errors_are_retried_not_dead_lettered(tmp_path: Path) -> None:
    store = FakeStore()
    store.down.set()
    w = writer(store, tmp_path, ledger=PG)
    for i in range(5):
        w.submit(ev("progress", progress(i)))
    assert not w.flush(0.3)
    assert w.health().retried > 0 and w.health().failed == 0
    store.down.clear()
    assert w.close(5)
    assert store.batch_ids() == list(range(5)) and w.health().failed == 0
    assert not (tmp_path / "spool" / "dead-letter").exists()


def test_an_unreadable_spool_line_is_dead_lettered_too(tmp_path: Path) -> None:
    _spill_while_down(tmp_path, PG, 3)
    path = _spool_files(tmp_path)[-1]
    with path.open("a") as f:
        f.write("{torn line\n")
    store = FakeStore()
    w = writer(store, tmp_path, ledger=PG)
    assert w.close(5)
    assert store.batch_ids() == [0, 1, 2]
    (dead,) = _dead_letters(tmp_path)
    assert dead["line"] == "{torn line" and dead["event"] is None and w.health().failed == 1


class _Broken:
    @property
    def progress(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("py4j gone")


def test_a_callback_that_cannot_read_its_event_leaves_a_dead_letter(tmp_path: Path) -> None:
    from offset_ledger.capture.listener import OffsetLedgerListener

    store = FakeStore()
    listener = OffsetLedgerListener(dsn=PG, pipeline="orders", spool_dir=tmp_path / "spool",
                                    store_factory=lambda: store)
    listener.onQueryProgress(_Broken())
    listener.accept_json("progress", progress(0))
    assert listener.close(5)
    health = listener.health()
    assert store.batch_ids() == [0] and health.failed == 1 and health.ledger == ledger_id(PG).identity
    (dead,) = _dead_letters(tmp_path)
    assert "progress callback failed" in dead["error"] and "py4j gone" in dead["error"]
    assert health.dead_letter_path and Path(health.dead_letter_path).exists()
