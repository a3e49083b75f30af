"""The REST API over real HTTP (uvicorn on a free loopback port) against real Kafka and Postgres."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import uvicorn

from offset_ledger.api import create_app
from offset_ledger.devstack import free_port
from tests.ops_seed import seed_pipeline


class Server:
    """uvicorn serving ``app`` in a thread; ``url`` is its base URL."""

    def __init__(self, app) -> None:  # type: ignore[no-untyped-def]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    def raw(self, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict]:
        """A request with the path sent byte for byte (httpx would fold a leading //)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()


@contextmanager
def serving(dsn: str, bootstrap: str, **kwargs) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    with Server(create_app(dsn=dsn, bootstrap_servers=bootstrap, **kwargs)) as server:
        yield server


CURL = {"Accept": "application/json", "Content-Type": "application/json"}


def test_legacy_endpoints_exact_shapes(ledger, pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, [f"v{i}" for i in range(300)])  # 100 per partition
    kafka.delete_records(topic, {1: 30})                  # retention moved partition 1's log-start
    seed_pipeline(ledger, "orders", {topic: {0: 40, 1: 50, 2: 60}})

    with serving(pg_dsn, kafka.bootstrap_servers) as srv:
        assert srv.raw("GET", "/v1/getCurrentOffsets/?pipelineName=orders", headers=CURL) == (
            200, {topic: {"0": 40, "1": 50, "2": 60}})
        assert srv.raw("GET", f"//v1/getTopicDetails/?topicName={topic}", headers=CURL) == (200, {
            "name": topic,
            "partitions": {"0": {"firstOffset": 0, "lastOffset": 100}, "1": {"firstOffset": 30, "lastOffset": 100},
                           "2": {"firstOffset": 0, "lastOffset": 100}}})
        # The resource route: the same facts under names that say the convention (log-end: the next offset).
        assert srv.raw("GET", f"/api/v1/topics/{topic}", headers=CURL) == (200, {
            "name": topic, "partitions": {"0": {"logStartOffset": 0, "logEndOffset": 100},
                                          "1": {"logStartOffset": 30, "logEndOffset": 100},
                                          "2": {"logStartOffset": 0, "logEndOffset": 100}}})
        assert srv.raw("GET", "//v1/resetOffsetOfAllPartitionsToEarliest/?pipelineName=orders", headers=CURL) == (
            200, {topic: {"0": 0, "1": 30, "2": 0}})
        assert srv.raw("GET", "/v1/getCurrentOffsets?pipelineName=orders") == (200, {topic: {"0": 0, "1": 30, "2": 0}})
        assert srv.raw("POST", "/v1/resetOffsetOfAllPartitionsToLatest/?pipelineName=orders", headers=CURL) == (
            200, {topic: {"0": 100, "1": 100, "2": 100}})
        body = json.dumps({topic: {"0": 10, "1": 35, "2": -2}}).encode()
        # GET with a JSON body, as the original tool's curl lines send it.
        assert srv.raw("GET", "/v1/resetOffsetOfPartitions/?pipelineName=orders", body, CURL) == (
            200, {topic: {"0": 10, "1": 35, "2": 0}})
        # A POST body must be JSON (an HTML form can send the others cross-site); GET takes any.
        status, err = srv.raw("POST", "/v1/resetOffsetOfPartitions?pipelineName=orders",
                              json.dumps({topic: {"0": 11, "1": 36, "2": 1}}).encode(),
                              {"Content-Type": "application/x-www-form-urlencoded", "Accept": "*/*"})
        assert status == 415 and err["error"] == "UnsupportedMediaType"
        status, _ = srv.raw("GET", "/v1/resetOffsetOfPartitions?pipelineName=orders",
                            json.dumps({topic: {"0": 11, "1": 36, "2": 1}}).encode(),
                            {"Content-Type": "application/x-www-form-urlencoded", "Accept": "*/*"})
        assert status == 200
        # A body that misses a partition, or names an unknown one, is a 400 and changes nothing.
        status, err = srv.raw("POST", "/v1/resetOffsetOfPartitions?pipelineName=orders",
                              json.dumps({topic: {"0": 1, "1": 40}}).encode(), CURL)
        assert status == 400 and err["missingPartitions"] == [2]
        status, err = srv.raw("POST", "/v1/resetOffsetOfPartitions?pipelineName=orders",
                              json.dumps({topic: {"0": 1, "1": 40, "2": 1, "3": 1}}).encode(), CURL)
        assert status == 400 and err["error"] == "UnknownPartition"
        status, err = srv.raw("POST", "/v1/resetOffsetOfPartitions?pipelineName=orders",
                              json.dumps({topic: {"0": 1, "1": 5, "2": 1}}).encode(), CURL)  # 5 < log-start 30
        assert status == 400 and err["error"] == "OffsetOutOfRange"
        assert srv.raw("GET", "/v1/getCurrentOffsets?pipelineName=orders") == (200, {topic: {"0": 11, "1": 36, "2": 1}})
        status, err = srv.raw("GET", "/v1/getTopicDetails?topicName=no_such_topic_x")
        assert status == 404 and err["error"] == "UnknownTopic"

        audit = httpx.get(f"{srv.url}/api/v1/pipelines/orders/resets").json()["resets"]
        assert [r["mode"] for r in audit] == ["offsets", "offsets", "latest", "earliest"]
        assert all(r["actor"] == "legacy-api" and r["status"] == "pending" for r in audit)
        assert [(p["beforeNextOffset"], p["afterNextOffset"]) for p in audit[-1]["partitions"]] == [
            (40, 0), (50, 30), (60, 0)]


def test_active_run_conflict_and_force(ledger, pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(20)])
    seed_pipeline(ledger, "live", {topic: {0: 5, 1: 5}}, active=True)
    with serving(pg_dsn, kafka.bootstrap_servers) as srv, httpx.Client(base_url=srv.url) as c:
        r = c.post("/v1/resetOffsetOfAllPartitionsToEarliest?pipelineName=live")
        assert r.status_code == 409 and r.json()["error"] == "ActiveRunConflict"
        r = c.post("/api/v1/pipelines/live/resets", json={"mode": "latest", "dryRun": False, "reason": "r"})
        assert r.status_code == 409
        dry = c.post("/api/v1/pipelines/live/resets", json={"mode": "latest"})
        assert dry.status_code == 200 and dry.json()["activeRunIds"]  # a dry run reports, never blocks
        forced = c.post("/api/v1/pipelines/live/resets",
                        json={"mode": "latest", "dryRun": False, "force": True, "reason": "incident 42",
                              "actor": "oncall"})
        assert forced.status_code == 200, forced.text
        assert forced.json()["newPositions"] == {topic: {"0": 10, "1": 10}}
        audit = c.get("/api/v1/pipelines/live/resets").json()["resets"]
        assert [(r["status"], r["forced"], r["actor"]) for r in audit] == [
            ("pending", True, "oncall"), ("dry_run", False, "api")]
        assert audit[0]["reason"] == "incident 42"


def test_resource_api_reads_and_reset_modes(ledger, pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"a{i}" for i in range(40)])   # 20 per partition
    time.sleep(1.1)
    cut = datetime.now(timezone.utc)
    time.sleep(0.1)
    kafka.produce(topic, [f"b{i}" for i in range(20)])   # 10 more per partition, after `cut`
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    seed_pipeline(ledger, "etl", {topic: {0: 24, 1: 27}}, n_batches=5, start=start)
    with serving(pg_dsn, kafka.bootstrap_servers) as srv, httpx.Client(base_url=srv.url) as c:
        (p,) = c.get("/api/v1/pipelines").json()["pipelines"]
        assert (p["pipeline"], p["state"], p["partitions"], p["lag"]) == ("etl", "stopped", 2, (30 - 24) + (30 - 27))
        assert p["lastBatchTime"].startswith("2024-01-01T00:04") and p["lastBatchId"] == 4

        lag = c.get("/api/v1/pipelines/etl/lag").json()
        assert lag["totalLag"] == 9 and [x["lag"] for x in lag["partitions"]] == [6, 3]

        offsets = c.get("/api/v1/pipelines/etl/offsets").json()
        assert [(x["topic"], x["partition"], x["nextOffset"], x["placedBy"]) for x in offsets["positions"]] == [
            (topic, 0, 24, "batch"), (topic, 1, 27, "batch")]

        page1 = c.get("/api/v1/pipelines/etl/history", params={"limit": 2}).json()
        assert [b["batchId"] for b in page1["batches"]] == [4, 3] and page1["nextCursor"]
        page2 = c.get("/api/v1/pipelines/etl/history", params={"limit": 2, "cursor": page1["nextCursor"]}).json()
        page3 = c.get("/api/v1/pipelines/etl/history", params={"limit": 2, "cursor": page2["nextCursor"]}).json()
        assert [b["batchId"] for b in page2["batches"] + page3["batches"]] == [2, 1, 0]
        assert page3["nextCursor"] is None
        window = c.get("/api/v1/pipelines/etl/history", params={
            "since": (start + timedelta(minutes=1)).isoformat(), "until": "2024-01-01T00:03:00Z", "topic": topic,
        }).json()
        assert [b["batchId"] for b in window["batches"]] == [2, 1]
        assert window["batches"][0]["ranges"][0]["untilOffset"] == 24 * 3 // 5
        other = c.get("/api/v1/pipelines/etl/history", params={"topic": "other_topic"})  # a typo is no empty page
        assert other.status_code == 404 and "topic 'other_topic' is not read by pipeline 'etl'" in other.json()["message"]

        ts = c.post("/api/v1/pipelines/etl/resets", json={"mode": "timestamp", "timestamp": cut.isoformat()}).json()
        assert [(x["targetNextOffset"], x["recordsSkipped"], x["recordsReplayed"]) for x in ts["partitions"]] == [
            (20, 0, 4), (20, 0, 7)]
        shift = c.post("/api/v1/pipelines/etl/resets", json={
            "mode": "shift", "shiftBy": 5, "topics": [{"topic": topic, "partitions": [1]}]}).json()
        (only,) = shift["partitions"]
        assert (only["partition"], only["requestedNextOffset"], only["outOfRange"]) == (1, 32, "above_log_end")
        assert shift["wouldBeRefused"] is True
        r = c.post("/api/v1/pipelines/etl/resets", json={
            "mode": "shift", "shiftBy": 5, "topics": [{"topic": topic, "partitions": [1]}], "dryRun": False,
            "reason": "r"})
        assert r.status_code == 400 and r.json()["error"] == "OffsetOutOfRange"
        r = c.post("/api/v1/pipelines/etl/resets", json={
            "mode": "shift", "shiftBy": 5, "topics": [{"topic": topic, "partitions": [1]}], "dryRun": False,
            "outOfRange": "clamp", "reason": "r"})
        assert r.status_code == 200 and r.json()["newPositions"] == {topic: {"1": 30}}
        assert c.get("/v1/getCurrentOffsets", params={"pipelineName": "etl"}).json() == {topic: {"0": 24, "1": 30}}
        statuses = [x["status"] for x in c.get("/api/v1/pipelines/etl/resets").json()["resets"]]
        assert statuses == ["pending", "dry_run", "dry_run"]  # the refused one wrote nothing

        metrics = c.get("/metrics").text
        assert f'offset_ledger_lag_records{{pipeline="etl",consumer_group="etl",topic="{topic}",partition="0"}} 6' in metrics
        assert f'offset_ledger_position_next_offset{{pipeline="etl",consumer_group="etl",topic="{topic}",partition="1"}} 30' in metrics
        assert "offset_ledger_kafka_up 1" in metrics
        assert c.get("/healthz").json()["status"] == "ok" and c.get("/healthz").json()["ledger"]["reachable"]


def test_kafka_and_database_unreachable_are_503(ledger, pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=1)
    seed_pipeline(ledger, "p", {topic: {0: 0}})
    dead_kafka = f"127.0.0.1:{free_port()}"
    with serving(pg_dsn, dead_kafka, kafka_timeout_ms=2000) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.get(f"/v1/getTopicDetails?topicName={topic}")
        assert r.status_code == 503 and r.json()["error"] == "KafkaUnavailable"
        assert c.post("/v1/resetOffsetOfAllPartitionsToLatest?pipelineName=p").status_code == 503
        # Reads that need only the ledger keep working; the list reports lag as unknown.
        assert c.get("/v1/getCurrentOffsets?pipelineName=p").json() == {topic: {"0": 0}}
        assert c.get("/api/v1/pipelines").json()["pipelines"][0]["lag"] is None
    dead_db = f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/nothing"
    with serving(dead_db, kafka.bootstrap_servers) as srv, httpx.Client(base_url=srv.url) as c:
        for path in ("/v1/getCurrentOffsets?pipelineName=p", "/api/v1/pipelines", "/healthz"):
            r = c.get(path)
            assert r.status_code == 503 and r.json()["error"] == "LedgerUnavailable", path


def test_bearer_token_over_http(ledger, pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=1)
    seed_pipeline(ledger, "p", {topic: {0: 0}})
    with serving(pg_dsn, kafka.bootstrap_servers, api_token="tkn") as srv, httpx.Client(base_url=srv.url) as c:
        assert c.get("/healthz").status_code == 200
        r = c.get("/v1/getCurrentOffsets?pipelineName=p")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/v1/getCurrentOffsets?pipelineName=p", headers={"Authorization": "Bearer tkn"}).status_code == 200


def test_schemathesis_finds_no_server_error(ledger, pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    """Schema-driven fuzzing of every operation in /openapi.json with every schemathesis check
    (``--checks all``): no 5xx, every status and body as documented, whatever the input."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.config import PositiveDataAcceptanceConfig

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(10)])
    seed_pipeline(ledger, "orders", {topic: {0: 2, 1: 3}})
    with serving(pg_dsn, kafka.bootstrap_servers) as srv:
        schema = schemathesis.openapi.from_url(f"{srv.url}/openapi.json")
        # Rules the schema cannot state answer 400/422 to schema-valid input: a legacy body names
        # every partition of its topics, a reset mode needs its parameter, a replay takes a query id
        # or a generation, timestamps are ISO 8601 or epoch ms.
        schema.config.checks.positive_data_acceptance = PositiveDataAcceptanceConfig(
            expected_statuses=["2xx", "400", "401", "403", "404", "409", "422"])
        failures: list[str] = []
        calls: Counter[str] = Counter()
        statuses: Counter[int] = Counter()
        for operation in schema.get_all_operations():
            op = operation.ok()

            @settings(max_examples=25, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy())
            def run(case) -> None:  # type: ignore[no-untyped-def]
                if sum(calls.values()) % 2 == 0:
                    # Every other case names the real pipeline and topic, so the fuzz reaches past
                    # the "unknown pipeline" answer into planning and writing resets.
                    real = {"pipeline": "orders", "pipelineName": "orders", "topic": topic, "topicName": topic}
                    for params in (case.path_parameters, case.query):
                        if params is not None:
                            for key in real.keys() & params.keys():
                                params[key] = real[key]
                response = case.call(base_url=srv.url, timeout=30)
                calls[op.label] += 1
                statuses[response.status_code] += 1
                if response.status_code >= 500:
                    failures.append(f"{op.label}: {response.status_code} {response.text[:300]}")
                try:
                    case.validate_response(response)  # every check
                except Exception as exc:  # noqa: BLE001 - collected, so one run reports them all
                    failures.append(f"{op.label}: {type(exc).__name__}: {str(exc)[:500]}")

            run()
        assert not failures, failures
        assert len(calls) >= 15 and sum(calls.values()) > 200
        # The fuzz reached the handlers (2xx) as well as the validation (4xx).
        assert sum(n for s, n in statuses.items() if s < 300) > 20, statuses
        assert sum(n for s, n in statuses.items() if 400 <= s < 500) > 20, statuses
        print("schemathesis:", sum(calls.values()), "calls", dict(statuses))


def test_reset_over_http_then_spark_resumes_from_it(ledger, pg_dsn: str, kafka, spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The path that matters, all real: Spark + listener record -> HTTP reset -> start_from_ledger
    consumes it -> Spark really reads from the reset offsets -> the ledger moves on from there."""
    from offset_ledger import OffsetLedgerListener, start_from_ledger

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(100)])  # 50 per partition
    name = "resume_" + topic[-6:]
    listener = OffsetLedgerListener(dsn=pg_dsn, pipeline="resume", spool_dir=tmp_path / "spool")
    spark.streams.addListener(listener)

    def run_query(plan):  # type: ignore[no-untyped-def]
        query = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
            .option("subscribe", topic)
            .option("startingOffsets", plan.starting_offsets_json)
            .load()
            .selectExpr("partition", "offset")
            .writeStream.format("memory").queryName(name)
            .option("checkpointLocation", plan.checkpoint_location)
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
            rows = spark.sql(f"SELECT partition, min(offset) AS lo, max(offset) AS hi, count(*) AS n "
                             f"FROM {name} GROUP BY partition ORDER BY partition").collect()
        finally:
            query.stop()
            spark.catalog.dropTempView(name)
        assert listener.flush(60)
        return [(r.partition, r.lo, r.hi, r.n) for r in rows]

    def wait_stopped(c: httpx.Client) -> None:
        # QueryTerminated reaches the listener asynchronously, after awaitTermination returns.
        deadline = time.monotonic() + 60
        while c.get("/api/v1/pipelines", params={"lag": "false"}).json()["pipelines"][0]["state"] != "stopped":
            assert time.monotonic() < deadline, "the run never showed as stopped"
            time.sleep(0.5)

    root = str(tmp_path / "cp")
    try:
        with serving(pg_dsn, kafka.bootstrap_servers) as srv, httpx.Client(base_url=srv.url) as c:
            first = start_from_ledger("resume", [topic], bootstrap_servers=kafka.bootstrap_servers,
                                      checkpoint_root=root, dsn=pg_dsn)
            assert run_query(first) == [(0, 0, 49, 50), (1, 0, 49, 50)]
            assert c.get("/v1/getCurrentOffsets/", params={"pipelineName": "resume"}).json() == {
                topic: {"0": 50, "1": 50}}
            wait_stopped(c)

            r = c.post("/api/v1/pipelines/resume/resets", json={
                "mode": "offsets", "offsets": {topic: {"0": 10, "1": 35}}, "dryRun": False, "reason": "replay"})
            assert r.status_code == 200, r.text
            reset_id = r.json()["resetId"]
            assert [(p["beforeNextOffset"], p["targetNextOffset"], p["recordsReplayed"])
                    for p in r.json()["partitions"]] == [(50, 10, 40), (50, 35, 15)]

            plan = start_from_ledger("resume", [topic], bootstrap_servers=kafka.bootstrap_servers,
                                     checkpoint_root=root, dsn=pg_dsn)
            assert plan.fresh_checkpoint and plan.checkpoint_location != first.checkpoint_location
            assert plan.starting_offsets == {topic: {"0": 10, "1": 35}}
            assert any(f.kind == "reset_consumed" and f.details["reset_id"] == reset_id for f in plan.findings)
            assert c.get("/api/v1/pipelines/resume/resets").json()["resets"][0]["status"] == "consumed"

            # Spark really starts at the reset offsets, and the ledger records the replay.
            assert run_query(plan) == [(0, 10, 49, 40), (1, 35, 49, 15)]
            positions = c.get("/api/v1/pipelines/resume/offsets").json()["positions"]
            assert [(x["partition"], x["nextOffset"], x["placedBy"]) for x in positions] == [
                (0, 50, "batch"), (1, 50, "batch")]
    finally:
        spark.streams.removeListener(listener)
        listener.close(10)
