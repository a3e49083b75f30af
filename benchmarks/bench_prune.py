"""Retention on a big Postgres ledger: time ``prune --older-than 30d`` and verify what it keeps.

    source .devstack/stack.env   # or pass --dsn; any Postgres server the DSN's user may create databases on
    .venv/bin/python benchmarks/bench_prune.py [--batches 10000] [--pipelines 4] [--partitions 25]
    .venv/bin/python benchmarks/bench_prune.py --fleet-day --pipelines 200 --partitions 100 [--day-batches 850] [--migration]

Builds a fresh database (dropped afterwards) holding ``pipelines x batches x partitions``
batch_offsets rows (1,000,000 by default) spread evenly over the last 60 days, with positions,
findings that name old batches and resets, then runs the dry run and the real prune through the
same function the CLI uses and checks every promise: positions, resets, findings untouched, each
partition's latest batch and every referenced batch kept, nothing recent deleted, everything else
older than the cutoff gone.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import time
from datetime import datetime, timedelta, timezone

from _scratch import ScratchDatabase  # noqa: E402 - sibling module; benchmarks run as scripts
from _seed import seed_positions  # noqa: E402
from sqlalchemy import text
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger import prune as prune_module
from offset_ledger.ledger.prune import DEFAULT_CHUNK_SIZE, prune
from offset_ledger.ledger.prune_record import record_pruned

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
        # Positions: each partition at its last batch's end, as the ledger keeps them (benchmarks/_seed.py).
        seed_positions(conn, [f"bench_{p}" for p in range(pipelines)], lambda name: "topic_" + name[6:],
                       partitions, batches * 100, now, lambda name: "q-" + name[6:], batches - 1)
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
                'SELECT pipeline, topic, "partition", next_offset, batch_id FROM v_positions ORDER BY 1, 2, 3'
            )).fetchall(),
            "findings": conn.execute(text("SELECT * FROM findings ORDER BY id")).fetchall(),
            "resets": conn.execute(text("SELECT * FROM resets ORDER BY id")).fetchall(),
            "latest": conn.execute(text("""
                SELECT pipeline, consumer_group, topic, "partition", max(batch_time)
                FROM v_batch_offsets GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4""")).fetchall(),
        }


# -- --fleet-day: one day of a fleet pruned by partition (0018) beside today's DELETE on the same data ------

_FLEET_BATCHES = """
INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at, input_rows)
SELECT 'fleet_' || p, 'fleet_' || p, 'q-' || p, 'r-' || p, b, :start + b * :step_s * interval '1 second',
       :start + b * :step_s * interval '1 second', 100
FROM generate_series(0, :nb) b, generate_series(0, :np) p
ORDER BY b, p
"""
_FLEET_RANGES = """
INSERT INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
SELECT id, 0, 'topic_' || substr(pipeline, 7), ARRAY(SELECT generate_series(0, :nparts)),
       array_fill(batch_id * 100, ARRAY[:nparts + 1]), array_fill(batch_id * 100 + 100, ARRAY[:nparts + 1])
FROM batches WHERE id >= :lo AND id < :hi ORDER BY id
"""
_FLEET_KEEP = """
INSERT INTO positions (pipeline, consumer_group, topic, "partition", next_offset, updated_at, query_id, batch_id)
SELECT 'fleet_' || p, 'fleet_' || p, 'topic_' || p, part, (:nb + 1) * 100, now(), 'q-' || p, :nb
FROM generate_series(0, :np) p, generate_series(0, :nparts) part;
INSERT INTO findings (pipeline, consumer_group, kind, topic, "partition", query_id, batch_id, expected_offset,
                      actual_offset, message, created_at)
SELECT 'fleet_' || p, 'fleet_' || p, 'gap', 'topic_' || p, 0, 'q-' || p, (:nb / 4) + p, 1, 2, 'synthetic gap',
       now() - interval '36 hours'
FROM generate_series(0, :np) p;
"""
_SIZE = """
SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c
WHERE c.oid = CAST(:t AS regclass) OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = CAST(:t AS regclass))
"""


def _fleet_populate(engine: Engine, args: argparse.Namespace, now: datetime, width: int | None) -> float:
    """Two days of the fleet, ids growing with batch time; with ``width``: partitions of that many ids made
    first (their grid offset by half a width, so that the cutoff falls inside one)."""
    started = time.perf_counter()
    day = timedelta(days=1)
    per_day = args.day_batches
    params = {"start": now - 2 * day, "step_s": (day / per_day).total_seconds(), "np": args.pipelines - 1,
              "nb": 2 * per_day - 1, "nparts": args.partitions - 1}
    total = 2 * per_day * args.pipelines
    if width is not None:
        from offset_ledger.ledger.partitions import partitions

        with engine.begin() as conn:
            for p in partitions(conn):
                if p.lo is not None and not p.default:  # the empty ones db upgrade made ahead
                    conn.execute(text(f"ALTER TABLE offset_ranges DETACH PARTITION {p.name}"))
                    conn.execute(text(f"DROP TABLE {p.name}"))
            bounds = [1, 1 + width // 2]
            while bounds[-1] <= total + 2 * width:
                bounds.append(bounds[-1] + width)
            for lo, hi in zip(bounds, bounds[1:]):
                conn.execute(text(f"CREATE TABLE offset_ranges_p{lo} PARTITION OF offset_ranges "
                                  f"FOR VALUES FROM ({lo}) TO ({hi})"))
    with engine.begin() as conn:
        conn.execute(text(_FLEET_BATCHES), params)
    step = 20_000
    for lo in range(1, total + 1, step):
        with engine.begin() as conn:
            conn.execute(text(_FLEET_RANGES), {**params, "lo": lo, "hi": lo + step})
        print(f"  built {min(lo + step - 1, total):,}/{total:,} batches, {time.perf_counter() - started:.0f} s",
              file=sys.stderr, flush=True)
    with engine.begin() as conn:
        conn.exec_driver_sql(_FLEET_KEEP.replace(":nparts", str(params["nparts"])).replace(":np", str(params["np"]))
                             .replace(":nb", str(params["nb"])))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return time.perf_counter() - started


# The islands prune wrote, as one digest (all but their id and time of writing): equal digests, equal islands.
_ISLANDS_DIGEST = """
SELECT md5(COALESCE(string_agg(concat_ws(',', pipeline, consumer_group, query_id, topic, "partition", from_batch_id,
                                         until_batch_id, from_offset, until_offset, batches, first_batch_time, cutoff,
                                         first_until_offset, last_batch_time, counts_reads, run_id),
                               ';' ORDER BY query_id, topic, "partition", from_batch_id), ''))
FROM pruned_ranges
"""


def _sizes(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: int(conn.execute(text(_SIZE), {"t": t}).scalar_one()) for t in ("offset_ranges", "batches")}


def _dead(engine: Engine, like: str = "offset_ranges%") -> int:
    time.sleep(1.5)  # the pruning sessions' table statistics reach the stats system
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT COALESCE(SUM(n_dead_tup), 0) FROM pg_stat_user_tables "
                                     "WHERE relname LIKE :t"), {"t": like}).scalar_one())


class _SwapLog(logging.Handler):
    """prune's log line per swapped partition: (kept rows, removed partition-offsets, seconds, locked seconds)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.swaps: list[tuple[int, int, float, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("prune: partition"):
            _, kept, removed, seconds, locked = record.args  # type: ignore[misc]
            self.swaps.append((kept, removed, seconds, locked))


def fleet_day(args: argparse.Namespace) -> int:
    """Prune one day of two (``--pipelines x --partitions x --day-batches`` partition-offsets) on a 0017
    ledger (one plain table: today's DELETE) and on a 0018 one (partitions of 6 hours of batches)."""
    from offset_ledger.ledger.partitions import partitioned

    now = datetime.now(timezone.utc)
    per_day = args.day_batches * args.pipelines
    width = args.width or max(1, per_day // 4)  # 6 hours of batch ids (ledger.partitions.width)
    print(f"fleet day: {args.pipelines} pipelines x {args.partitions} partitions x {args.day_batches} batches a day "
          f"= {per_day * args.partitions:,} partition-offsets a day; 2 days held, the older pruned "
          f"(--older-than 1d); partitions of {width:,} batch ids (6 hours)")
    rows: dict[str, dict[str, object]] = {}
    runs = [("DELETE (0017, one table)", "0017", False)] * (not args.skip_delete)
    runs += [("islands per offset (before)", "head", True)] * args.islands_before
    runs += [("partitions (0018, 0020)", "head", False)]
    for label, revision, per_offset in runs:
        scratch = ScratchDatabase(args.dsn, "bench_prune_day")
        engine = make_engine(scratch.dsn)
        try:
            # Head: built at 0019 (offset_ranges' foreign key in place), then 0020 run on the built ledger.
            upgrade(engine, "0019" if revision == "head" else revision)
            with engine.connect() as conn:
                parted = partitioned(conn)
            build = _fleet_populate(engine, args, now, width if parted else None)
            if revision == "head":
                rows["migration 0020"] = _time_upgrade(engine)
            before = _sizes(engine)
            if args.migration and not parted:
                rows["migration"] = _time_migration(scratch, engine)
            swaps = _SwapLog()
            logging.getLogger("offset_ledger.ledger.prune").addHandler(swaps)
            logging.getLogger("offset_ledger.ledger.prune").setLevel(logging.INFO)
            if per_offset:  # what prune ran before the islands were computed per compact row
                prune_module.record_pruned = functools.partial(record_pruned, per_partition_offset=True)
            try:
                report = prune(engine, timedelta(days=1), now=now, execute=True, chunk_size=args.chunk_size)
            finally:
                logging.getLogger("offset_ledger.ledger.prune").removeHandler(swaps)
                prune_module.record_pruned = record_pruned
            after = _sizes(engine)
            with engine.connect() as conn:
                digest = conn.execute(text(_ISLANDS_DIGEST)).scalar_one()
            rows[label] = {"build": build, "report": report, "before": before, "after": after,
                           "dead": _dead(engine), "dead_b": _dead(engine, "batches"),
                           "swaps": swaps.swaps, "digest": digest}
        finally:
            engine.dispose()
            scratch.drop()
    mb = 1024 * 1024
    labels = [k for k in rows if not k.startswith("migration")]
    print(f"{'':42}" + "".join(f"{k:>28}" for k in labels))

    def line(name: str, fn) -> None:  # type: ignore[no-untyped-def]
        print(f"{name:42}" + "".join(f"{fn(rows[k]):>28}" for k in labels))

    line("ledger built in", lambda r: f"{r['build']:.0f} s")
    line("partition-offsets removed", lambda r: f"{r['report'].batch_offsets.deleted:,}")
    line("batches removed", lambda r: f"{r['report'].batches.deleted:,}")
    line("kept old partition-offsets (protected)", lambda r: f"{r['report'].batch_offsets.kept:,}")
    line("prune --execute, seconds", lambda r: f"{r['report'].seconds:.2f}")
    line("  of which islands (pruned_ranges)", lambda r: f"{r['report'].islands_seconds:.2f}")
    line("  of which partition swaps (+ their batches)",
         lambda r: f"{r['report'].swap_seconds:.2f} ({r['report'].partitions_swapped} swapped)")
    line("    the swaps themselves (copy kept, swap)", lambda r: f"{sum(x[2] for x in r['swaps']):.2f}")
    line("    their longest exclusive lock", lambda r: f"{max((x[3] for x in r['swaps']), default=0):.3f}")
    line("    rows copied into the new partitions", lambda r: f"{sum(x[0] for x in r['swaps']):,}")
    line("  rest: what to keep, counts, chunked DELETE",
         lambda r: f"{r['report'].seconds - r['report'].islands_seconds - r['report'].swap_seconds:.2f}")
    line("  islands written (md5 of their rows)", lambda r: f"{r['report'].islands:,} ({r['digest'][:8]})")
    line("offset_ranges table+index+toast, before", lambda r: f"{r['before']['offset_ranges'] / mb:,.0f} MB")
    line("offset_ranges table+index+toast, after", lambda r: f"{r['after']['offset_ranges'] / mb:,.0f} MB")
    line("offset_ranges dead tuples after", lambda r: f"{r['dead']:,}")
    line("batches table+index, before -> after",
         lambda r: f"{r['before']['batches'] / mb:,.0f} -> {r['after']['batches'] / mb:,.0f} MB")
    line("batches dead tuples after (autovacuum's)", lambda r: f"{r['dead_b']:,}")
    if "migration 0020" in rows:
        m = rows["migration 0020"]
        print(f"0020 on the built 0019 ledger (before the prune): {m['seconds']:.2f} s, of which locked (writers "
              f"wait) {m['locked']:.2f} s")
    if "migration" in rows:
        m = rows["migration"]
        print(f"0018 on the 0017 copy ({m['rows']:,} offset_ranges rows, {m['offsets']:,} partition-offsets): "
              f"{m['seconds']:.2f} s, of which locked (writers wait) {m['locked']:.2f} s")
    return 0


def _time_upgrade(engine: Engine) -> dict[str, float]:
    """``db upgrade`` to head on the built ledger: its whole time and its locked step (printed by it)."""
    import contextlib
    import io
    import re

    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err):
        upgrade(engine)
    found = re.search(r"writers waited ([\d.]+) s", err.getvalue())
    return {"seconds": time.perf_counter() - t0, "locked": float(found.group(1)) if found else float("nan")}


def _time_migration(scratch: ScratchDatabase, engine: Engine) -> dict[str, float]:
    """0018 on a copy of the built 0017 ledger: its whole time and its locked step (printed by it)."""
    import contextlib
    import io
    import re

    engine.dispose()
    scratch._admin.dispose()
    copy = ScratchDatabase(scratch.admin_url.render_as_string(hide_password=False), scratch.name[:40] + "_m",
                           template=scratch.name)
    other = make_engine(copy.dsn)
    try:
        with other.connect() as conn:
            n_rows, n_offsets = conn.execute(text(
                "SELECT count(*), COALESCE(SUM(cardinality(partitions)), 0) FROM offset_ranges")).one()
        err = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(err):
            upgrade(other)
        seconds = time.perf_counter() - t0
        found = re.search(r"writers waited ([\d.]+) s", err.getvalue())
        return {"rows": int(n_rows), "offsets": int(n_offsets), "seconds": seconds,
                "locked": float(found.group(1)) if found else float("nan")}
    finally:
        other.dispose()
        copy.drop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("OFFSET_LEDGER_TEST_DSN"),
                        help="a Postgres server to create the scratch database on (default: OFFSET_LEDGER_TEST_DSN)")
    parser.add_argument("--pipelines", type=int, default=4)
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=25)
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    parser.add_argument("--fleet-day", action="store_true",
                        help="prune one day of two of a fleet-like ledger, by partition (0018) beside today's "
                             "DELETE (0017) on the same data; size: --pipelines x --partitions x --day-batches")
    parser.add_argument("--day-batches", type=int, default=850,
                        help="--fleet-day: batches a pipeline records a day (default 850: with 200 pipelines of "
                             "100 partitions, 17M partition-offsets a day)")
    parser.add_argument("--width", type=int, default=0,
                        help="--fleet-day: batch ids a partition (default: 6 hours of the fleet's batches)")
    parser.add_argument("--islands-before", action="store_true",
                        help="--fleet-day: also prune a third build at 0018 recording the islands per "
                             "partition-offset, as prune did before they were computed per compact row")
    parser.add_argument("--skip-delete", action="store_true",
                        help="--fleet-day: leave out the 0017 (DELETE) build")
    parser.add_argument("--migration", action="store_true",
                        help="--fleet-day: also time 0018 on a copy of the built 0017 ledger (its locked step)")
    args = parser.parse_args()
    if not args.dsn:
        print("bench_prune: give --dsn or source .devstack/stack.env (OFFSET_LEDGER_TEST_DSN)", file=sys.stderr)
        return 2
    if args.fleet_day:
        return fleet_day(args)
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
