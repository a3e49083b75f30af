"""What a recorded partition-offset costs on PostgreSQL: the compact layout (0016) beside the
per-partition one (0014), measured in the same run; and the 0016 migration's time.

- stored bytes per partition-offset: ``pg_total_relation_size`` (table + indexes + TOAST) of
  ``offset_ranges`` vs ``batch_offsets`` after VACUUM, N partition-offsets (batches of 100
  partitions, realistic offsets: large, growing by a few hundred a batch); ``batches`` is the same
  in both layouts and printed apart;
- WAL per 100-partition batch: ``pg_current_wal_insert_lsn()`` before and after K batches recorded one per
  call by the real recorders (this tree's for the compact layout, the previous release's, extracted
  with ``git archive 4cc5ce0``, for the per-partition one), batches row, positions and run included.
  WAL is cluster-wide: run it alone (``flock /tmp/offset-ledger-stack.lock``);
- the migration 0014 -> 0016 of M partition-offsets, timed, its progress printed;
- ``--wal-breakdown`` (alone): the WAL per batch of the last release's writers beside this tree's (the
  recorder one batch a call, five a call, and the listener's EventWriter fed progress events), each
  broken down by resource manager, record type and relation with pg_walinspect (PostgreSQL 15+).

    python benchmarks/bench_storage.py --dsn postgresql+psycopg2://postgres@127.0.0.1:5432/postgres \
        [--offsets 1000000] [--wal-batches 200] [--migrate 10000000] [--wal-breakdown]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from offset_ledger.ledger.engine import make_engine, upgrade  # noqa: E402

PARTITIONS = 100

_BATCHES = """
INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at, input_rows)
SELECT 'orders-' || (g % 200), 'orders-' || (g % 200), 'q-' || (g % 200) || '-7f3c2a9e-1b4d-4c8e-9a61', 'r-' || (g % 200),
       g / 200, timestamptz '2026-11-01' + g * interval '25 ms', timestamptz '2026-11-01' + g * interval '25 ms', 50000
FROM generate_series(0, :n - 1) g
"""

_OLD_ROWS = """
INSERT INTO batch_offsets (pipeline, consumer_group, query_id, batch_id, source_index, topic, "partition",
                           from_offset, until_offset, batch_time)
SELECT b.pipeline, b.consumer_group, b.query_id, b.batch_id, 0, 'orders', p,
       1000000000 + b.batch_id * 500 + p * 7, 1000000000 + (b.batch_id + 1) * 500 + p * 7 + (b.id % 13), b.batch_time
FROM batches b CROSS JOIN generate_series(0, 99) p
WHERE b.id > :lo AND b.id <= :hi
"""

_NEW_ROWS = """
INSERT INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
SELECT b.id, 0, 'orders', array_agg(p ORDER BY p), array_agg(1000000000 + b.batch_id * 500 + p * 7 ORDER BY p),
       array_agg(1000000000 + (b.batch_id + 1) * 500 + p * 7 + (b.id % 13) ORDER BY p)
FROM batches b CROSS JOIN generate_series(0, 99) p
WHERE b.id > :lo AND b.id <= :hi
GROUP BY b.id
"""

# Run under the layout's own release (PYTHONPATH): K batches of 100 partitions, one record() call each.
_WAL = r"""
import sys
from datetime import datetime, timedelta, timezone
from sqlalchemy import text
from offset_ledger.ledger.engine import make_engine
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress
dsn, k = sys.argv[1], int(sys.argv[2])
fold = int(sys.argv[3]) if len(sys.argv) > 3 else 1  # batches per record() call (a writer that fell behind)
t0 = datetime(2026, 11, 26, tzinfo=timezone.utc)
engine = make_engine(dsn)
rec = Recorder(engine)
rec.record([RunStart("wal", "wal", "q-wal", "r-wal", "wal", t0)])
def batch(n):
    ranges = tuple(PartitionRange("orders", p, 10**9 + n * 500 + p, 10**9 + (n + 1) * 500 + p) for p in range(100))
    return BatchRecord("wal", "wal", BatchOffsets("q-wal", "r-wal", "wal", n, t0 + timedelta(seconds=5 * n), 50000,
                                                  (SourceProgress(0, "KafkaV2[Subscribe[orders]]", ranges, 50000),),
                                                  duration_ms=200))
for n in range(3):  # the query's first batches (general path), then the steady state
    rec.record([batch(n)])
with engine.connect() as conn:
    start = conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar()
for n in range(3, 3 + k, fold):
    rec.record([batch(m) for m in range(n, min(n + fold, 3 + k))])
with engine.connect() as conn:
    end = conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar()
    print(start, end, conn.execute(text("SELECT pg_wal_lsn_diff(:e, :s)"), {"s": start, "e": end}).scalar() / k)
"""

# The listener's own path (--wal-breakdown): its EventWriter fed Spark-shaped progress events, one
# batch at a time, each flushed before the next (a listener that keeps up), exactly as
# OffsetLedgerListener builds and feeds it (bench_fleet's simulator does the same).
_WAL_LISTENER = r"""
import sys, tempfile, time, uuid
from pathlib import Path
from sqlalchemy import text
sys.path.insert(0, "benchmarks")
from _progress import progress_json
from offset_ledger.capture.spool import Event
from offset_ledger.capture.writer import EventWriter
from offset_ledger.ledger.engine import make_engine
dsn, k = sys.argv[1], int(sys.argv[2])
engine = make_engine(dsn)
tuning = dict(queue_size=10_000, max_batch_events=500, max_backoff=2.0, health_interval=30.0, health_pipeline="wal")
def listener_writer(spool):  # as the listener of the release on PYTHONPATH builds it
    try:
        from offset_ledger.addresses import LedgerAddress
        from offset_ledger.capture.writer import WriterOptions
    except ImportError:  # a release before LedgerAddress: a DSN and loose arguments
        from offset_ledger.capture.spool import ledger_id
        from offset_ledger.capture.store import open_recorder
        return EventWriter(lambda: open_recorder(dsn), spool_dir=Path(spool), ledger=ledger_id(dsn), **tuning)
    return EventWriter(LedgerAddress.resolve(dsn, pool_size=1), spool_dir=Path(spool), options=WriterOptions(**tuning))
with tempfile.TemporaryDirectory() as spool:
    writer = listener_writer(spool)
    query_id = str(uuid.uuid4())
    def submit(b):
        writer.submit(Event("progress", progress_json(query_id, b, 100, per_batch=500), time.time(), "wal", None, None))
        assert writer.flush(60)
    for b in range(3):
        submit(b)
    with engine.connect() as conn:
        start = conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar()
    for b in range(3, 3 + k):
        submit(b)
    with engine.connect() as conn:
        end = conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar()
    writer.close(60)
    with engine.connect() as conn:
        print(start, end, conn.execute(text("SELECT pg_wal_lsn_diff(:e, :s)"), {"s": start, "e": end}).scalar() / k)
"""

# What the WAL between two LSNs holds, from this database only: records touching its relations, and
# the commit (and other relation-less) records of the transactions that wrote them. Grouped by
# resource manager, record type and relation (pg_walinspect, PostgreSQL 15+).
_BREAKDOWN = r"""
WITH r AS (
    SELECT w.*, (regexp_match(w.block_ref, 'rel (\d+)/(\d+)/(\d+)'))::oid[] AS rel
    FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn)) w
), mine AS (
    SELECT * FROM r WHERE r.rel[2] = (SELECT oid FROM pg_database WHERE datname = current_database())
), xids AS (SELECT DISTINCT xid FROM mine WHERE xid <> 0)
SELECT resource_manager, record_type,
       coalesce(pg_filenode_relation(CASE WHEN rel[1] = (SELECT dattablespace FROM pg_database
                                                         WHERE datname = current_database())
                                          THEN 0 ELSE rel[1] END, rel[3])::text, '') AS relation,
       count(*) AS records, sum(record_length) AS bytes, sum(fpi_length) AS fpi_bytes
FROM (SELECT * FROM mine UNION ALL SELECT * FROM r WHERE rel IS NULL AND xid IN (SELECT xid FROM xids)) x
GROUP BY 1, 2, 3 ORDER BY bytes DESC
"""


def _database(admin_dsn: str, name: str) -> str:
    admin = create_engine(admin_dsn, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(admin_dsn).set(database=name).render_as_string(hide_password=False)


def _drop(admin_dsn: str, name: str) -> None:
    admin = create_engine(admin_dsn, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _fill(dsn: str, revision: str, offsets: int) -> None:
    """A ledger at ``revision`` holding ``offsets`` partition-offsets (batches of 100 partitions)."""
    engine = make_engine(dsn)
    upgrade(engine, revision)
    n = offsets // PARTITIONS
    rows = _OLD_ROWS if revision == "0014" else _NEW_ROWS
    with engine.begin() as conn:
        conn.execute(text(_BATCHES), {"n": n})
    step = 20_000
    for lo in range(0, n, step):
        with engine.begin() as conn:
            conn.execute(text(rows), {"lo": lo, "hi": lo + step})
    engine.dispose()
    plain = create_engine(dsn, isolation_level="AUTOCOMMIT")
    with plain.connect() as conn:
        conn.execute(text("VACUUM ANALYZE"))
    plain.dispose()


def _size(dsn: str, table: str) -> int:
    engine = create_engine(dsn)
    with engine.connect() as conn:
        # the table and its partitions (0018 partitions offset_ranges: the parent itself holds nothing)
        size = int(conn.execute(text(
            "SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(CAST(:t AS regclass))), "
            "pg_total_relation_size(CAST(:t AS regclass)))"), {"t": table}).scalar())
    engine.dispose()
    return size


def _wal(dsn: str, pythonpath: str, batches: int, script: str = _WAL, *args: str) -> tuple[str, str, float]:
    """(start LSN, end LSN, WAL bytes per batch) of ``batches`` recorded by ``script`` under ``pythonpath``."""
    env = dict(os.environ, PYTHONPATH=pythonpath)
    out = subprocess.run([sys.executable, "-c", script, dsn, str(batches), *args], env=env, capture_output=True,
                         text=True, check=True, cwd=pythonpath)
    start, end, per_batch = out.stdout.strip().splitlines()[-1].split()
    return start, end, float(per_batch)


def _breakdown(dsn: str, start: str, end: str, batches: int, per_batch: float) -> None:
    """Print what the WAL of ``batches`` batches holds, per batch, by record type and relation."""
    engine = create_engine(dsn)
    with engine.begin() as conn:
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
    with engine.begin() as conn:
        # synchronous_commit=off (the devstack): pg_walinspect reads only WAL already flushed
        for _ in range(200):
            if conn.execute(text("SELECT pg_current_wal_flush_lsn() >= CAST(:e AS pg_lsn)"), {"e": end}).scalar():
                break
            time.sleep(0.05)
        rows = conn.execute(text(_BREAKDOWN), {"start": start, "end": end}).all()
        fpw = conn.execute(text("SHOW full_page_writes")).scalar()
    engine.dispose()
    total = sum(int(r.bytes) for r in rows)
    print(f"    {'resource manager/record':<24} {'relation':<36} {'records':>8} {'bytes':>8}  (per batch)")
    for r in rows:
        if int(r.bytes) / batches < 8:
            continue
        print(f"    {r.resource_manager + '/' + r.record_type:<24} {r.relation[:36]:<36} "
              f"{int(r.records) / batches:8.1f} {int(r.bytes) / batches:8.0f}")
    print(f"    {'records of this database':<61} {sum(int(r.records) for r in rows) / batches:8.1f} "
          f"{total / batches:8.0f}")
    print(f"    {'LSN distance (+ alignment, page headers, other databases)':<70} {per_batch:8.0f}")
    print(f"    full_page_writes = {fpw}" + (" (no full-page images: the figure is the steady state's floor "
                                                  "between checkpoints)" if fpw == "off" else ""))


#: The release the breakdown compares with by default: main before positions became a row per topic
#: (issue 49, 0024); issue 35's WAL work compared with 1e8e3af (``--baseline 1e8e3af``).
LAST_RELEASE = "f0265ab"

_UPGRADE = "import sys; from offset_ledger.ledger.engine import make_engine, upgrade; upgrade(make_engine(sys.argv[1]))"


def wal_breakdown(admin_dsn: str, batches: int, baseline: str = LAST_RELEASE) -> None:
    """WAL per 100-partition batch of the last release's writers and this tree's, each in a fresh
    database its own migrations built, broken down by record type and relation."""
    name = "bench_storage_wal"
    print(f"WAL per 100-partition batch, {batches} batches after 3 of warm-up (target <= 4 KB):")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", baseline, "offset_ledger", "migrations",
                                      "benchmarks"], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            totals: dict[tuple[str, str], float] = {}
            for label, script, args in (
                    ("recorder: one record() call a batch (the fast one-statement path)", _WAL, ()),
                    ("recorder: five batches a record() call (a writer that fell behind)", _WAL, ("5",)),
                    ("listener: EventWriter fed progress events, each flushed", _WAL_LISTENER, ())):
                for release, path in ((f"last release {baseline}", tmp), ("this tree", str(ROOT))):
                    dsn = _database(admin_dsn, name)
                    env = dict(os.environ, PYTHONPATH=path)
                    subprocess.run([sys.executable, "-c", _UPGRADE, dsn], env=env, cwd=path, check=True,
                                   capture_output=True)
                    start, end, per_batch = _wal(dsn, path, batches, script, *args)
                    totals[(label, release)] = per_batch
                    print(f"  {label}, {release}: {per_batch / 1024:.2f} KB")
                    _breakdown(dsn, start, end, batches, per_batch)
        print(f"summary, KB per batch, last release {baseline} -> this tree (target <= 4 KB):")
        for label in dict.fromkeys(k[0] for k in totals):
            before, after = totals[(label, f"last release {baseline}")], totals[(label, "this tree")]
            print(f"  {label.split(':')[0]} ({label.split(': ')[1]}): {before / 1024:.1f} -> {after / 1024:.1f}")
    finally:
        _drop(admin_dsn, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("OFFSET_LEDGER_TEST_DSN"))
    parser.add_argument("--offsets", type=int, default=1_000_000)
    parser.add_argument("--wal-batches", type=int, default=200)
    parser.add_argument("--migrate", type=int, default=10_000_000, help="0: skip the migration timing")
    parser.add_argument("--wal-breakdown", action="store_true",
                        help="only the WAL per batch of this tree's recorder and listener, broken down (pg_walinspect)")
    parser.add_argument("--baseline", default=LAST_RELEASE,
                        help=f"the commit --wal-breakdown compares with (default {LAST_RELEASE}: main before 0024)")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or OFFSET_LEDGER_TEST_DSN) is required")
    if args.wal_breakdown:
        wal_breakdown(args.dsn, args.wal_batches, args.baseline)
        return
    old_db, new_db = "bench_storage_0014", "bench_storage_0016"
    try:
        old, new = _database(args.dsn, old_db), _database(args.dsn, new_db)
        _fill(old, "0014", args.offsets)
        _fill(new, "head", args.offsets)
        per_old = _size(old, "batch_offsets") / args.offsets
        per_new = _size(new, "offset_ranges") / args.offsets
        batches_b = _size(new, "batches") / args.offsets
        print(f"stored bytes per partition-offset ({args.offsets:,}, after VACUUM, table + indexes + TOAST):")
        print(f"  per-partition rows (batch_offsets, 0014): {per_old:7.1f} B")
        print(f"  compact rows       (offset_ranges, 0016): {per_new:7.1f} B  ({per_old / per_new:.1f}x smaller)")
        print(f"  batches (both layouts, per partition-offset): {batches_b:5.1f} B")

        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", "4cc5ce0", "offset_ledger", "migrations"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            wal = {}
            for name, revision, path in ((old_db, "0014", tmp), (new_db, "head", str(ROOT))):
                dsn = _database(args.dsn, name)
                engine = make_engine(dsn)
                upgrade(engine, revision)
                engine.dispose()
                wal[revision] = _wal(dsn, path, args.wal_batches)[2]
            wal_old, wal_new = wal["0014"], wal["head"]
        print(f"WAL per 100-partition batch ({args.wal_batches} batches, one record() call each):")
        print(f"  per-partition rows (previous release 4cc5ce0): {wal_old / 1024:6.1f} KB")
        print(f"  compact rows       (this tree):               {wal_new / 1024:6.1f} KB")

        if args.migrate:
            old = _database(args.dsn, old_db)
            started = time.monotonic()
            _fill(old, "0014", args.migrate)
            print(f"migration 0014 -> 0016 of {args.migrate:,} partition-offsets "
                  f"(built in {time.monotonic() - started:.0f} s):", flush=True)
            engine = make_engine(old)
            started = time.monotonic()
            upgrade(engine)
            took = time.monotonic() - started
            engine.dispose()
            print(f"  took {took:.1f} s ({args.migrate / took:,.0f} partition-offsets/s)")
    finally:
        _drop(args.dsn, old_db)
        _drop(args.dsn, new_db)


if __name__ == "__main__":
    main()
