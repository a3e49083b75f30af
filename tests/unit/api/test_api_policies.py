"""Stored policies in the REST API: show, change (operate token, audited with its name), history.

The ledger is an embedded SQLite file (the real-stack round trip is in tests/integration/test_api.py).
Bad input gets a 4xx JSON answer naming the field and writes nothing, as ``offset-ledger policy set``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from offset_ledger.api import create_app
from offset_ledger.operate.policy_view import API_NAMES
from offset_ledger.api.tokens import ApiToken
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.policy_store import current_policies
from offset_ledger.ledger.tables import pipeline_policies
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.policies import POLICY_KEYS
from tests.ops_seed import seed_pipeline
from tests.unit.api.test_api_validation import StandInKafka

OPERATE = ApiToken("ci-bot", "operate", b"operate-secret-0123456789")
READ = ApiToken("dashboard", "read", b"read-secret-0123456789ab")
URL = "/api/v1/pipelines/orders-etl/policies"


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    eng = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    upgrade(eng)
    seed_pipeline(eng, "orders-etl", {"orders": {0: 500, 1: 600, 2: 700}})
    yield eng
    eng.dispose()


def _client(engine, tokens: list[ApiToken] | None = None) -> TestClient:  # type: ignore[no-untyped-def]
    ops = Operations(engine, kafka=StandInKafka())  # type: ignore[arg-type]
    return TestClient(create_app(operations=ops, tokens=tokens or []), raise_server_exceptions=False,
                      base_url="http://localhost")


def _auth(token: ApiToken) -> dict[str, str]:
    return {"Authorization": f"Bearer {token.secret.decode()}"}


def _changes(engine) -> int:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(pipeline_policies)).scalar_one()


def test_names_are_the_camel_case_of_the_policy_keys() -> None:
    assert list(API_NAMES) == list(POLICY_KEYS)
    assert list(API_NAMES.values()) == ["firstRun", "onDataLoss", "window", "slide", "watermarkDelay",
                                        "eventTimeIsKafkaTimestamp", "commitToKafka"]


def test_show_set_and_history_round_trip_audited_with_the_token_name(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine, [OPERATE, READ])
    empty = client.get(URL, headers=_auth(READ))
    assert empty.status_code == 200, empty.text
    assert empty.json() == {
        "pipeline": "orders-etl", "policies": {}, "lastChange": None,
        "effective": {"firstRun": None, "onDataLoss": "fail", "window": None, "slide": None, "watermarkDelay": None,
                      "eventTimeIsKafkaTimestamp": False, "commitToKafka": False},
        "sources": {k: "default" for k in API_NAMES.values()},
    }
    first = client.put(URL, headers=_auth(OPERATE), json={
        "policies": {"onDataLoss": "earliest", "window": "10 minutes", "watermarkDelay": "2 minutes"},
        "reason": "windowed since v2", "actor": "alice"})
    assert first.status_code == 200, first.text
    doc = first.json()
    assert doc["policies"] == {"onDataLoss": "earliest", "window": "10 minutes", "watermarkDelay": "2 minutes"}
    assert doc["effective"]["onDataLoss"] == "earliest" and doc["sources"]["window"] == "stored"
    assert doc["sources"]["firstRun"] == "default"
    last = doc["lastChange"]
    assert (last["actor"], last["reason"]) == ("ci-bot (alice)", "windowed since v2")
    assert last["createdAt"].endswith("+00:00") and last["policies"] == doc["policies"]

    # null removes one; the others stay (the same semantics as `offset-ledger policy set --unset`).
    second = client.put(URL, headers=_auth(OPERATE), json={
        "policies": {"watermarkDelay": None, "firstRun": "latest", "commitToKafka": True}, "reason": "no backfill"})
    assert second.status_code == 200, second.text
    assert second.json()["policies"] == {"firstRun": "latest", "onDataLoss": "earliest", "window": "10 minutes",
                                         "commitToKafka": True}
    assert second.json()["lastChange"]["actor"] == "ci-bot"
    with engine.connect() as conn:  # what a restart reads
        assert current_policies(conn, "orders-etl") == {"first_run": "latest", "on_data_loss": "earliest",
                                                        "window": "10 minutes", "commit_to_kafka": True}
    shown = client.get(URL, headers=_auth(READ)).json()
    assert {**shown, "dryRun": False, "before": first.json()["policies"]} == second.json()

    history = client.get(URL + "/history", headers=_auth(READ))
    assert history.status_code == 200
    changes = history.json()["changes"]
    assert [c["reason"] for c in changes] == ["no backfill", "windowed since v2"]  # newest first
    assert changes[1]["policies"]["watermarkDelay"] == "2 minutes" and "watermarkDelay" not in changes[0]["policies"]
    assert changes[0]["id"] > changes[1]["id"]


def test_writes_need_an_operate_token_and_reads_need_a_token(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine, [OPERATE, READ])
    body = {"policies": {"onDataLoss": "earliest"}, "reason": "x"}
    refused = client.put(URL, headers=_auth(READ), json=body)
    assert refused.status_code == 403 and refused.json()["error"] == "Forbidden"
    assert client.put(URL, json=body).status_code == 401
    assert client.get(URL).status_code == 401
    assert client.get(URL + "/history").status_code == 401
    cross = client.put(URL, headers={**_auth(OPERATE), "Origin": "https://evil.example"}, json=body)
    assert cross.status_code == 403 and cross.json()["error"] == "CrossSiteRequest"
    assert _changes(engine) == 0


BAD: list[tuple[dict[str, Any], int, str]] = [
    ({"policies": {}, "reason": "r"}, 400, "nothing to set"),
    ({"policies": {"onDataLoss": "skip"}, "reason": "r"}, 400, "policies.onDataLoss: on_data_loss must be one of"),
    ({"policies": {"on_data_loss": "earliest"}, "reason": "r"}, 400, "unknown policy 'on_data_loss'"),
    ({"policies": {"window": "ten minutes"}, "reason": "r"}, 400, "policies.window"),
    ({"policies": {"firstRun": "yesterday"}, "reason": "r"}, 400, "policies.firstRun: first_run must be"),
    ({"policies": {"commitToKafka": "yes"}, "reason": "r"}, 400, "policies.commitToKafka"),
    ({"policies": {"slide": "5 minutes"}, "reason": "r"}, 400, "policies.slide: a slide policy needs a window"),
    ({"policies": {"onDataLoss": "earliest"}, "reason": "  "}, 400, "needs a reason"),
    ({"policies": {"onDataLoss": "earliest"}}, 400, "needs a reason"),
    ({"policies": {"onDataLoss": "earliest"}, "reason": 7}, 422, "reason"),
    ({"policies": {"onDataLoss": "earliest"}, "reason": "r", "dryRun": "yes"}, 422, "dryRun"),
    ({"policies": {"onDataLoss": "earliest"}, "reason": "r", "force": True}, 422, "force"),
    ({"policies": {"slide": "5 minutes"}, "reason": "r", "dryRun": True}, 400, "needs a window"),
    ({"policies": ["onDataLoss"], "reason": "r"}, 422, "policies"),
]


@pytest.mark.parametrize(("body", "status", "message"), BAD)
def test_bad_input_is_a_specific_4xx_and_writes_nothing(engine, body, status, message) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine)
    answer = client.put(URL, json=body)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["message"]
    assert _changes(engine) == 0


def test_malformed_json_is_a_400_and_writes_nothing(engine) -> None:  # type: ignore[no-untyped-def]
    answer = _client(engine).put(URL, content=b'{"policies": {', headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and answer.json()["error"] == "MalformedJSON"
    assert _changes(engine) == 0


def test_policies_can_be_decided_before_the_first_run_and_names_with_a_slash_work(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine)
    url = "/api/v1/pipelines/orders%2Feu/policies"
    body = {"policies": {"firstRun": "2024-05-01T12:00:00+00:00"}, "reason": "start in May"}
    unknown = client.put(url, json=body)  # a typo would store policies nobody reads: 404 naming what exists
    assert unknown.status_code == 404 and "unknown pipeline 'orders/eu'" in unknown.json()["message"], unknown.text
    assert "orders-etl" in unknown.json()["message"] and _changes(engine) == 0
    assert client.get(url).status_code == 404 and client.get(url + "/history").status_code == 404
    done = client.put(url, json={**body, "newPipeline": True})
    assert done.status_code == 200, done.text
    assert done.json()["pipeline"] == "orders/eu" and done.json()["policies"]["firstRun"] == "2024-05-01T12:00:00+00:00"
    assert client.get(url + "/history").json()["changes"][0]["actor"] == "api"
    assert client.get("/api/v1/pipelines/orders-etl/policies").json()["policies"] == {}


def test_the_openapi_document_describes_the_policy_endpoints(engine) -> None:  # type: ignore[no-untyped-def]
    schema = _client(engine).get("/openapi.json").json()
    ops = schema["paths"]["/api/v1/pipelines/{pipeline}/policies"]
    assert set(ops) == {"get", "put"} and "/api/v1/pipelines/{pipeline}/policies/history" in schema["paths"]
    assert "PolicyChangeBody" in schema["components"]["schemas"]


@pytest.mark.parametrize("body", [
    {"policies": {"window": 600}, "reason": "r"},
    {"policies": {"firstRun": {"orders\u0000": {"0": 1}}}, "reason": "r"},
    {"policies": {"onDataLoss": "earliest"}, "reason": "why\u0000"},
    {"policies": {"firstRun": {"orders": {"0": 1.5}}}, "reason": "r"},
    {"policies": {"firstRun": True}, "reason": "r"},
    {"policies": {"slide": {"a": 1}}, "reason": "r"},
])
def test_odd_values_are_refused_not_stored(engine, body) -> None:  # type: ignore[no-untyped-def]
    answer = _client(engine).put(URL, json=body)
    assert answer.status_code == 400, answer.text
    assert _changes(engine) == 0


def test_explicit_first_run_offsets_are_stored_as_given(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine)
    done = client.put(URL, json={"policies": {"firstRun": {"orders": {"0": 12, "1": -2}}}, "reason": "r"})
    assert done.status_code == 200, done.text
    assert done.json()["policies"]["firstRun"] == {"orders": {"0": 12, "1": -2}}


def test_a_dry_run_answers_the_policies_after_the_change_and_writes_nothing(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine)
    client.put(URL, json={"policies": {"onDataLoss": "earliest"}, "reason": "first"})
    dry = client.put(URL, json={"policies": {"onDataLoss": None, "window": "5 minutes"}, "dryRun": True})
    assert dry.status_code == 200, dry.text
    doc = dry.json()
    assert doc["dryRun"] is True and doc["before"] == {"onDataLoss": "earliest"}
    assert doc["policies"] == {"window": "5 minutes"} and doc["effective"]["onDataLoss"] == "fail"
    assert doc["lastChange"]["reason"] == "first"  # the stored state did not move
    assert _changes(engine) == 1
    assert client.get(URL).json()["policies"] == {"onDataLoss": "earliest"}
