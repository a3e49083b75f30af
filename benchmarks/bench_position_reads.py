"""The position reads of a restart and of /metrics, before and after they read topic_positions' rows (issue 49).

    source .devstack/stack.env
    flock /tmp/offset-ledger-stack.lock .venv/bin/python benchmarks/bench_position_reads.py [CALLS]

A scratch ledger at head: one pipeline with 100 topics x 100 partitions and 200 more of one topic each
(30,000 positions, seeded as the ledger keeps them: benchmarks/_seed.py). Times, CALLS alternating calls
each (default 30; 10 for /metrics' read), median [range]: the restart's ledger read (``current_positions``)
through ``v_positions`` and from the arrays; its re-read under the lock (``positions_moved``) both ways;
``positions_and_window`` (/metrics' ledger read) with the per-partition statement over ``v_positions`` and
with the row per topic (``queries.positions_and_window_pg``), and a per-partition statement over the arrays
(``DIRECT``). Every pair's answers are asserted equal first. Figures: docs/benchmarks.md (issue 49).
"""
import os, statistics, sys, time
from datetime import datetime, timezone
from _scratch import ScratchDatabase
from _seed import seed_positions
from sqlalchemy import select, text
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.queries import current_positions
from offset_ledger.ledger.position_check import positions_moved, _PG_MOVED
from offset_ledger.ledger.tables import positions
from offset_ledger.ledger.records import pg_int_array, pg_text_array
from offset_ledger.rules.model import Position

def old_current(conn, pipeline):
    stmt = select(positions.c.topic, positions.c.partition, positions.c.next_offset).where(
        positions.c.pipeline == pipeline, positions.c.consumer_group == pipeline)
    rows = conn.execute(stmt.order_by(positions.c.topic, positions.c.partition)).all()
    return [Position(t, p, o) for t, p, o in rows]

OLD_MOVED = text(_PG_MOVED.text.split("), now AS (")[0] + """), now AS (
        SELECT topic, "partition" AS part, next_offset FROM v_positions
        WHERE pipeline = :pipeline AND consumer_group = :consumer_group AND topic = ANY(CAST(:wanted AS text[]))
    )""" + _PG_MOVED.text.split("    )\n", 2)[-1])

def old_moved(conn, pipeline, topics, seen):
    return int(conn.execute(OLD_MOVED, {"pipeline": pipeline, "consumer_group": pipeline, "wanted": pg_text_array(sorted(topics)),
        "topics": pg_text_array([p.topic for p in seen]), "partitions": pg_int_array([p.partition for p in seen]),
        "offsets": pg_int_array([p.next_offset for p in seen])}).scalar_one())

DIRECT = """
WITH g AS MATERIALIZED (
  SELECT t.pipeline, t.consumer_group, t.topic, t.partitions, t.next_offsets, t.stamps, t.moved_at, t.moved_query_ids,
         row_number() OVER () AS n
  FROM topic_positions t
), w AS (
  SELECT x.n, x.partition, min(x.from_offset) AS lo, max(x.until_offset) AS hi FROM (
     SELECT g.n, unnest(r.partitions) AS partition, unnest(r.from_offsets) AS from_offset, unnest(r.until_offsets) AS until_offset
     FROM g JOIN batches b ON b.pipeline = g.pipeline AND b.consumer_group = g.consumer_group AND b.batch_time >= :since
            JOIN offset_ranges r ON r.batch_pk = b.id AND r.topic = g.topic) x
  GROUP BY x.n, x.partition
)
SELECT g.pipeline, g.consumer_group, g.topic, u.partition, u.next_offset,
       CASE WHEN g.moved_at[coalesce(u.stamp, 1)] >= :since AND g.moved_query_ids[coalesce(u.stamp, 1)] IS NOT NULL
            THEN 1 ELSE 0 END AS moved, w.lo, w.hi
FROM g CROSS JOIN LATERAL unnest(g.partitions, g.next_offsets, g.stamps) AS u (partition, next_offset, stamp)
LEFT JOIN w ON w.n = g.n AND w.partition = u.partition
ORDER BY g.pipeline, g.consumer_group, g.topic, u.partition
"""

s = ScratchDatabase(os.environ["OFFSET_LEDGER_TEST_DSN"], "reader_ab")
try:
    e = make_engine(s.dsn); upgrade(e)
    topics = [f"t{i:03d}" for i in range(100)]
    with e.begin() as c:
        for t in topics:
            seed_positions(c, ["bench"], lambda _: t, 100, 12345678, datetime.now(timezone.utc), lambda _: "q", 9)
        # other pipelines, so the index matters
        seed_positions(c, [f"other{i}" for i in range(200)], lambda n: "x", 100, 5, datetime.now(timezone.utc), lambda _: "q", 1)
    with e.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("VACUUM ANALYZE"))
    res = {k: [] for k in ("read view", "read arrays", "moved view", "moved arrays")}
    with e.connect() as c:
        a = old_current(c, "bench"); b = current_positions(c, "bench")
        assert a == b and len(a) == 10000, (len(a), len(b))
        assert old_moved(c, "bench", topics, a) == 0 == positions_moved(c, "bench", "bench", topics, a)
        for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30):
            for name, fn in (("read view", lambda: old_current(c, "bench")), ("read arrays", lambda: current_positions(c, "bench")),
                             ("moved view", lambda: old_moved(c, "bench", topics, a)),
                             ("moved arrays", lambda: positions_moved(c, "bench", "bench", topics, a))):
                t0 = time.perf_counter(); fn(); res[name].append((time.perf_counter() - t0) * 1000)
    from datetime import timedelta
    from offset_ledger.ledger.lag_window import _positions_and_window_stmt
    from offset_ledger.operate.lag_insight import positions_and_window
    since = datetime.now(timezone.utc) - timedelta(minutes=5)
    import offset_ledger.ledger.lag_window as li
    def old_pw(c, since):  # the read before: the per-partition statement over v_positions
        try:
            orig = li.positions_and_window_pg
            li.positions_and_window_pg = lambda conn, s, p=None, g=None: conn.execute(_positions_and_window_stmt(p is not None, True), {"since": s, **({"pipeline": p, "consumer_group": g} if p else {})}).all()
            return positions_and_window(c, since)
        finally:
            li.positions_and_window_pg = orig
    with e.connect() as c:
        res["metrics read (all positions)"] = []; res["metrics read before (view)"] = []
        assert old_pw(c, since) == positions_and_window(c, since)
        for i in range(10):
            t0 = time.perf_counter(); pw = positions_and_window(c, since); res["metrics read (all positions)"].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter(); old_pw(c, since); res["metrics read before (view)"].append((time.perf_counter() - t0) * 1000)
        print("positions read by /metrics:", sum(len(v) for v in pw[0].values()))
        direct = text(DIRECT)
        base_rows = c.execute(_positions_and_window_stmt(False, True), {"since": since}).all()
        assert [tuple(r) for r in c.execute(direct, {"since": since}).all()] == [tuple(r) for r in base_rows]
        res["metrics stmt (view)"] = []; res["metrics stmt (arrays)"] = []
        for i in range(10):
            t0 = time.perf_counter(); c.execute(_positions_and_window_stmt(False, True), {"since": since}).all(); res["metrics stmt (view)"].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter(); c.execute(direct, {"since": since}).all(); res["metrics stmt (arrays)"].append((time.perf_counter() - t0) * 1000)
        compiled = _positions_and_window_stmt(False, True).compile(dialect=c.dialect)
        params = {**compiled.params, "since": since}
        plan = c.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + str(compiled), params).fetchall()
        print("\n".join(r[0] for r in plan[-12:]))
    for k, v in res.items():
        print(f"{k:>14}: median {statistics.median(v):6.2f} ms  [{min(v):.2f}-{max(v):.2f}]")
    print(f"read arrays / view {statistics.median(res['read arrays']) / statistics.median(res['read view']):.2f}x; "
          f"moved arrays / view {statistics.median(res['moved arrays']) / statistics.median(res['moved view']):.2f}x")
    e.dispose()
finally:
    s.drop()

