"""Cost of recording one micro-batch: the listener's writer vs the naive pattern vs one multi-row INSERT.

    source .devstack/stack.env   # or pass --dsn; any Postgres server the DSN's user may create databases on
    .venv/bin/python benchmarks/bench_record.py [--dsn DSN] [--partitions 1,32,1000] [--batches 200] [--rounds 3]

For each partition count it times, per batch, on a fresh database (dropped afterwards), best of
``--rounds`` with the methods interleaved (the machine may be busy with other work):

- ``naive``: what people copy: a new connection per batch and one INSERT per partition;
- ``pooled``: one pooled connection and one multi-row INSERT of the batch's offsets, nothing else
  (psycopg2 ``execute_values``, a single statement: the floor);
- ``writer``: OffsetLedgerListener's writer, fed Spark progress JSON the way Spark delivers it,
  doing everything the ledger promises (batches + offsets + positions + gap/regression checks)
  while it keeps up: events arrive back to back and the writer folds whatever queued into one
  transaction (the listener's steady state when it falls behind);
- ``writer 1by1``: one event, then ``flush()``, repeated: the latency of an isolated batch.

It also times the listener callback (the time a Spark listener-bus thread spends in our code for
one progress event, JSON text to queued) while the writer is busy, and reports p50/p99.
Targets: ``writer`` within 1.5x of ``pooled`` and at least 7x faster than ``naive``; callback
p99 under 1 ms.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg2
from _progress import TOPIC, progress_json  # noqa: E402 - sibling modules; benchmarks run as scripts
from _scratch import ScratchDatabase  # noqa: E402
from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine, make_url

from offset_ledger.capture.listener import OffsetLedgerListener
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.tables import batch_offsets, findings


def offset_rows(pipeline: str, query_id: str, batch_id: int, partitions: int) -> list[dict]:
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    return [{"pipeline": pipeline, "consumer_group": pipeline, "query_id": query_id, "batch_id": batch_id,
             "source_index": 0, "topic": TOPIC, "partition": p, "from_offset": batch_id * 10,
             "until_offset": (batch_id + 1) * 10, "batch_time": now} for p in range(partitions)]


#: naive and pooled write their own per-row table (today's per-partition layout, what people copy); the
#: ledger's v_batch_offsets view would fold each row through its INSTEAD OF trigger, which no writer does.
NAIVE_TABLE = """
    CREATE TABLE naive_offsets (id bigserial PRIMARY KEY, pipeline text NOT NULL, consumer_group text NOT NULL,
        query_id text NOT NULL, batch_id bigint NOT NULL, source_index int NOT NULL, topic text NOT NULL,
        "partition" int NOT NULL, from_offset bigint, until_offset bigint NOT NULL, batch_time timestamptz NOT NULL,
        UNIQUE (query_id, batch_id, source_index, topic, "partition"))
"""


def bench_naive(dsn: str, partitions: int, batches: int) -> float:
    """New connection per batch, one INSERT per partition (psycopg2, as copied from blog posts)."""
    url = make_url(dsn)
    params = {"host": url.host, "port": url.port, "user": url.username, "password": url.password,
              "dbname": url.database}
    query_id = str(uuid.uuid4())
    start = time.perf_counter()
    for b in range(batches):
        conn = psycopg2.connect(**{k: v for k, v in params.items() if v is not None})
        with conn, conn.cursor() as cur:
            for row in offset_rows("naive", query_id, b, partitions):
                cur.execute(
                    "INSERT INTO naive_offsets (pipeline, consumer_group, query_id, batch_id, source_index,"
                    " topic, partition, from_offset, until_offset, batch_time)"
                    " VALUES (%(pipeline)s, %(consumer_group)s, %(query_id)s, %(batch_id)s, %(source_index)s,"
                    " %(topic)s, %(partition)s, %(from_offset)s, %(until_offset)s, %(batch_time)s)", row)
        conn.close()
    return (time.perf_counter() - start) / batches


def bench_pooled(engine: Engine, partitions: int, batches: int) -> float:
    """One pooled connection, one multi-row ``INSERT ... VALUES (...), (...)`` per batch: the floor."""
    from psycopg2.extras import execute_values

    query_id = str(uuid.uuid4())
    columns = list(offset_rows("pooled", query_id, 0, 1)[0])
    sql = f"INSERT INTO naive_offsets ({', '.join(columns)}) VALUES %s"
    with engine.connect():
        pass  # the pool holds a warm connection before timing
    start = time.perf_counter()
    for b in range(batches):
        with engine.begin() as conn:
            cursor = conn.connection.dbapi_connection.cursor()
            execute_values(cursor, sql, [tuple(r[c] for c in columns)
                                         for r in offset_rows("pooled", query_id, b, partitions)],
                           page_size=max(partitions, 1))
            cursor.close()
    return (time.perf_counter() - start) / batches


def bench_writer(dsn: str, partitions: int, batches: int, spool: Path,
                 one_by_one: bool) -> tuple[float, list[float], OffsetLedgerListener]:
    pipeline = f"writer_{partitions}_{'paced' if one_by_one else 'burst'}_{uuid.uuid4().hex[:6]}"
    listener = OffsetLedgerListener(dsn=dsn, pipeline=pipeline, spool_dir=spool, health_interval=3600)
    query_id = str(uuid.uuid4())
    events = [progress_json(query_id, b, partitions) for b in range(batches + 1)]
    listener.accept_json("progress", events[0])  # warm up: schema check, pool, caches
    assert listener.flush(60)
    callback: list[float] = []
    start = time.perf_counter()
    for payload in events[1:]:
        t0 = time.perf_counter()
        listener.accept_json("progress", payload)
        callback.append(time.perf_counter() - t0)
        if one_by_one:
            listener.flush(60)
    assert listener.flush(600), listener.health()
    elapsed = (time.perf_counter() - start) / batches
    return elapsed, callback, listener


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("OFFSET_LEDGER_TEST_DSN"),
                        help="Postgres server (default: OFFSET_LEDGER_TEST_DSN); a fresh database is made on it")
    parser.add_argument("--partitions", default="1,32,1000")
    parser.add_argument("--batches", type=int, default=200, help="batches per measurement (1000 partitions: /4)")
    parser.add_argument("--rounds", type=int, default=3, help="repeat each measurement, keep the best")
    args = parser.parse_args(argv)
    if not args.dsn:
        print("bench_record: give --dsn or set OFFSET_LEDGER_TEST_DSN (source .devstack/stack.env)", file=sys.stderr)
        return 2
    scratch = ScratchDatabase(args.dsn, "bench_record")
    admin_url, dsn = scratch.admin_url, scratch.dsn
    failures: list[str] = []
    try:
        engine = make_engine(dsn)
        upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text(NAIVE_TABLE))
        results = []
        with tempfile.TemporaryDirectory() as spool:
            for partitions in (int(p) for p in args.partitions.split(",")):
                n = max(10, args.batches // 4) if partitions >= 500 else args.batches
                # Best of --rounds, the methods interleaved: other load on the machine hits all alike.
                naive = pooled = burst = paced = float("inf")
                callbacks: list[float] = []
                for _ in range(args.rounds):
                    naive = min(naive, bench_naive(dsn, partitions, n))
                    pooled = min(pooled, bench_pooled(engine, partitions, n))
                    took, cbs, listener = bench_writer(dsn, partitions, n, Path(spool), one_by_one=False)
                    burst, health = min(burst, took), listener.health()
                    listener.close(30)
                    took, paced_cbs, paced_listener = bench_writer(dsn, partitions, n, Path(spool), one_by_one=True)
                    paced = min(paced, took)
                    paced_listener.close(30)
                    callbacks += cbs + paced_cbs
                results.append((partitions, n, naive, pooled, burst, paced, callbacks, health))
        with engine.connect() as conn:
            anomalies = conn.execute(select(func.count()).select_from(findings)).scalar()
            written = conn.execute(select(func.count()).select_from(batch_offsets)
                                   .where(batch_offsets.c.pipeline.like("writer_%"))).scalar()
        engine.dispose()
    finally:
        scratch.drop()

    ms: Callable[[float], str] = lambda s: f"{s * 1000:8.3f}"  # noqa: E731
    print(f"\nrecording one batch, Postgres at {admin_url.host}:{admin_url.port} (ms per batch)\n")
    print(f"{'partitions':>10} {'batches':>7} {'naive':>8} {'pooled':>8} {'writer':>8} {'1by1':>8}"
          f" {'writer/pooled':>13} {'naive/writer':>12} {'1by1/pooled':>11} {'naive/1by1':>10}"
          f" {'cb p50 us':>9} {'cb p99 us':>9} {'cb max us':>9}")
    for partitions, n, naive, pooled, burst, paced, callbacks, health in results:
        p50, p99, worst = (pct(callbacks, q) * 1e6 for q in (0.5, 0.99, 1.0))
        print(f"{partitions:>10} {n:>7} {ms(naive)} {ms(pooled)} {ms(burst)} {ms(paced)}"
              f" {burst / pooled:>12.2f}x {naive / burst:>11.1f}x {paced / pooled:>10.2f}x"
              f" {naive / paced:>9.1f}x {p50:>9.1f} {p99:>9.1f} {worst:>9.1f}")
        if burst > 1.5 * pooled:
            failures.append(f"{partitions} partitions: writer {burst / pooled:.2f}x pooled (target <= 1.5x)")
        if naive < 7 * burst:
            failures.append(f"{partitions} partitions: writer only {naive / burst:.1f}x faster than naive")
        if p99 > 1000:
            failures.append(f"{partitions} partitions: callback p99 {p99:.0f} us (target < 1000 us)")
        if health.failed or health.spilled:
            failures.append(f"{partitions} partitions: writer health {health}")
    print(f"\nwriter: {written} batch_offsets rows written, {anomalies} findings (expected 0)")
    if anomalies:
        failures.append(f"{anomalies} findings while benchmarking")
    for failure in failures:
        print("MISSED:", failure)
    print("all targets met" if not failures else f"{len(failures)} target(s) missed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
