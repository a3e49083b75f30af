"""Request validation of the REST API: bad input gets a 4xx JSON answer and writes nothing.

The ledger is an embedded SQLite file; Kafka is an in-memory stand-in with fixed watermarks,
enough for the validation paths (the real-stack behaviour is in tests/integration/test_api.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from offset_ledger.api import create_app
from offset_ledger.kafka.snapshot import ClusterSnapshot
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.tables import positions, resets
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.model import TopicPartition, Watermarks
from tests.ops_seed import seed_pipeline

TOKEN = "s3cret-token"


class StandInKafka:
    """Fixed topics and watermarks (orders: 3 partitions)."""

    marks = {TopicPartition("orders", p): Watermarks(10, 1000) for p in range(3)}

    def partitions(self, topics: Sequence[str]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for tp in self.marks:
            if tp.topic in topics:
                out.setdefault(tp.topic, []).append(tp.partition)
        return out

    def watermarks(self, topics: Sequence[str]) -> dict[TopicPartition, Watermarks]:
        return {tp: m for tp, m in self.marks.items() if tp.topic in topics}

    def snapshot(self, topics: Sequence[str]) -> ClusterSnapshot:
        return ClusterSnapshot(self.partitions(topics), {}, self.watermarks(topics))

    def offsets_for_time(self, tps, timestamp_ms):  # type: ignore[no-untyped-def]
        return {tp: None for tp in tps}

    def close(self) -> None:
        pass


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    eng = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    upgrade(eng)
    seed_pipeline(eng, "orders-etl", {"orders": {0: 500, 1: 600, 2: 700}})
    yield eng
    eng.dispose()


def _client(engine, token: str | None = None, max_body_bytes: int = 1 << 20) -> TestClient:  # type: ignore[no-untyped-def]
    ops = Operations(engine, kafka=StandInKafka())  # type: ignore[arg-type]
    return TestClient(create_app(operations=ops, api_token=token or "", max_body_bytes=max_body_bytes),
                      raise_server_exceptions=False, base_url="http://localhost")


@pytest.fixture
def client(engine) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    yield _client(engine)


def _written(engine) -> tuple[int, dict[int, int]]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(resets)).scalar_one()
        pos = {r.partition: r.next_offset for r in conn.execute(select(positions))}
    return n, pos


SEEDED = {0: 500, 1: 600, 2: 700}
PARTS = "/v1/resetOffsetOfPartitions/?pipelineName=orders-etl"


def test_current_offsets_shape_and_path_variants(client: TestClient) -> None:
    want = {"orders": {"0": 500, "1": 600, "2": 700}}
    for path in ("/v1/getCurrentOffsets/?pipelineName=orders-etl", "http://localhost//v1/getCurrentOffsets/?pipelineName=orders-etl",
                 "/v1/getCurrentOffsets?pipelineName=orders-etl"):
        r = client.get(path, headers={"Accept": "application/json"})
        assert r.status_code == 200, r.text
        assert r.json() == want


@pytest.mark.parametrize("body", [
    b"{not json", b'{"orders": {"0": 1.5, "1": 2, "2": 3}}', b'{"orders": {"0": "12", "1": 2, "2": 3}}',
    b'{"orders": {"0": -5, "1": 2, "2": 3}}', b'{"orders": {"0": NaN, "1": 2, "2": 3}}',
    b'{"orders": {"0": true, "1": 2, "2": 3}}', b'{"orders": {"0": 20, "1": 20}}',
    b'{"orders": {"0": 20, "1": 20, "2": 20, "9": 20}}', b'{"orders": {"x": 20}}', b"[]", b"",
    b'{"orders": {"0": 5, "1": 20, "2": 20}}',  # below log-start 10: refused
    b'{"orders": {"0": 99999999999999999999999, "1": 2, "2": 3}}',
    b"\xff\xfe garbage",
])
def test_bad_legacy_bodies_are_400_and_write_nothing(engine, client: TestClient, body: bytes) -> None:  # type: ignore[no-untyped-def]
    r = client.post(PARTS, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"] and r.json()["message"]
    assert _written(engine) == (0, SEEDED)


def test_get_with_curl_form_content_type_executes_the_reset(engine, client: TestClient) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps({"orders": {"0": 20, "1": 30, "2": 40}})
    r = client.request("GET", PARTS, content=body,
                       headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "*/*",
                                "X-Actor": "alice"})
    assert r.status_code == 200, r.text
    assert r.json() == {"orders": {"0": 20, "1": 30, "2": 40}}
    assert _written(engine) == (1, {0: 20, 1: 30, 2: 40})
    audit = client.get("/api/v1/pipelines/orders-etl/resets").json()["resets"]
    assert audit[0]["actor"] == "alice" and audit[0]["status"] == "pending" and not audit[0]["dryRun"]
    assert [(p["beforeNextOffset"], p["afterNextOffset"]) for p in audit[0]["partitions"]] == [(500, 20), (600, 30), (700, 40)]


def test_unknown_pipeline_is_404_everywhere(client: TestClient) -> None:
    for method, path in [("GET", "/v1/getCurrentOffsets?pipelineName=nope"),
                         ("POST", "/v1/resetOffsetOfAllPartitionsToEarliest?pipelineName=nope"),
                         ("GET", "/api/v1/pipelines/nope/offsets"), ("GET", "/api/v1/pipelines/nope/history"),
                         ("GET", "/api/v1/pipelines/nope/resets")]:
        r = client.request(method, path)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["error"] == "UnknownPipeline"


def test_missing_parameters_and_unknown_routes(client: TestClient) -> None:
    r = client.get("/v1/getCurrentOffsets")
    assert r.status_code == 400 and r.json()["error"] == "RequestValidationError"
    r = client.get("/api/v1/pipelines/orders-etl/history?limit=0")
    assert r.status_code == 422
    r = client.get("/api/v1/pipelines/orders-etl/history?cursor=zzz")
    assert r.status_code == 400
    r = client.get("/api/v1/pipelines/orders-etl/history?since=yesterday")
    assert r.status_code == 400
    r = client.get("/v1/nothingHere")
    assert r.status_code == 404 and r.json()["error"] == "NotFound"
    r = client.get("/api/v1/topics/bad%20name")
    assert r.status_code == 422 and "topic" in r.json()["message"]  # the documented pattern refuses it
    r = client.get("/v1/getTopicDetails?topicName=missing")
    assert r.status_code == 404 and r.json()["error"] == "UnknownTopic"


@pytest.mark.parametrize("body,status", [
    ({"mode": "offsets", "offsets": {"orders": {"0": 1.5}}}, 422),
    ({"mode": "offsets", "offsets": {"orders": {"0": "12"}}}, 422),
    ({"mode": "offsets", "offsets": {"orders": {"0": -7}}}, 400),
    ({"mode": "offsets"}, 422),
    ({"mode": "sideways"}, 422),
    ({"mode": "shift", "shiftBy": "3"}, 422),
    ({"mode": "earliest", "dryRun": "no"}, 422),
    ({"mode": "earliest", "unknownField": 1}, 422),
    ({"mode": "earliest", "topics": [{"topic": "orders", "partitions": [7]}]}, 400),
    ({"mode": "earliest", "topics": [{"topic": "ghost"}]}, 404),
    ({"mode": "timestamp", "timestamp": "not a time"}, 400),
    ({"mode": "earliest", "actor": "a\nb"}, 400),
])
def test_bad_reset_bodies(engine, client: TestClient, body: dict, status: int) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/pipelines/orders-etl/resets", json=body)
    assert r.status_code == status, r.text
    assert "error" in r.json()
    assert _written(engine) == (0, SEEDED)


def test_malformed_json_on_resource_reset_is_400(engine, client: TestClient) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/pipelines/orders-etl/resets", content=b"{oops",
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "MalformedJSON"
    assert _written(engine) == (0, SEEDED)


def test_dry_run_is_the_default_and_is_audited(engine, client: TestClient) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/pipelines/orders-etl/resets", json={"mode": "earliest", "reason": "look first"})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["dryRun"] is True and doc["status"] == "dry_run"
    assert [(p["beforeNextOffset"], p["targetNextOffset"], p["recordsReplayed"]) for p in doc["partitions"]] == [
        (500, 10, 490), (600, 10, 590), (700, 10, 690)]
    assert _written(engine) == (1, SEEDED)


def test_oversized_body_is_413(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine, max_body_bytes=1000)
    r = client.post(PARTS, content=b"{" + b" " * 5000 + b"}", headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge"


def test_bearer_token(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine, token=TOKEN)
    assert client.get("/healthz").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": "Basic x"}):
        r = client.get("/v1/getCurrentOffsets?pipelineName=orders-etl", headers=headers)
        assert r.status_code == 401 and r.json()["error"] == "Unauthorized"
    for path in ("/metrics", "/openapi.json", "/api/v1/pipelines"):
        assert client.get(path).status_code == 401
    ok = client.get("/v1/getCurrentOffsets?pipelineName=orders-etl", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200


def test_database_unreachable_is_503() -> None:
    ops = Operations(make_engine("postgresql+psycopg2://nobody@127.0.0.1:1/none"), kafka=StandInKafka())  # type: ignore[arg-type]
    client = TestClient(create_app(operations=ops, api_token=""), raise_server_exceptions=False, base_url="http://localhost")
    for path in ("/v1/getCurrentOffsets?pipelineName=x", "/api/v1/pipelines", "/healthz", "/metrics"):
        r = client.get(path)
        assert r.status_code == 503, (path, r.text)
        assert r.json()["error"] == "LedgerUnavailable"


def test_openapi_and_docs_are_served(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert "/v1/resetOffsetOfPartitions" in doc["paths"] and "/api/v1/pipelines/{pipeline}/resets" in doc["paths"]
    assert client.get("/docs").status_code == 200


def test_metrics_text(client: TestClient) -> None:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'offset_ledger_lag_records{pipeline="orders-etl",consumer_group="orders-etl",topic="orders",partition="0"} 500' in r.text
    assert "offset_ledger_seconds_since_last_batch{" in r.text


def test_active_run_blocks_executed_resets_until_its_heartbeat_is_stale(engine) -> None:  # type: ignore[no-untyped-def]
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import update

    from offset_ledger.ledger.queries import RUN_STALENESS, active_run_ids
    from offset_ledger.ledger.tables import runs

    ids = seed_pipeline(engine, "live", {"orders": {0: 50, 1: 50, 2: 50}}, active=True)
    client = _client(engine)
    body = {"mode": "latest", "dryRun": False, "reason": "catch up"}
    r = client.post("/api/v1/pipelines/live/resets", json=body)
    assert r.status_code == 409 and r.json()["runIds"] == [ids["run_id"]]
    # A driver killed without QueryTerminated: no heartbeat for longer than the window.
    old = datetime.now(timezone.utc) - RUN_STALENESS - timedelta(minutes=1)
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == ids["run_id"]).values(last_heartbeat_at=old, beat_at=old))
        assert active_run_ids(conn, "live") == []
        assert active_run_ids(conn, "live", stale_after=None) == [ids["run_id"]]
    r = client.post("/api/v1/pipelines/live/resets", json=body)
    assert r.status_code == 200 and r.json()["status"] == "pending"
    listed = client.get("/api/v1/pipelines").json()["pipelines"][0]
    # Unterminated but silent: stale, not running, and the list says why.
    assert listed["state"] == "stale" and listed["activeRunIds"] == []
    assert listed["runs"][0]["state"] == "stale" and "driver heartbeat stopped" in listed["runs"][0]["why"]


def test_metrics_report_listener_health(engine, client: TestClient) -> None:  # type: ignore[no-untyped-def]
    from datetime import datetime, timezone

    from sqlalchemy import insert

    from offset_ledger.ledger.tables import listener_health

    with engine.begin() as conn:
        conn.execute(insert(listener_health).values(
            listener_id="l-1", pipeline="orders-etl", host="h", reported_at=datetime.now(timezone.utc),
            queued=3, written=120, retried=2, spilled=0, failed=1, last_error="db down"))
    text = client.get("/metrics").text
    assert 'offset_ledger_listener_written_total{listener_id="l-1",pipeline="orders-etl",consumer_group="orders-etl",host="h"} 120' in text
    assert 'offset_ledger_listener_healthy{listener_id="l-1",pipeline="orders-etl",consumer_group="orders-etl",host="h"} 0' in text



def test_arbitrary_json_bodies_never_break_the_reset_endpoints(engine) -> None:  # type: ignore[no-untyped-def]
    """Property: whatever JSON arrives, the answer is 200 or a 4xx JSON error, never a 5xx."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    client = _client(engine)
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                        st.text(max_size=8))
    keys = st.one_of(st.sampled_from(["orders", "0", "1", "2", "-1", "ghost", ""]), st.text(max_size=6))
    documents = st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)), max_leaves=12)
    legacy_like = st.dictionaries(st.sampled_from(["orders", "ghost"]), st.dictionaries(
        st.sampled_from(["0", "1", "2", "3", "x"]), st.one_of(st.integers(-5, 2000), scalars), max_size=4),
        max_size=2)

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=st.one_of(documents, legacy_like), method=st.sampled_from(["GET", "POST"]))
    def check(body: object, method: str) -> None:
        r = client.request(method, PARTS, content=json.dumps(body).encode(),
                           headers={"Content-Type": "application/json"})
        assert r.status_code in (200, 400, 404, 409), (body, r.status_code, r.text)
        assert isinstance(r.json(), dict)
        r = client.post("/api/v1/pipelines/orders-etl/resets", content=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json"})
        assert r.status_code in (200, 400, 404, 422), (body, r.status_code, r.text)

    check()


def test_unscoped_reset_leaves_out_topics_deleted_since(engine, client: TestClient) -> None:  # type: ignore[no-untyped-def]
    seed_pipeline(engine, "two", {"orders": {0: 50, 1: 50, 2: 50}, "gone": {0: 9}})
    r = client.post("/v1/resetOffsetOfAllPartitionsToEarliest?pipelineName=two")
    assert r.status_code == 200, r.text
    assert r.json() == {"orders": {"0": 10, "1": 10, "2": 10}}
    r = client.post("/api/v1/pipelines/two/resets", json={"mode": "earliest", "topics": [{"topic": "gone"}]})
    assert r.status_code == 404 and r.json()["error"] == "UnknownTopic"


def test_a_partition_the_topic_does_not_have_is_named_with_the_ones_it_has(engine, client: TestClient) -> None:  # type: ignore[no-untyped-def]
    for method, path, body in (
            ("POST", "/api/v1/pipelines/orders-etl/resets",
             {"mode": "earliest", "topics": [{"topic": "orders", "partitions": [0, 7]}]}),
            ("POST", "/api/v1/pipelines/orders-etl/resets", {"mode": "offsets", "offsets": {"orders": {"7": 5}}}),
            ("POST", PARTS, {"orders": {"7": 5}})):
        r = client.request(method, path, json=body)
        assert r.status_code == 400, r.text
        doc = r.json()
        assert doc["error"] == "UnknownPartition" and doc["message"] == (
            "unknown partition 7 of topic 'orders' (partitions: 0, 1, 2)"), doc
    assert _written(engine) == (0, SEEDED)
