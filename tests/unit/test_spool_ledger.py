"""Nothing the listener accepted is lost: the spool knows its ledger, failures are dead-lettered.

In-memory stores stand in for the ledger; the real-stack side is tests/integration/test_capture_durability.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from offset_ledger.errors import InvalidInput
from offset_ledger.ledger.engine import ledger_fingerprint, translate_db_error
from offset_ledger.spool import claim_spool_file
from offset_ledger.writer import EventWriter
from tests.unit.test_writer import QID, FakeStore, ev, progress, started

PG_A = "postgresql+psycopg2://etl:s3cr3t-A@db-a.example:5432/ledger"
PG_B = "postgresql+psycopg2://etl:s3cr3t-A@db-b.example:5432/ledger"


# ----------------------------------------------------------------------------- the fingerprint

@pytest.mark.parametrize("dsn", [
    PG_A, "postgresql://etl:p%40ss%3Aword@db-a.example/ledger?sslmode=require&password=inquery",
    "postgresql+psycopg://u:hunter2@[::1]:6543/x", "sqlite:////tmp/ledger.db",
])
def test_fingerprint_holds_no_secret(dsn: str) -> None:
    fingerprint = ledger_fingerprint(dsn)
    for secret in ("s3cr3t", "p@ss", "p%40ss", "word", "inquery", "hunter2", "etl", "sslmode"):
        assert secret not in fingerprint, fingerprint


@pytest.mark.parametrize(("one", "other"), [
    (PG_A, "postgresql://someone:else@DB-A.example/ledger"),          # driver, user, password, port 5432 implied
    (PG_A, "postgresql+psycopg2://etl@db-a.example:5432/ledger?sslmode=verify-full&connect_timeout=3"),
    ("sqlite:///{tmp}/ledger.db", "sqlite:///{tmp}/sub/../ledger.db"),  # one file, two spellings
])
def test_one_ledger_one_fingerprint(one: str, other: str, tmp_path: Path) -> None:
    assert ledger_fingerprint(one.format(tmp=tmp_path)) == ledger_fingerprint(other.format(tmp=tmp_path))


@pytest.mark.parametrize(("one", "other"), [
    (PG_A, PG_B),                                                   # another server
    (PG_A, "postgresql+psycopg2://etl:s3cr3t-A@db-a.example:5433/ledger"),  # another port
    (PG_A, "postgresql+psycopg2://etl:s3cr3t-A@db-a.example:5432/ledger2"),  # another database
    ("sqlite:///{tmp}/a.db", "sqlite:///{tmp}/b.db"),
    (PG_A, "sqlite:///{tmp}/ledger.db"),
])
def test_two_ledgers_two_fingerprints(one: str, other: str, tmp_path: Path) -> None:
    assert ledger_fingerprint(one.format(tmp=tmp_path)) != ledger_fingerprint(other.format(tmp=tmp_path))


def test_a_relative_sqlite_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert ledger_fingerprint("sqlite:///ledger.db") == f"sqlite:{tmp_path.resolve() / 'ledger.db'}"


# ----------------------------------------------------------------------------- adoption

def _writer(store: FakeStore, spool: Path, dsn: str, **kw) -> EventWriter:  # type: ignore[no-untyped-def]
    return EventWriter(lambda: store, spool_dir=spool, ledger=ledger_fingerprint(dsn),
                       initial_backoff=0.01, max_backoff=0.05, **kw)


def _spill_while_down(spool: Path, dsn: str, n: int) -> list[Path]:
    """A writer of ``dsn`` that closes while its database is down: its events stay in the spool."""
    down = FakeStore()
    down.down.set()
    w = _writer(down, spool, dsn, queue_size=2)
    for i in range(n):
        w.submit(ev("progress", progress(i)))
    assert not w.close(0.3)
    files = sorted(spool.glob("*.jsonl"))
    assert files and down.batch_ids() == []
    return files


def test_only_a_writer_of_the_same_ledger_adopts_an_orphan(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    files = _spill_while_down(spool, PG_A, 6)
    before = {p: p.read_bytes() for p in files}

    other = FakeStore()
    foreign = _writer(other, spool, PG_B)
    assert foreign.close(5)
    assert other.records == []  # its ledger gets nothing
    assert {p: p.read_bytes() for p in sorted(spool.glob("*.jsonl"))} == before  # left untouched
    health = foreign.health()
    assert health.foreign_spool_files == len(files)
    assert sorted(health.foreign_spool_paths) == sorted(str(p) for p in files)
    assert health.failed == 0 and health.ledger == ledger_fingerprint(PG_B)

    own = FakeStore()
    same = _writer(own, spool, "postgresql://other-user:other-pw@DB-A.example/ledger")  # same ledger, spelt otherwise
    assert same.close(5)
    assert own.batch_ids() == list(range(6))
    assert same.health().foreign_spool_files == 0
    assert list(spool.glob("*.jsonl")) == []


def test_an_unmarked_spool_file_is_not_adopted_until_claimed(tmp_path: Path) -> None:
    # A file from before spool files named their ledger: nothing says whose it is.
    spool = tmp_path / "spool"
    spool.mkdir()
    old = spool / "999999-0123456789abcdef0123456789abcdef.jsonl"
    old.write_text("".join(ev("progress", progress(i)).to_line() for i in range(3)))
    content = old.read_bytes()

    store = FakeStore()
    w = _writer(store, spool, PG_A)
    assert w.close(5)
    assert store.records == [] and old.read_bytes() == content
    assert w.health().foreign_spool_paths == (str(old),)

    claim_spool_file(old, PG_A)
    with pytest.raises(InvalidInput, match="already belongs"):
        claim_spool_file(old, PG_B)  # claimed once; never re-labelled
    untouched = FakeStore()
    assert _writer(untouched, spool, PG_B).close(5)
    assert untouched.records == []
    claimed = FakeStore()
    assert _writer(claimed, spool, PG_A).close(5)
    assert claimed.batch_ids() == [0, 1, 2]
    assert not old.exists()


# ----------------------------------------------------------------------------- dead letters

def _dead_letters(w: EventWriter) -> list[dict]:
    path = w.health().dead_letter_path
    assert path is not None
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_an_unparsable_event_is_dead_lettered_with_its_reason(tmp_path: Path) -> None:
    store = FakeStore()
    w = _writer(store, tmp_path / "spool", PG_A)
    w.submit(ev("progress", progress(0)))
    w.submit(ev("progress", "{not json"))
    w.submit(ev("progress", progress(1)))
    assert w.close(5)
    assert store.batch_ids() == [0, 1]
    (entry,) = _dead_letters(w)
    assert "unparsable" in entry["error"] and entry["event"]["payload"] == "{not json"
    assert entry["ledger"] == ledger_fingerprint(PG_A) and entry["at"]
    assert w.health().failed == 1


def test_a_record_the_ledger_rejects_for_good_is_dead_lettered(tmp_path: Path) -> None:
    store = FakeStore()
    store.reject_batch = 1
    w = _writer(store, tmp_path / "spool", PG_A, autostart=False)
    for i in range(3):
        w.submit(ev("progress", progress(i)))
    w.start()
    assert w.close(5)
    assert store.batch_ids() == [0, 2]
    (entry,) = _dead_letters(w)
    assert "rejected" in entry["error"] and json.loads(entry["event"]["payload"])["batchId"] == 1
    health = w.health()
    assert (health.written, health.failed, health.pending) == (2, 1, 0)


def test_an_unreadable_spool_line_is_dead_lettered(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    files = _spill_while_down(spool, PG_A, 3)
    with files[-1].open("a") as f:
        f.write("{truncated by a crash\n")
    store = FakeStore()
    w = _writer(store, spool, PG_A)
    assert w.close(5)
    assert store.batch_ids() == [0, 1, 2]
    (entry,) = _dead_letters(w)
    assert entry["line"] == "{truncated by a crash" and "unreadable" in entry["error"]


class _ReadOnlyOnce(FakeStore):
    """Answers the first ``n`` writes as a read-only Postgres does during a failover (SQLSTATE 25006)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.refusals = n

    def record(self, records):  # type: ignore[no-untyped-def]
        if self.refusals:
            self.refusals -= 1
            raise translate_db_error(_read_only_error(), "writing")
        return super().record(records)


def _read_only_error() -> Exception:
    import psycopg2
    import psycopg2.errors
    from sqlalchemy.exc import DBAPIError

    orig = psycopg2.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction")
    orig.__setstate__({"pgcode": "25006", "pgerror": str(orig)})
    return DBAPIError.instance("INSERT ...", {}, orig, psycopg2.Error)


def test_a_read_only_ledger_is_retried_not_dead_lettered(tmp_path: Path) -> None:
    store = _ReadOnlyOnce(5)
    w = _writer(store, tmp_path / "spool", PG_A)
    w.submit(ev("started", started()))
    for i in range(4):
        w.submit(ev("progress", progress(i)))
    assert w.close(5)
    assert store.batch_ids() == [0, 1, 2, 3]
    health = w.health()
    assert (health.failed, health.retried, health.dead_letter_path) == (0, 5, None)
    assert not (tmp_path / "spool" / "dead-letter").exists()


def test_every_accepted_event_is_written_skipped_or_dead_lettered(tmp_path: Path) -> None:
    store = FakeStore()
    store.reject_batch = 2
    w = _writer(store, tmp_path / "spool", PG_A, queue_size=3)
    w.submit(ev("started", started()))
    for i in range(6):
        w.submit(ev("progress", progress(i)))
    w.submit(ev("progress", "[]"))
    w.submit(ev("progress", progress(9, name=None, query="44444444-4444-4444-4444-444444444444")))
    assert w.close(5)
    h = w.health()
    assert h.pending == 0
    assert h.written + h.skipped + h.failed == 9 and h.failed == len(_dead_letters(w)) == 2
    assert w.settled_batch(QID) == 5


def test_a_failing_pipeline_mapping_is_not_a_failed_event(tmp_path: Path) -> None:
    def broken(name: str) -> str:
        raise KeyError(name)

    store = FakeStore()
    w = _writer(store, tmp_path / "spool", PG_A, pipeline_of=broken)
    w.submit(ev("progress", progress(0)))
    assert w.close(5)
    assert store.batch_ids() == [0]  # recorded under the query name
    assert w.health().failed == 0 and "mapping failed" in (w.health().last_error or "")


def test_the_listener_names_its_ledger_and_dead_letters_callback_failures(tmp_path: Path) -> None:
    from offset_ledger.listener import OffsetLedgerListener

    class Broken:
        @property
        def progress(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("py4j gone")

    store = FakeStore()
    listener = OffsetLedgerListener(dsn=PG_A, pipeline="orders", spool_dir=tmp_path, store_factory=lambda: store)
    listener.onQueryProgress(Broken())
    listener.accept_json("progress", progress(0))
    assert listener.close(5)
    health = listener.health()
    assert health.ledger == "postgresql://db-a.example:5432/ledger"
    assert health.failed == 1 and store.batch_ids() == [0]
    (entry,) = [json.loads(x) for x in Path(health.dead_letter_path or "").read_text().splitlines()]
    assert entry["kind"] == "progress" and "py4j gone" in entry["error"] and entry["event"] is None


def test_dead_letter_entries_are_timestamped_now(tmp_path: Path) -> None:
    store = FakeStore()
    w = _writer(store, tmp_path / "spool", PG_A)
    before = time.time()
    w.submit(ev("idle", "{}"))
    assert w.close(5)
    from datetime import datetime

    (entry,) = _dead_letters(w)
    assert before - 1 <= datetime.fromisoformat(entry["at"]).timestamp() <= time.time() + 1
