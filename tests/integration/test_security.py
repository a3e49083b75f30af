"""Safe by default over real HTTP (uvicorn, real curl) against real Postgres and Kafka, and a real
Spark query held by a forced reset: its findings stay bounded and count what Spark reports."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select

from offset_ledger.operate import reset_operations
from offset_ledger import OffsetLedgerListener
from offset_ledger.api import create_app
from offset_ledger.api.tokens import ApiToken
from offset_ledger.ledger.engine import make_engine
from offset_ledger.ledger.tables import findings
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.resets import ResetRequest
from tests.integration.test_api import Server
from tests.ops_seed import seed_pipeline

OPERATE = ApiToken("release-bot", "operate", b"operate-" + b"x" * 24)
READ = ApiToken("grafana", "read", b"read-" + b"y" * 24)


def _curl(url: str, *args: str) -> tuple[int, dict]:
    out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", *args, url], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    body, status = out.rsplit("\n", 1)
    return int(status), json.loads(body)


@pytest.mark.parametrize("with_token", [False, True])
def test_cross_site_refused_and_seed_curl_lines_pass(ledger, pg_dsn: str, kafka, with_token: bool) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(200)])  # 100 per partition
    seed_pipeline(ledger, "orders", {topic: {0: 40, 1: 50}})
    tokens = [OPERATE, READ] if with_token else []
    auth = ["-H", f"Authorization: Bearer {OPERATE.secret.decode()}"] if with_token else []
    app = create_app(dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers, tokens=tokens)
    with Server(app) as srv:
        api = srv.url
        positions = lambda: _curl(f"{api}/v1/getCurrentOffsets/?pipelineName=orders", *auth)[1]  # noqa: E731
        body = json.dumps({topic: {"0": 10, "1": 10}})
        attacks = [
            ("img GET", "/v1/resetOffsetOfAllPartitionsToLatest?pipelineName=orders",
             ["-H", "Sec-Fetch-Site: cross-site", "-H", "Sec-Fetch-Dest: image"]),
            ("form POST", "/v1/resetOffsetOfPartitions?pipelineName=orders",
             ["-X", "POST", "-H", "Origin: https://evil.example", "-H", "Sec-Fetch-Site: cross-site", "-d", body]),
            ("text/plain POST", "/v1/resetOffsetOfPartitions?pipelineName=orders",
             ["-X", "POST", "-H", "Content-Type: text/plain", "-d", body]),
            ("foreign Origin", "/v1/resetOffsetOfAllPartitionsToEarliest?pipelineName=orders",
             ["-X", "POST", "-H", "Origin: http://localhost:8000"]),
            ("foreign Host", "/v1/resetOffsetOfAllPartitionsToEarliest?pipelineName=orders",
             ["-H", "Host: rebound.attacker.example"]),
            ("resource reset", "/api/v1/pipelines/orders/resets",
             ["-X", "POST", "-H", "Content-Type: application/json", "-H", "Origin: http://evil.example",
              "-d", json.dumps({"mode": "latest", "dryRun": False, "reason": "x"})]),
        ]
        for what, path, args in attacks:
            status, err = _curl(api + path, *args, *auth)
            assert status in (400, 403, 415), (what, status, err)
            assert positions() == {topic: {"0": 40, "1": 50}}, what
        audit = _curl(f"{api}/api/v1/pipelines/orders/resets", *auth)[1]["resets"]
        assert audit == []

        # The README's curl lines, unchanged (plus the token when the server has one).
        assert _curl(f"{api}/v1/getTopicDetails/?topicName={topic}", *auth)[0] == 200
        assert _curl(f"{api}/v1/resetOffsetOfAllPartitionsToEarliest/?pipelineName=orders", *auth) == (
            200, {topic: {"0": 0, "1": 0}})
        assert _curl(f"{api}/v1/resetOffsetOfAllPartitionsToLatest/?pipelineName=orders", "-X", "POST", *auth) == (
            200, {topic: {"0": 100, "1": 100}})
        assert _curl(f"{api}/v1/resetOffsetOfPartitions/?pipelineName=orders", "-X", "GET",
                     "-H", "Accept: application/json", "-H", "Content-Type: application/json", "-d", body, *auth) == (
            200, {topic: {"0": 10, "1": 10}})
        status, done = _curl(f"{api}/api/v1/pipelines/orders/resets", "-X", "POST",
                             "-H", "Content-Type: application/json", *auth,
                             "-d", json.dumps({"mode": "shift", "shiftBy": 5, "dryRun": False,
                                               "reason": "replay", "actor": "alice"}))
        assert status == 200 and done["newPositions"] == {topic: {"0": 15, "1": 15}}
        audit = _curl(f"{api}/api/v1/pipelines/orders/resets", *auth)[1]["resets"]
        if with_token:
            assert [a["actor"] for a in audit] == ["release-bot (alice)"] + ["release-bot"] * 3
            read = ["-H", f"Authorization: Bearer {READ.secret.decode()}"]
            assert _curl(f"{api}/v1/resetOffsetOfAllPartitionsToEarliest/?pipelineName=orders", *read)[0] == 403
            assert _curl(f"{api}/v1/getCurrentOffsets/?pipelineName=orders", *read)[0] == 200
        else:
            assert [a["actor"] for a in audit] == ["alice"] + ["legacy-api"] * 3
        assert positions() == {topic: {"0": 15, "1": 15}}

        # Inputs that answered 500: a lone surrogate in a legacy body, a cursor id beyond BIGINT.
        for method in ("GET", "POST"):
            status, err = srv.raw(method, "/v1/resetOffsetOfPartitions?pipelineName=orders", b'{"\\ud800": {"0": 1}}',
                                  {"Content-Type": "application/json", **(
                                      {"Authorization": f"Bearer {OPERATE.secret.decode()}"} if with_token else {})})
            assert status == 400, err
        from datetime import datetime, timezone

        from offset_ledger.operate.inputs import encode_cursor

        cursor = encode_cursor(datetime.now(timezone.utc), 2**63)
        status, err = _curl(f"{api}/api/v1/pipelines/orders/history?cursor={cursor}", *auth)
        assert status == 400 and err["error"] == "InvalidInput"
        assert positions() == {topic: {"0": 15, "1": 15}}


def test_forced_reset_under_a_running_query_leaves_one_counted_finding_per_partition(
        ledger, pg_dsn: str, kafka, spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    partitions = 3
    topic = kafka.create_topic(partitions=partitions)
    kafka.produce(topic, [f"a{i}" for i in range(30)])
    listener = OffsetLedgerListener(dsn=pg_dsn, pipeline="held", spool_dir=tmp_path / "spool")
    spark.streams.addListener(listener)
    query = None
    try:
        query = (spark.readStream.format("kafka")
                 .option("kafka.bootstrap.servers", kafka.bootstrap_servers).option("subscribe", topic)
                 .option("startingOffsets", "earliest").load()
                 .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(processingTime="200 milliseconds").start())
        query.processAllAvailable()
        assert listener.flush(60), listener.health()
        before = query.lastProgress["batchId"]
        ops = Operations(make_engine(pg_dsn), bootstrap_servers=kafka.bootstrap_servers)
        try:
            outcome = reset_operations.reset(ops, "held", ResetRequest("earliest"), actor="oncall", reason="incident", dry_run=False,
                                force=True)
        finally:
            ops.close()
        assert outcome.stored is not None
        for round_ in range(12):  # each round is at least one more batch of the running query
            kafka.produce(topic, [f"b{round_}-{i}" for i in range(6)])
            query.processAllAvailable()
        after = query.lastProgress["batchId"]
        assert listener.flush(60), listener.health()
    finally:
        if query is not None:
            query.stop()
        spark.streams.removeListener(listener)
        listener.close(10)
    held = after - before  # batches Spark committed after the reset, each reporting every partition
    assert held >= 12
    with ledger.connect() as conn:
        rows = conn.execute(select(findings).where(findings.c.pipeline == "held")
                            .order_by(findings.c.partition)).all()
    assert [(r.kind, r.partition) for r in rows] == [("pending_reset", p) for p in range(partitions)]
    assert [r.occurrences for r in rows] == [held] * partitions
    assert all(r.last_seen_at >= r.created_at for r in rows)
    with ledger.connect() as conn:
        from offset_ledger.ledger.tables import positions

        assert {r.next_offset for r in conn.execute(select(positions).where(positions.c.pipeline == "held"))} == {0}
