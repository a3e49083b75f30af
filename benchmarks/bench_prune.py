"""Retention on a big Postgres ledger: time ``prune --older-than 30d`` and verify what it keeps.

    source .devstack/stack.env   # or pass --dsn; any Postgres server the DSN's user may create databases on
    .venv/bin/python benchmarks/bench_prune.py [--batches 10000] [--pipelines 4] [--partitions 25]

Builds a fresh database (dropped afterwards) holding ``pipelines x batches x partitions``
batch_offsets rows (1,000,000 by default) spread evenly over the last 60 days, with positions,
findings that name old batches and resets, then runs the dry run and the real prune through the
same function the CLI uses and checks every promise: positions, resets, findings untouched, each
partition's latest batch and every referenced batch kept, nothing recent deleted, everything else
older than the cutoff gone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timedelta, timezone

from _scratch import ScratchDatabase  # noqa: E402 - sibling module; benchmarks run as scripts
from sqlalchemy import text
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.prune import DEFAULT_CHUNK_SIZE, prune

SPAN = timedelta(days=60)
OLDER_THAN = timedelta(days=30)


def populate(engine: Engine, pipelines: int, batches: int, partitions: int, now: datetime) -> None:
    """Server-side generation, in time order (ids grow with batch_time as a listener writes them)."""
    step = SPAN / batches
    params = {"start": now - SPAN, "step_s": step.total_seconds(), "np": pipelines - 1,
              "nb": batches - 1, "nparts": partitions - 1}
    with engine.begin() as conn:
        conn.execute(text("""
            INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time,
                                 recorded_at, input_rows)
            SELECT 'bench_' || p, 'bench_' || p, 'q-' || p, 'r-' || p, b,
                   :start + b * :step_s * interval '1 second',
                   :start + b * :step_s * interval '1 second', 100 * (:nparts + 1)
            FROM generate_series(0, :nb) b, generate_series(0, :np) p
            ORDER BY b, p
        """), params)
        # The compact layout the recorder writes: one offset_ranges row per batch with arrays.
        conn.execute(text("""
            INSERT INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
            SELECT id, 0, 'topic_' || substr(pipeline, 7), ARRAY(SELECT generate_series(0, :nparts)),
                   array_fill(batch_id * 100, ARRAY[:nparts + 1]), array_fill(batch_id * 100 + 100, ARRAY[:nparts + 1])
            FROM batches WHERE pipeline LIKE 'bench%' ORDER BY id
        """), params)
        # Positions: each partition at its last batch's end.
        conn.execute(text("""
            INSERT INTO positions (pipeline, consumer_group, topic, "partition", next_offset,
                                   updated_at, query_id, batch_id)
            SELECT 'bench_' || p, 'bench_' || p, 'topic_' || p, part, (:nb + 1) * 100, now(),
                   'q-' || p, :nb
            FROM generate_series(0, :np) p, generate_series(0, :nparts) part
        """), params)
        # A partition that left the subscription 40 days ago: its latest batch is old.
        conn.execute(text("""
            INSERT INTO v_batch_offsets (pipeline, consumer_group, query_id, batch_id, source_index,
                                       topic, "partition", from_offset, until_offset, batch_time)
            VALUES ('bench_0', 'bench_0', 'q-0', 7, 0, 'retired', 0, 0, 70, :t)
        """), {"t": now - timedelta(days=40)})
        conn.execute(text("""
            INSERT INTO findings (pipeline, consumer_group, kind, topic, "partition", query_id,
                                  batch_id, expected_offset, actual_offset, message, created_at)
            SELECT 'bench_' || p, 'bench_' || p, 'gap', 'topic_' || p, 0, 'q-' || p, 100 + p,
                   1, 2, 'synthetic gap', now() - interval '50 days'
            FROM generate_series(0, :np) p
        """), params)
        conn.execute(text("""
            INSERT INTO resets (pipeline, consumer_group, mode, actor, reason, dry_run, forced,
                                created_at, status)
            SELECT 'bench_' || p, 'bench_' || p, 'earliest', 'ops', 'bench', false, false,
                   now() - interval '45 days', 'consumed'
            FROM generate_series(0, :np) p
        """), params)
        conn.execute(text("ANALYZE"))


def snapshot(engine: Engine, cutoff: datetime) -> dict[str, object]:
    with engine.connect() as conn:
        one = lambda sql, **p: conn.execute(text(sql), p).scalar_one()  # noqa: E731
        return {
            "batch_offsets": one("SELECT count(*) FROM v_batch_offsets"),
            "batches": one("SELECT count(*) FROM batches"),
            "recent_offsets": one("SELECT count(*) FROM v_batch_offsets WHERE batch_time >= :c", c=cutoff),
            "positions": conn.execute(text(
                'SELECT pipeline, topic, "partition", next_offset, batch_id FROM positions ORDER BY 1, 2, 3'
            )).fetchall(),
            "findings": conn.execute(text("SELECT * FROM findings ORDER BY id")).fetchall(),
            "resets": conn.execute(text("SELECT * FROM resets ORDER BY id")).fetchall(),
            "latest": conn.execute(text("""
                SELECT pipeline, consumer_group, topic, "partition", max(batch_time)
                FROM v_batch_offsets GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4""")).fetchall(),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("OFFSET_LEDGER_TEST_DSN"),
                        help="a Postgres server to create the scratch database on (default: OFFSET_LEDGER_TEST_DSN)")
    parser.add_argument("--pipelines", type=int, default=4)
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=25)
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    args = parser.parse_args()
    if not args.dsn:
        print("bench_prune: give --dsn or source .devstack/stack.env (OFFSET_LEDGER_TEST_DSN)", file=sys.stderr)
        return 2
    scratch = ScratchDatabase(args.dsn, "bench_prune")
    engine = make_engine(scratch.dsn)
    try:
        upgrade(engine)
        now = datetime.now(timezone.utc)
        t0 = time.perf_counter()
        populate(engine, args.pipelines, args.batches, args.partitions, now)
        build_s = time.perf_counter() - t0
        cutoff = now - OLDER_THAN
        before = snapshot(engine, cutoff)
        print(f"ledger: {before['batch_offsets']:,} batch_offsets rows, {before['batches']:,} batches "
              f"over 60 days (built in {build_s:.1f}s)")

        dry = prune(engine, OLDER_THAN, now=now)
        progress_marks: list[float] = []
        real = prune(engine, OLDER_THAN, now=now, execute=True, chunk_size=args.chunk_size,
                     progress=lambda table, done, total: progress_marks.append(time.perf_counter()))
        after = snapshot(engine, cutoff)

        checks = {
            "dry run deleted nothing and predicted the real counts":
                dry.batch_offsets == real.batch_offsets and dry.batches == real.batches,
            "positions untouched": after["positions"] == before["positions"],
            "findings untouched": after["findings"] == before["findings"],
            "resets untouched": after["resets"] == before["resets"],
            "each partition's latest batch kept": after["latest"] == before["latest"],
            "nothing newer than the cutoff deleted": after["recent_offsets"] == before["recent_offsets"],
            "rows left = recent + protected":
                after["batch_offsets"] == before["recent_offsets"] + real.batch_offsets.kept,
            "rows deleted as reported":
                before["batch_offsets"] - after["batch_offsets"] == real.batch_offsets.deleted,
        }
        with engine.connect() as conn:
            referenced = conn.execute(text("""
                SELECT count(*) FROM findings f
                WHERE NOT EXISTS (SELECT 1 FROM batches b WHERE b.query_id = f.query_id AND b.batch_id = f.batch_id)
                   OR NOT EXISTS (SELECT 1 FROM v_batch_offsets o WHERE o.query_id = f.query_id AND o.batch_id = f.batch_id)
            """)).scalar_one()
        checks["batches named by findings kept"] = referenced == 0

        rows = real.batch_offsets.deleted + real.batches.deleted
        print(f"prune --older-than 30d, dry run: {dry.seconds:.2f}s "
              f"(would delete {dry.batch_offsets.deleted:,} batch_offsets + {dry.batches.deleted:,} batches rows)")
        print(f"prune --older-than 30d --execute: {real.seconds:.2f}s, {rows:,} rows deleted "
              f"({rows / real.seconds:,.0f} rows/s) in {len(progress_marks)} transactions of <= {args.chunk_size:,} rows; "
              f"kept {real.batch_offsets.kept} old batch_offsets rows of {real.protected_batches} protected batches")
        with engine.connect() as conn:
            recorded = conn.execute(text("SELECT count(*) FROM pruned_ranges")).scalar_one()
        checks["deleted ranges recorded as islands"] = recorded == real.islands > 0
        print(f"  of which recording {real.islands:,} pruned-range islands (for verify): {real.islands_seconds:.2f}s "
              f"({real.islands_seconds / real.seconds:.0%} of the prune)")
        for label, ok in checks.items():
            print(f"  [{'ok' if ok else 'FAIL'}] {label}")
        return 0 if all(checks.values()) else 1
    finally:
        engine.dispose()
        scratch.drop()


if __name__ == "__main__":
    sys.exit(main())
