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
   offsets and record timestamps fetched from the broker. Cold (first scrape: every timestamp read)
   and warm (the next scrapes). Target: < 500 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench_record  # noqa: E402 - sibling module; benchmarks run as scripts
from _scratch import ScratchDatabase  # noqa: E402

from offset_ledger.capture.listener import OffsetLedgerListener  # noqa: E402
from offset_ledger.ledger.engine import make_engine, upgrade  # noqa: E402
from offset_ledger.ledger.tables import positions, runs  # noqa: E402

TARGET_ADDED_P99_MS = 5.0
TARGET_SCRAPE_MS = 500.0


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
        for i in range(0, len(rows), 2000):
            conn.execute(positions.insert(), rows[i:i + 2000])
    engine.dispose()
    return topics


def scrape(dsn: str, bootstrap: str, scrapes: int) -> tuple[list[float], int, str]:
    from fastapi.testclient import TestClient

    from offset_ledger.api import create_app
    from offset_ledger.config import settings

    client = TestClient(create_app(settings(), dsn=dsn, bootstrap_servers=bootstrap))
    took, body = [], ""
    for _ in range(scrapes):
        t0 = time.perf_counter()
        r = client.get("/metrics")
        took.append(time.perf_counter() - t0)
        assert r.status_code == 200, r.text[:300]
        body = r.text
    return took, sum(1 for line in body.splitlines() if line.startswith("offset_ledger_lag_seconds{")), body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("OFFSET_LEDGER_TEST_DSN"))
    parser.add_argument("--bootstrap-servers", default=os.environ.get("OFFSET_LEDGER_TEST_BOOTSTRAP_SERVERS"))
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--pipelines", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=10)
    args = parser.parse_args(argv)
    if not args.dsn or not args.bootstrap_servers:
        print("bench_mirror: give --dsn and --bootstrap-servers (source .devstack/stack.env)", file=sys.stderr)
        return 2
    failures = []
    scratch = ScratchDatabase(args.dsn, "bench_mirror")
    topics: list[str] = []
    try:
        engine = make_engine(scratch.dsn)
        upgrade(engine)
        engine.dispose()
        with tempfile.TemporaryDirectory() as spool:
            lat = ledger_latency(scratch.dsn, args.bootstrap_servers, args.batches, args.partitions, Path(spool))
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

        topics = seed_scrape(scratch.dsn, args.bootstrap_servers, args.pipelines)
        took, series, _body = scrape(scratch.dsn, args.bootstrap_servers, args.scrapes)
        cold, warm = took[0] * 1000, pct(took[1:], 0.99) * 1000 if len(took) > 1 else float("nan")
        print(f"\n2. GET /metrics, {args.pipelines} pipelines x 100 partitions ({series} lag_seconds series)")
        print(f"cold (every timestamp fetched): {cold:8.1f} ms   target < {TARGET_SCRAPE_MS:.0f} ms   "
              f"ratio {cold / TARGET_SCRAPE_MS:.2f}")
        print(f"warm p99 of {len(took) - 1}:            {warm:8.1f} ms   target < {TARGET_SCRAPE_MS:.0f} ms   "
              f"ratio {warm / TARGET_SCRAPE_MS:.2f}")
        if warm >= TARGET_SCRAPE_MS:
            failures.append(f"warm scrape {warm:.0f} ms")
        if cold >= TARGET_SCRAPE_MS:
            failures.append(f"cold scrape {cold:.0f} ms")
    finally:
        if topics:
            from kafka import KafkaAdminClient

            admin = KafkaAdminClient(bootstrap_servers=args.bootstrap_servers)
            admin.delete_topics(topics)
            admin.close()
        scratch.drop()
    for failure in failures:
        print(f"MISSED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
