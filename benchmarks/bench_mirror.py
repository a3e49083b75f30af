"""Cost of the Kafka consumer-group mirror, and a /metrics scrape with time lag at scale.

    source .devstack/stack.env   # or pass --dsn / --bootstrap-servers
    .venv/bin/python benchmarks/bench_mirror.py [--batches 200] [--partitions 32] [--pipelines 100]

1. Ledger latency with and without ``commit_to_kafka=True``: per batch, the time from handing the
   listener a committed batch's progress event to ``flush()`` returning (the row is durable),
   p50/p99 over ``--batches`` isolated batches, the two listeners interleaved round by round.
   Target: the mirror adds < 5 ms to the p99.
2. ``GET /metrics`` (in-process ASGI client, the real app) with ``--pipelines`` x 100 partitions:
   positions seeded in the ledger, the partitions real on the broker (10 topics of 100 partitions,
   each read by a tenth of the pipelines, at different offsets, most with lag), watermarks, group
   offsets and record timestamps fetched from the broker. Cold (a new server process's first
   scrape: Kafka clients made, every timestamp read) and warm (p99 of the next ``--scrapes``).
   Targets: cold < 500 ms, warm p99 < 250 ms. Each of ``--rounds`` rounds runs the scrapes in a
   fresh process; with ``--baseline-tree DIR`` (a checkout of the commit to compare with, e.g.
   ``git archive <commit> | tar -x -C DIR``) the rounds alternate between that code and this one,
   over the same topics and rows (the baseline on a copy of the database at its own schema revision), and the ratios are printed side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A scrape worker for --baseline-tree imports the package from that tree instead.
sys.path.insert(0, os.environ.get("BENCH_CODE_ROOT") or str(ROOT))

import bench_record  # noqa: E402 - sibling module; benchmarks run as scripts
from _scratch import ScratchDatabase, baseline_copy  # noqa: E402

from offset_ledger.capture.listener import OffsetLedgerListener  # noqa: E402
from offset_ledger.ledger.engine import make_engine, upgrade  # noqa: E402
from offset_ledger.ledger.tables import runs  # noqa: E402

TARGET_ADDED_P99_MS = 5.0
TARGET_COLD_SCRAPE_MS = 500.0
TARGET_WARM_SCRAPE_MS = 250.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ledger_latency(dsn: str, bootstrap: str, batches: int, partitions: int, spool: Path) -> dict[str, list[float]]:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    topic = f"bench_mirror_{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    bench_record.TOPIC = topic
    out: dict[str, list[float]] = {"without": [], "with": []}
    made = {}
    try:
        for label, mirror in (("without", False), ("with", True)):
            listener = OffsetLedgerListener(
                dsn=dsn, pipeline=f"lat_{label}_{uuid.uuid4().hex[:6]}", spool_dir=spool, health_interval=3600,
                commit_to_kafka=mirror, bootstrap_servers=bootstrap if mirror else None)
            query_id = str(uuid.uuid4())
            listener.accept_json("progress", bench_record.progress_json(query_id, 0, partitions))
            assert listener.flush(60)
            made[label] = (listener, query_id)
        for b in range(1, batches + 1):
            for label in ("without", "with"):  # interleaved: machine load hits both alike
                listener, query_id = made[label]
                payload = bench_record.progress_json(query_id, b, partitions)
                t0 = time.perf_counter()
                listener.accept_json("progress", payload)
                assert listener.flush(60)
                out[label].append(time.perf_counter() - t0)
            time.sleep(0.005)  # a pipeline's batches come apart; let the mirror do its work between them
        listener, _ = made["with"]
        assert listener.flush_mirror(60), listener.health()
        out["mirror_commits"] = [float(listener.health().mirror["commits"])]  # type: ignore[index]
    finally:
        for listener, _ in made.values():
            listener.close(30)
        admin.delete_topics([topic])
        admin.close()
    return out


def seed_scrape(dsn: str, bootstrap: str, pipelines: int) -> list[str]:
    """10 topics x 100 partitions with 50 timestamped records each; ``pipelines`` pipelines over them."""
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    tag = uuid.uuid4().hex[:6]
    topics = [f"bench_scrape_{tag}_{i}" for i in range(10)]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=60000)
    admin.create_topics([NewTopic(t, num_partitions=100, replication_factor=1) for t in topics])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=65536)
    now_ms = int(time.time() * 1000)
    deadline = time.monotonic() + 60
    while any(len(producer.partitions_for(t) or ()) < 100 for t in topics) and time.monotonic() < deadline:
        time.sleep(0.2)
    for t in topics:
        for p in range(100):
            for i in range(50):
                producer.send(t, value=b"x", partition=p, timestamp_ms=now_ms - (50 - i) * 1000)
    producer.flush()
    producer.close()
    engine = make_engine(dsn)
    rnd = random.Random(7)
    now = datetime.now(timezone.utc)
    rows, run_rows = [], []
    for n in range(pipelines):
        topic = topics[n % len(topics)]
        name = f"scrape_{n:03d}"
        run_rows.append({"run_id": f"run-{n}", "query_id": f"q-{n}", "pipeline": name, "consumer_group": name,
                         "started_at": now, "last_heartbeat_at": now})
        rows += [{"pipeline": name, "consumer_group": name, "topic": topic, "partition": p,
                  "next_offset": rnd.choice([50, rnd.randrange(0, 50)]), "updated_at": now,
                  "query_id": f"q-{n}", "batch_id": 1} for p in range(100)]
    with engine.begin() as conn:
        conn.execute(runs.insert(), run_rows)
        # A row per topic, as the ledger keeps them (benchmarks/_seed.py); imported here, by the seeding
        # process only: a baseline tree's scrape workers run this script without ledger.position_store.
        from _seed import seed_rows

        seed_rows(conn, rows)
    engine.dispose()
    return topics


def scrape(dsn: str, bootstrap: str, scrapes: int) -> tuple[list[float], int, str]:
    from fastapi.testclient import TestClient

    from offset_ledger.api import create_app
    from offset_ledger.config import settings

    # A loopback host name: the API refuses other Host headers (DNS rebinding guard), TestClient's "testserver" too.
    client = TestClient(create_app(settings(), dsn=dsn, bootstrap_servers=bootstrap), base_url="http://localhost")
    took, body = [], ""
    for _ in range(scrapes):
        t0 = time.perf_counter()
        r = client.get("/metrics")
        took.append(time.perf_counter() - t0)
        assert r.status_code == 200, r.text[:300]
        body = r.text
    return took, sum(1 for line in body.splitlines() if line.startswith("offset_ledger_lag_seconds{")), body


def latency_part(args: argparse.Namespace, dsn: str, failures: list[str]) -> None:
    with tempfile.TemporaryDirectory() as spool:
        lat = ledger_latency(dsn, args.bootstrap_servers, args.batches, args.partitions, Path(spool))
    ms = {k: (pct(v, 0.5) * 1000, pct(v, 0.99) * 1000) for k, v in lat.items() if k != "mirror_commits"}
    added = ms["with"][1] - ms["without"][1]
    print(f"\n1. batch -> durable ledger row, {args.partitions} partitions, {args.batches} batches")
    print(f"{'':>16} {'p50 ms':>8} {'p99 ms':>8}")
    for label in ("without", "with"):
        print(f"{label + ' mirror':>16} {ms[label][0]:8.2f} {ms[label][1]:8.2f}")
    print(f"added p99: {added:.2f} ms   target < {TARGET_ADDED_P99_MS:.0f} ms   ratio {added / TARGET_ADDED_P99_MS:.2f}"
          f"   (mirror commits: {int(lat['mirror_commits'][0])})")
    if added >= TARGET_ADDED_P99_MS:
        failures.append(f"mirror adds {added:.2f} ms to the p99")


def scrape_in_worker(tree: str | None, dsn: str, bootstrap: str, scrapes: int) -> dict[str, float]:
    """``scrape`` in a fresh process (a cold server), importing the package from ``tree`` (None: this checkout)."""
    env = dict(os.environ)
    if tree:
        env["BENCH_CODE_ROOT"] = str(Path(tree).resolve())
        env["PYTHONPATH"] = env["BENCH_CODE_ROOT"] + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, __file__, "--scrape-worker", "--dsn", dsn, "--bootstrap-servers", bootstrap,
                           "--scrapes", str(scrapes)], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"scrape worker failed ({tree or 'this checkout'}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def scrape_worker(args: argparse.Namespace) -> int:
    took, series, _body = scrape(args.dsn, args.bootstrap_servers, args.scrapes)
    warm = took[1:] or [float("nan")]
    print(json.dumps({"cold": took[0] * 1000, "warm_p50": pct(warm, 0.5) * 1000, "warm_p99": pct(warm, 0.99) * 1000,
                      "series": series}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("OFFSET_LEDGER_TEST_DSN"))
    parser.add_argument("--bootstrap-servers", default=os.environ.get("OFFSET_LEDGER_TEST_BOOTSTRAP_SERVERS"))
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--pipelines", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=10, help="scrapes per round (the first is the cold one)")
    parser.add_argument("--rounds", type=int, default=3, help="scrape rounds, each in a fresh process")
    parser.add_argument("--baseline-tree", help="a checkout of the code to compare with (rounds alternate)")
    parser.add_argument("--skip-latency", action="store_true", help="only the /metrics part")
    parser.add_argument("--scrape-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.dsn or not args.bootstrap_servers:
        print("bench_mirror: give --dsn and --bootstrap-servers (source .devstack/stack.env)", file=sys.stderr)
        return 2
    if args.scrape_worker:
        return scrape_worker(args)
    failures: list[str] = []
    scratch = ScratchDatabase(args.dsn, "bench_mirror")
    base_db: ScratchDatabase | None = None
    topics: list[str] = []
    try:
        engine = make_engine(scratch.dsn)
        upgrade(engine)
        engine.dispose()
        if not args.skip_latency:
            latency_part(args, scratch.dsn, failures)

        topics = seed_scrape(scratch.dsn, args.bootstrap_servers, args.pipelines)
        sides = [("baseline", args.baseline_tree), ("now", None)] if args.baseline_tree else [("now", None)]
        dsn_of = {"now": scratch.dsn}
        if args.baseline_tree:
            base_db = baseline_copy(scratch, args.baseline_tree)  # the same rows at the baseline's schema
            dsn_of["baseline"] = base_db.dsn
        got: dict[str, list[dict[str, float]]] = {label: [] for label, _ in sides}
        series = 0
        for r in range(args.rounds):
            for label, tree in (sides if r % 2 == 0 else sides[::-1]):  # alternate who goes first
                one = scrape_in_worker(tree, dsn_of[label], args.bootstrap_servers, args.scrapes)
                got[label].append(one)
                series = int(one["series"])
                print(f"  round {r + 1} {label:>8}: cold {one['cold']:7.1f} ms  warm p50 {one['warm_p50']:6.1f} "
                      f"p99 {one['warm_p99']:6.1f} ms", file=sys.stderr)
        print(f"\n2. GET /metrics, {args.pipelines} pipelines x 100 partitions ({series} lag_seconds series), "
              f"{args.rounds} rounds (a fresh process each: cold = its first scrape, warm = p99 of the next "
              f"{args.scrapes - 1}); median over rounds [range]")
        med = {label: {k: statistics.median(x[k] for x in runs) for k in ("cold", "warm_p50", "warm_p99")}
               for label, runs in got.items()}
        for key, target in (("cold", TARGET_COLD_SCRAPE_MS), ("warm_p50", None), ("warm_p99", TARGET_WARM_SCRAPE_MS)):
            cells = []
            for label in got:
                values = [x[key] for x in got[label]]
                cells.append(f"{label} {med[label][key]:7.1f} ms [{min(values):.0f}-{max(values):.0f}]")
            ratio = f"   now/baseline {med['now'][key] / med['baseline'][key]:.2f}x" if "baseline" in med else ""
            tgt = f"   target < {target:.0f} ms: {med['now'][key] / target:.2f}x" if target else ""
            print(f"  {key:9} " + "   ".join(cells) + ratio + tgt)
        if med["now"]["warm_p99"] >= TARGET_WARM_SCRAPE_MS:
            failures.append(f"warm scrape p99 {med['now']['warm_p99']:.0f} ms")
        if med["now"]["cold"] >= TARGET_COLD_SCRAPE_MS:
            failures.append(f"cold scrape {med['now']['cold']:.0f} ms")
    finally:
        if topics:
            from kafka import KafkaAdminClient

            admin = KafkaAdminClient(bootstrap_servers=args.bootstrap_servers)
            admin.delete_topics(topics)
            admin.close()
        scratch.drop()
        if base_db is not None:
            base_db.drop()
    for failure in failures:
        print(f"MISSED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
