"""The read paths over compact storage (0016 and later) beside the per-partition layout of the release
before it (4cc5ce0), measured in the same run on the same history (issue 35).

    source /tmp/shared-stack/stack.env   # or pass --dsn
    flock /tmp/offset-ledger-stack.lock .venv/bin/python benchmarks/bench_reads.py \
        [--batches 10000] [--partitions 100] [--rounds 3] [--baseline 4cc5ce0 | --baseline-tree DIR]

Builds one pipeline's history at this tree's head (``batches x partitions`` partition-offsets, 1,000,000
by default, generated server-side in time order): three queries (two restarts) and an executed reset
before the third that moves every partition back 50 records, as ``bench_verify.py`` has; the newest
``--recent`` (300) batches lie in the status window (their times are in the future, so the window
holds exactly them however long the run takes; the open run's last heartbeat is a day old, so
``/metrics`` says "not running" in every round, never "running" only in those less than
``OFFSET_LEDGER_RUN_SILENCE_FLOOR`` after the build). A copy of that database is downgraded to the
baseline's head (0014: a ``batch_offsets`` row per partition), so both layouts hold the same facts.
Then, alternating round by round, each tree in a subprocess of its own (``PYTHONPATH``: its checkout)
times, best of ``--repeat`` after a warm-up call:

- ``history first page``: ``reads.history`` (the baseline: ``Operations.history``) (100 batches, their ranges and outputs);
- ``history cursor page``: the same 90% deep into the history (a cursor from the page before);
- ``replay ranges, 60 s``: ``replay`` (the baseline: ``replay_for``) over a minute of batch times in the middle of the history
  (6,000 ranges at 100 partitions) and ``replay ranges, 1 batch`` (one batch of one query);
- ``lag (ledger)``: ``positions_and_window``, the ledger read of ``/lag``, the pipelines list and
  ``/metrics`` (positions with the status window's batches; Kafka is not asked);
- ``verify``: ``verify_pipeline`` over the whole history (best of ``--verify-repeat``);
- ``/metrics cold``: in a fresh process that has imported the modules, ``create_app`` and the first
  ``GET /metrics`` (no Kafka: the ledger's part of the scrape).

Both trees must give the same answers (a digest of each result is compared); the script prints
``figure | this tree | baseline | ratio`` and exits 1 on a different answer or a ratio above
``--target`` (1.0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _scratch import ScratchDatabase, baseline_copy  # noqa: E402
from _seed import seed_positions  # noqa: E402
from sqlalchemy import text  # noqa: E402

from offset_ledger.ledger.engine import make_engine, upgrade  # noqa: E402

STEP = 100      # records per batch and partition
REREAD = 50     # records the reset moves every partition back

_POPULATE = ["""
    INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at, input_rows)
    SELECT 'orders', 'orders', 'q' || least(b / :third, 2), 'r' || least(b / :third, 2),
           b - least(b / :third, 2) * :third, t, t, :step * (:np + 1)
    FROM generate_series(0, :nb) b,
         LATERAL (SELECT :start + b * interval '1 second'
                         + CASE WHEN b > :nb - :recent THEN interval '2 days' ELSE interval '0' END AS t) x
    ORDER BY b
""", """
    INSERT INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
    SELECT bt.id, 0, 'orders', ARRAY(SELECT generate_series(0, :np)),
           array_fill(s.b * :step - CASE WHEN s.b >= 2 * :third THEN :reread ELSE 0 END, ARRAY[:np + 1]),
           array_fill((s.b + 1) * :step - CASE WHEN s.b >= 2 * :third THEN :reread ELSE 0 END, ARRAY[:np + 1])
    FROM batches bt, LATERAL (SELECT least(CAST(substr(bt.query_id, 2) AS int), 2) * :third + bt.batch_id AS b) s
    ORDER BY bt.id
""", """
    INSERT INTO runs (run_id, query_id, pipeline, consumer_group, started_at, terminated_at, last_heartbeat_at)
    SELECT 'r' || q, 'q' || q, 'orders', 'orders', :start, CASE WHEN q < 2 THEN :start END, :start
    FROM generate_series(0, 2) q
""", """
    WITH r AS (
        INSERT INTO resets (pipeline, consumer_group, mode, actor, reason, dry_run, forced, created_at, status)
        VALUES ('orders', 'orders', 'shift', 'bench', 'replay', false, false,
                :start + (2 * :third) * interval '1 second' - interval '0.5 second', 'consumed')
        RETURNING id)
    INSERT INTO reset_partitions (reset_id, topic, "partition", before_next_offset, after_next_offset)
    SELECT r.id, 'orders', p, 2 * :third * :step, 2 * :third * :step - :reread
    FROM r, generate_series(0, :np) p
"""]

# Run in each tree (PYTHONPATH and working directory: its checkout): the warm figures, one process.
_WARM = r"""
import hashlib, json, sys, time
from datetime import datetime
from offset_ledger.ledger.engine import make_engine
from offset_ledger.operate.lag_insight import positions_and_window
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.verifying import verify_pipeline
dsn, cfg = sys.argv[1], json.loads(sys.argv[2])
t = {k: datetime.fromisoformat(v) for k, v in cfg["times"].items()}
engine = make_engine(dsn)
ops = Operations(engine)
try:  # verbs as functions over the context (issue 36)
    from offset_ledger.operate import reads
    from offset_ledger.operate.replay import replay as replay_verb
    def history(**kw):
        return reads.history(ops, "orders", **kw)
    def replay_for(**kw):
        return replay_verb(ops, "orders", **kw)
except ImportError:  # the baseline tree: methods on Operations, replay_for(engine, kafka, pipeline)
    from offset_ledger.operate.replay import replay_for as replay_old
    def history(**kw):
        return ops.history("orders", **kw)
    def replay_for(**kw):
        return replay_old(engine, None, "orders", **kw)
def lag():
    with engine.connect() as conn:
        return positions_and_window(conn, t["window"], "orders", "orders")
def page(p):
    return [(x["queryId"], x["batchId"], [tuple(sorted(r.items())) for r in x["ranges"]]) for x in p.items], p.next_cursor
def replay(r):
    return repr(r)
cases = {
    "history first page": (lambda: history(limit=100), page),
    "history cursor page": (lambda: history(limit=100, cursor=cfg["cursor"]), page),
    "replay ranges, 60 s": (lambda: replay_for(since=t["replay_since"],
                                               until=t["replay_until"]), replay),
    "replay ranges, 1 batch": (lambda: replay_for(batch=cfg["replay_batch"], query_id="q1"),
                               replay),
    "lag (ledger)": (lag, lambda r: (sorted((k, repr(v)) for k, v in r[0].items()),
                                     sorted((k, repr(v)) for k, v in r[1].items()))),
    "verify": (lambda: verify_pipeline(ops, "orders"),
               lambda r: [(s.partition, s.from_offset, s.until_offset, s.kind, s.explained) for x in r.results
                          for s in x.stretches]),
}
out = {}
for name, (fn, digest) in cases.items():
    n = cfg["verify_repeat"] if name == "verify" else cfg["repeat"]
    answer = digest(fn())  # warm-up, and the answer compared between trees
    best = min((lambda s: (fn(), time.perf_counter() - s)[1])(time.perf_counter()) for _ in range(n))
    out[name] = {"s": best, "digest": hashlib.sha1(repr(answer).encode()).hexdigest()}
print(json.dumps(out))
"""

# A fresh process per round: modules imported first, then the app made and scraped once.
_COLD = r"""
import hashlib, json, sys, time
from fastapi.testclient import TestClient
from offset_ledger.api.app import create_app
dsn = sys.argv[1]
t0 = time.perf_counter()
client = TestClient(create_app(dsn=dsn, bootstrap_servers=None), base_url="http://localhost")
first = client.get("/metrics")
t1 = time.perf_counter()
second = client.get("/metrics")
t2 = time.perf_counter()
assert first.status_code == 200, first.text
lines = sorted(l for l in first.text.splitlines() if l.startswith("offset_ledger_") and "seconds" not in l
               and "_age" not in l and "health" not in l)
print(json.dumps({"/metrics cold": {"s": t1 - t0, "digest": hashlib.sha1(repr(lines).encode()).hexdigest()},
                  "/metrics warm": {"s": t2 - t1, "digest": ""}}))
"""


def populate(dsn: str, batches: int, partitions: int, recent: int) -> dict[str, datetime]:
    """The history (see the module's text); returns the times the cases ask about."""
    nb, third = batches - 1, batches // 3
    start = datetime.now(timezone.utc) - timedelta(days=1, seconds=nb - recent)
    params = {"start": start, "nb": nb, "np": partitions - 1, "third": third, "step": STEP, "reread": REREAD,
              "recent": recent}
    engine = make_engine(dsn)
    upgrade(engine)
    with engine.begin() as conn:
        for sql in _POPULATE:
            conn.execute(text(sql), params)
        # Positions as the ledger keeps them (a row per topic, benchmarks/_seed.py); the baseline's copy
        # gets them back per partition from the downgrade.
        seed_positions(conn, ["orders"], lambda _: "orders", partitions, (nb + 1) * STEP - REREAD,
                       datetime.now(timezone.utc), lambda _: "q2", nb - 2 * third)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()
    middle = start + timedelta(seconds=(nb - recent) // 2)  # before the window's jump
    return {"window": datetime.now(timezone.utc) - timedelta(minutes=5), "replay_since": middle,
            "replay_until": middle + timedelta(seconds=60)}


def deep_cursor(dsn: str, depth: int) -> str:
    """The cursor of the history page ``depth`` batches from the newest."""
    from offset_ledger.operate.inputs import encode_cursor

    engine = make_engine(dsn)
    with engine.connect() as conn:
        t, i = conn.execute(text("SELECT batch_time, id FROM batches ORDER BY batch_time DESC, id DESC "
                                 "OFFSET :n LIMIT 1"), {"n": depth}).one()
    engine.dispose()
    return encode_cursor(t, i)


def run(code: str, tree: str, dsn: str, *args: str) -> dict[str, dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    env["PYTHONPATH"] = tree
    out = subprocess.run([sys.executable, "-c", code, dsn, *args], cwd=tree, env=env, capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench_reads: the run in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("OFFSET_LEDGER_TEST_DSN"))
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--recent", type=int, default=300, help="batches inside the status window")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per case and round (best kept)")
    parser.add_argument("--verify-repeat", type=int, default=1)
    parser.add_argument("--baseline", default="4cc5ce0", help="the commit to compare with (git archive)")
    parser.add_argument("--baseline-tree", help="a checkout of the baseline instead of --baseline")
    parser.add_argument("--target", type=float, default=1.0)
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or OFFSET_LEDGER_TEST_DSN) is required")
    with tempfile.TemporaryDirectory() as tmp:
        tree = args.baseline_tree
        if tree is None:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline], capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            tree = tmp
        scratch = ScratchDatabase(args.dsn, "bench_reads")
        base = None
        try:
            started = time.monotonic()
            times = populate(scratch.dsn, args.batches, args.partitions, args.recent)
            base = baseline_copy(scratch, tree)
            plain = make_engine(base.dsn)
            with plain.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE"))
            plain.dispose()
            print(f"ledger: {args.batches * args.partitions:,} partition-offsets ({args.batches:,} batches x "
                  f"{args.partitions} partitions, 3 queries, 1 reset, {args.recent} batches in the status window); "
                  f"both layouts built in {time.monotonic() - started:.0f} s", flush=True)
            cfg = {"times": {k: v.isoformat() for k, v in times.items()},
                   "cursor": deep_cursor(scratch.dsn, args.batches * 9 // 10), "replay_batch": args.batches // 6,
                   "repeat": args.repeat, "verify_repeat": args.verify_repeat}
            sides = {"now": (str(ROOT), scratch.dsn), "base": (tree, base.dsn)}
            best: dict[str, dict[str, float]] = {"now": {}, "base": {}}
            digests: dict[str, dict[str, str]] = {"now": {}, "base": {}}
            for i in range(args.rounds):
                order = ("now", "base") if i % 2 == 0 else ("base", "now")
                for side in order:
                    path, dsn = sides[side]
                    got = {**run(_WARM, path, dsn, json.dumps(cfg)), **run(_COLD, path, dsn)}
                    for name, r in got.items():
                        best[side][name] = min(best[side].get(name, float("inf")), float(r["s"]))  # type: ignore[arg-type]
                        digests[side][name] = str(r["digest"])
                print(f"round {i + 1}/{args.rounds} done", flush=True)
        finally:
            if base is not None:
                base.drop()
            scratch.drop()
    label = args.baseline_tree or args.baseline
    print()
    print(f"| figure ({args.batches * args.partitions:,} partition-offsets, best of {args.rounds} rounds) "
          f"| this tree | baseline ({label}) | ratio |")
    print("|---|---:|---:|---:|")
    ok = True
    for name in best["now"]:
        now, was = best["now"][name], best["base"][name]
        same = digests["now"][name] == digests["base"][name]
        ok &= same and (now / was <= args.target or name == "/metrics warm")
        print(f"| {name} | {now * 1000:,.1f} ms | {was * 1000:,.1f} ms | {now / was:.2f}x"
              f"{'' if same else ' (DIFFERENT ANSWER)'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
