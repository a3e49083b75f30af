"""Reading committed batches back from real Spark checkpoints (tests/fixtures: 3.5.7, 4.0.0, 4.2.0)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from offset_ledger.capture.checkpoint_files import LocalFiles
from offset_ledger.capture.reconcile import CHECKPOINT_SOURCE, batch_records, checkpoint_run_id
from offset_ledger.rules.checkpoint import committed_batch_ids, read_checkpoint, read_committed_batches

FIXTURES = Path(__file__).parents[2] / "fixtures" / "checkpoints"
CASES = sorted(p for p in FIXTURES.glob("spark-*/kafka-one"))


def _offsets_line(path: Path) -> dict[str, dict[str, int]]:
    lines = path.read_text().splitlines()
    line = lines[2]
    if lines[0].strip() == "v2":
        line = line.split(":", 1)[1]
    return json.loads(line)


@pytest.mark.parametrize("location", CASES, ids=lambda p: p.parent.name)
def test_every_committed_batch_reads_back_as_the_files_say(location: Path) -> None:
    files = LocalFiles(str(location))
    ids = committed_batch_ids(files)
    assert ids == sorted(int(p.name) for p in (location / "commits").iterdir() if p.name.isdigit())
    query_id, batches = read_committed_batches(str(location), files)
    assert query_id == read_checkpoint(str(location), files).query_id
    assert [b.batch_id for b in batches] == ids
    records = batch_records("orders", "orders", query_id or "", batches, fallback_time=datetime.now(timezone.utc))
    for rec, batch_id in zip(records, ids):
        ends = _offsets_line(location / "offsets" / str(batch_id))
        got = {(r.topic, str(r.partition)): r for s in rec.batch.sources for r in s.ranges}
        assert {k: r.until_offset for k, r in got.items()} == {(t, p): o for t, ps in ends.items() for p, o in ps.items()}
        if batch_id > 0:
            before = _offsets_line(location / "offsets" / str(batch_id - 1))
            assert {k: r.from_offset for k, r in got.items()} == {
                (t, p): o for t, ps in before.items() for p, o in ps.items()}
        else:
            assert all(r.from_offset is not None for r in got.values())  # the initial offsets
        assert rec.batch.recorded_by == CHECKPOINT_SOURCE and rec.batch.run_id == checkpoint_run_id(query_id or "")
    # Only what the ledger lacks is read.
    _, some = read_committed_batches(str(location), files, only={ids[-1]})
    assert [b.batch_id for b in some] == [ids[-1]]


def test_a_checkpoint_spark_never_wrote_is_empty_not_an_error(tmp_path: Path) -> None:
    assert read_committed_batches(str(tmp_path), LocalFiles(str(tmp_path))) == (None, [])


def test_serve_watchers_record_a_checkpoint_and_stop(tmp_path: Path) -> None:
    import time

    from sqlalchemy import text

    from offset_ledger.cli.watch import parse_watch_specs, start_watchers
    from offset_ledger.errors import ConfigError
    from offset_ledger.ledger.engine import make_engine

    location = CASES[-1]
    with pytest.raises(ConfigError, match="PIPELINE=CHECKPOINT"):
        parse_watch_specs(["orders"])
    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"
    from offset_ledger.addresses import LedgerAddress

    stop = start_watchers(parse_watch_specs([f"orders={location}"]), LedgerAddress.resolve(dsn))
    engine = make_engine(dsn)
    try:
        deadline = time.monotonic() + 20
        count = 0
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                count = conn.execute(text("SELECT count(*) FROM batches WHERE source = 'checkpoint'")).scalar() or 0
            if count == len(committed_batch_ids(LocalFiles(str(location)))):
                break
            time.sleep(0.1)
        assert count == len(committed_batch_ids(LocalFiles(str(location)))) > 0
    finally:
        stop()
        engine.dispose()


REALTIME = FIXTURES / "realtime-spark-4.2.0" / "kafka-one"  # trigger(realTime="5 seconds"), Kafka to Kafka


def test_a_realtime_checkpoints_empty_batches_are_recorded_without_a_finding(tmp_path: Path) -> None:
    """Batch 0 read 70 records; batches 1 and 2 were quiet 5-second batches (the listener hears
    them as heartbeats and records no batch). A restart records them; only a batch that moved data is news."""
    import shutil

    from sqlalchemy import text

    from offset_ledger.capture.reconcile import reconcile
    from offset_ledger.ledger.engine import ensure_schema, make_engine

    early = tmp_path / "ck"  # the same checkpoint when batch 0 had just committed
    shutil.copytree(REALTIME, early)
    for kind in ("offsets", "commits"):
        for n in ("1", "2"):
            (early / kind / n).unlink()
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    try:
        first = reconcile(engine, str(early), pipeline="rt", consumer_group="rt")
        assert first.backfilled == (0,) and [f.details["batch_ids"] for f in first.findings] == [[0]]
        again = reconcile(engine, str(REALTIME), pipeline="rt", consumer_group="rt")
        assert again.backfilled == (1, 2) and again.findings == ()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM findings WHERE kind = 'backfilled'")).scalar() == 1
            assert conn.execute(text("SELECT count(*) FROM batches")).scalar() == 3
    finally:
        engine.dispose()
