"""``offset-ledger verify`` over 1,000,000 batch_offsets rows of one pipeline (issue 25).

    source .devstack/stack.env   # or pass --dsn; any Postgres server the DSN's user may create databases on
    flock /tmp/ol-stack.lock .venv/bin/python benchmarks/bench_verify.py [--batches 10000] [--partitions 100]

Builds a fresh database (dropped afterwards) with one pipeline's history, generated in Postgres in
time order (ids grow with batch_time, as a listener writes them): ``batches x partitions`` ranges
(1,000,000 by default) over three queries (two restarts), and an executed reset between the second
and the third that moves every partition back 50 records (the third query reads them again). Then it
times ``verify_pipeline`` (the server-side cursor stream and the sweep; best of ``--rounds``) beside
the baseline, a naive implementation that loads every row (client-side cursor), sorts them in
Python and runs the same sweep. Both must find exactly the reset's stretches, one per partition,
explained; a hand-made gap must then be the only unexplained one. Peak RSS is shown for both (the
streaming run first). Target: < 5 s; exits 1 on a miss or a wrong answer.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from datetime import datetime, timedelta, timezone

from _scratch import ScratchDatabase  # noqa: E402 - sibling module; benchmarks run as scripts
from _seed import seed_positions  # noqa: E402
from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.tables import batch_offsets
from offset_ledger.ledger.verify_reads import read_inputs
from offset_ledger.ledger.verify_rows import stream_rows, tagged
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.verifying import verify_pipeline
from offset_ledger.rules.verify import RangeRow, sort_key, verify_ranges

TARGET_S = 5.0
STEP = 100      # records per batch and partition
REREAD = 50     # records the reset moves every partition back


def populate(engine: Engine, batches: int, partitions: int) -> None:
    """Three queries of batches/3 batches each; a reset back REREAD records before the third."""
    start = datetime.now(timezone.utc) - timedelta(days=30)
    third = batches // 3
    params = {"start": start, "nb": batches - 1, "np": partitions - 1, "third": third, "step": STEP,
              "reread": REREAD}
    with engine.begin() as conn:
        # Query q<k> = batch // third (0, 1, 2); its batch ids restart at 0. The third query starts
        # REREAD records early on every partition (the reset); offsets shift by REREAD from then on.
        conn.execute(text("""
            INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at,
                                 input_rows)
            SELECT 'orders', 'orders', 'q' || least(b / :third, 2), 'r' || least(b / :third, 2),
                   b - least(b / :third, 2) * :third, :start + b * interval '1 second',
                   :start + b * interval '1 second', :step * (:np + 1)
            FROM generate_series(0, :nb) b ORDER BY b
        """), params)
        # The compact layout the recorder writes: one offset_ranges row per batch, its partitions and
        # their exclusive ends as arrays (the batch's number b is its second since start).
        conn.execute(text("""
            INSERT INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
            SELECT bt.id, 0, 'orders', ARRAY(SELECT generate_series(0, :np)),
                   array_fill(s.b * :step - CASE WHEN s.b >= 2 * :third THEN :reread ELSE 0 END, ARRAY[:np + 1]),
                   array_fill((s.b + 1) * :step - CASE WHEN s.b >= 2 * :third THEN :reread ELSE 0 END,
                              ARRAY[:np + 1])
            FROM batches bt,
                 LATERAL (SELECT round(extract(epoch FROM bt.batch_time - :start))::bigint AS b) s
            ORDER BY bt.id
        """), params)
        # Positions as the ledger keeps them (a row per topic, benchmarks/_seed.py).
        seed_positions(conn, ["orders"], lambda _: "orders", partitions, batches * STEP - REREAD,
                       datetime.now(timezone.utc), lambda _: "q2", batches - 1 - 2 * third)
        reset_id = conn.execute(text("""
            INSERT INTO resets (pipeline, consumer_group, mode, actor, reason, dry_run, forced, created_at, status)
            VALUES ('orders', 'orders', 'shift', 'bench', 'replay', false, false,
                    :start + (2 * :third) * interval '1 second' - interval '0.5 second', 'consumed')
            RETURNING id
        """), params).scalar_one()
        conn.execute(text("""
            INSERT INTO reset_partitions (reset_id, topic, "partition", before_next_offset, after_next_offset)
            SELECT :rid, 'orders', p, 2 * :third * :step, 2 * :third * :step - :reread
            FROM generate_series(0, :np) p
        """), {**params, "rid": reset_id})
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.commit()


def naive(engine: Engine, ops: Operations) -> list:
    """The baseline: every row into memory (client-side cursor), sorted in Python, the same sweep."""
    with engine.connect() as conn:
        inputs = read_inputs(conn, "orders", "orders")
        b = batch_offsets
        rows = [RangeRow(*r) for r in conn.execute(
            select(b.c.topic, b.c.partition, b.c.from_offset, b.c.until_offset, b.c.query_id, b.c.batch_id)
            .where(b.c.pipeline == "orders", b.c.consumer_group == "orders")).fetchall()]
    rows.sort(key=sort_key)
    return list(verify_ranges(tagged(rows, inputs), inputs.explanations, inputs.positions))


def stream_only(engine: Engine, work_mem: str | None = None) -> tuple[float, int, str]:
    """Where the time goes: the ordered stream alone (no sweep), and how Postgres sorted it."""
    with engine.connect() as conn, conn.begin():
        if work_mem:
            conn.execute(text(f"SET LOCAL work_mem = '{work_mem}'"))
        plan = "\n".join(r[0] for r in conn.execute(text(
            "EXPLAIN (ANALYZE, COSTS OFF) SELECT topic, \"partition\", from_offset, until_offset, query_id, batch_id "
            "FROM v_batch_offsets WHERE pipeline = 'orders' AND consumer_group = 'orders' AND from_offset IS NOT NULL "
            "ORDER BY topic COLLATE \"C\", \"partition\", from_offset, until_offset")))
        sort = next((line.strip() for line in plan.splitlines() if "Sort Method" in line), "?")
        t = time.perf_counter()
        n = sum(1 for _ in stream_rows(conn, "orders", "orders"))
        return time.perf_counter() - t, n, sort


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("OFFSET_LEDGER_TEST_DSN"),
                        help="a Postgres server to create the scratch database on (default: OFFSET_LEDGER_TEST_DSN)")
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not args.dsn:
        print("bench_verify: give --dsn or source .devstack/stack.env (OFFSET_LEDGER_TEST_DSN)", file=sys.stderr)
        return 2
    scratch = ScratchDatabase(args.dsn, "bench_verify")
    engine = make_engine(scratch.dsn)
    ops = Operations(engine)
    try:
        upgrade(engine)
        t0 = time.perf_counter()
        populate(engine, args.batches, args.partitions)
        with engine.connect() as conn:
            count = conn.execute(text("SELECT count(*) FROM v_batch_offsets")).scalar_one()
        print(f"ledger: {count:,} batch_offsets rows, {args.partitions} partitions x {args.batches:,} batches, "
              f"3 queries, 1 reset (built in {time.perf_counter() - t0:.1f}s)")

        rss0 = _rss_mb()
        best = float("inf")
        report = None
        for _ in range(args.rounds):
            t = time.perf_counter()
            report = verify_pipeline(ops, "orders")
            best = min(best, time.perf_counter() - t)
        rss_stream = _rss_mb()
        base = float("inf")
        naive_results: list = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            naive_results = naive(engine, ops)
            base = min(base, time.perf_counter() - t)
        rss_naive = _rss_mb()
        assert report is not None
        split = [stream_only(engine), stream_only(engine, "256MB")]

        def shape(results: list) -> list:
            return [(s.partition, s.from_offset, s.until_offset, s.kind, s.explained)
                    for r in results for s in r.stretches]

        expected = [(p, 2 * (args.batches // 3) * STEP - REREAD, 2 * (args.batches // 3) * STEP, "overlap", True)
                    for p in range(args.partitions)]
        checks = {
            "streamed: exactly the reset's stretch on every partition, explained": shape(report.results) == expected,
            "naive baseline finds the same": shape(naive_results) == expected,
            f"streamed under the {TARGET_S:.0f} s target": best < TARGET_S,
        }
        with engine.begin() as conn:
            conn.execute(text("UPDATE v_batch_offsets SET from_offset = from_offset + 7 "
                              "WHERE query_id = 'q1' AND batch_id = 100 AND \"partition\" = 42"))
        punched = verify_pipeline(ops, "orders")
        checks["a hand-made gap is the only unexplained stretch"] = [
            (s.partition, s.records, s.kind) for s in punched.stretches if not s.explained] == [(42, 7, "gap")]

        print()
        print("| verify, 1 pipeline | figure | target | baseline (load all, sort in Python) | figure / baseline |")
        print("|---|---:|---:|---:|---:|")
        print(f"| time, best of {args.rounds} | {best:.2f} s | < {TARGET_S:.0f} s ({best / TARGET_S:.2f}x) "
              f"| {base:.2f} s | {best / base:.2f}x |")
        print(f"| peak RSS of this process after | {rss_stream:.0f} MB (from {rss0:.0f}) | | {rss_naive:.0f} MB | |")
        print(f"| rows/s | {count / best:,.0f} | | {count / base:,.0f} | |")
        print()
        for (seconds, n, sort), label in zip(split, ("default work_mem", "work_mem 256MB")):
            print(f"the ordered stream alone ({label}): {seconds:.2f} s for {n:,} rows; Postgres: {sort}")
        print()
        for label, ok in checks.items():
            print(f"  [{'ok' if ok else 'FAIL'}] {label}")
        return 0 if all(checks.values()) else 1
    finally:
        ops.close()
        engine.dispose()
        scratch.drop()


if __name__ == "__main__":
    sys.exit(main())
