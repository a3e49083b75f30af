"""Scoped API tokens (issue 39): outside its scope a pipeline does not exist for a token.

The ledger is an embedded SQLite file with two teams' pipelines, Kafka a stand-in with both topics.
The oracle walks the app's own route table, so a route added later is covered without editing
this file: with team A's token, team B's pipeline answers exactly what an unknown name answers,
and nothing of B (its name, topic, consumer group) appears in any answer.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select
from starlette.routing import Mount

from offset_ledger.api import create_app
from offset_ledger.api.tokens import ApiToken, parse_tokens
from offset_ledger.errors import ConfigError, InvalidInput
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.tables import findings, listener_health, pipeline_policies, positions, resets
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.model import TopicPartition, Watermarks
from offset_ledger.rules.scope import EVERYTHING, like_prefix, parse_scope
from tests.ops_seed import seed_pipeline
from tests.unit.api.test_api_validation import StandInKafka

A, A_TOPIC, A_GROUP = "team-a-orders", "orders-a", "team-a-orders"
B, B_TOPIC, B_GROUP = "team-b-payments", "payments-b", "payments-group-b"
UNKNOWN = "team-c-nothing"  # a name the ledger does not know at all
SECRET_A = "team-a-secret-0123456789"
TOKENS = parse_tokens(f"a-bot:operate[team-a-*]:{SECRET_A}, b-bot:read[{B}]:team-b-secret-0123456789,"
                      "admin:operate:admin-secret-0123456789", "test")
A_AUTH = {"Authorization": f"Bearer {SECRET_A}"}


class TwoTopics(StandInKafka):
    marks = {TopicPartition(t, p): Watermarks(10, 1000) for t in (A_TOPIC, B_TOPIC) for p in range(2)}


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    eng = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    upgrade(eng)
    seed_pipeline(eng, A, {A_TOPIC: {0: 500, 1: 600}}, consumer_group=A_GROUP)
    seed_pipeline(eng, B, {B_TOPIC: {0: 700, 1: 800}}, consumer_group=B_GROUP)
    now = datetime.now(timezone.utc)
    with eng.begin() as conn:
        for pipeline, group, topic in ((A, A_GROUP, A_TOPIC), (B, B_GROUP, B_TOPIC)):
            conn.execute(insert(findings).values(
                pipeline=pipeline, consumer_group=group, kind="gap", topic=topic, partition=0,
                message=f"gap on {topic}", created_at=now))
            conn.execute(insert(resets).values(
                pipeline=pipeline, consumer_group=group, mode="earliest", actor="ops", dry_run=True,
                forced=False, created_at=now, status="dry_run"))
            conn.execute(insert(listener_health).values(
                listener_id=f"l-{pipeline}", pipeline=pipeline, host="h", reported_at=now))
            conn.execute(insert(pipeline_policies).values(
                pipeline=pipeline, policies={"first_run": "earliest"}, actor="ops", created_at=now))
    yield eng
    eng.dispose()


def _client(engine) -> TestClient:  # type: ignore[no-untyped-def]
    ops = Operations(engine, kafka=TwoTopics())  # type: ignore[arg-type]
    return TestClient(create_app(operations=ops, tokens=TOKENS), raise_server_exceptions=False,
                      base_url="http://localhost")


def _b_rows(engine) -> tuple[Any, ...]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return (sorted(tuple(r) for r in conn.execute(select(positions).where(positions.c.pipeline == B))),
                conn.execute(select(func.count()).select_from(resets).where(resets.c.pipeline == B)).scalar_one(),
                conn.execute(select(func.count()).select_from(pipeline_policies)
                             .where(pipeline_policies.c.pipeline == B)).scalar_one())


_BODIES = {
    "/v1/resetOffsetOfPartitions": {A_TOPIC: {"0": 20, "1": 30}},
    "/api/v1/pipelines/{pipeline}/resets": {"mode": "earliest", "dryRun": True},
    "/api/v1/pipelines/{pipeline}/policies": {"policies": {"firstRun": "latest"}, "reason": "scope test"},
}


def _requests(app: Any, pipeline: str) -> list[tuple[str, str, str, Any]]:
    """(method, route path, url, JSON body) for every route of the app, naming ``pipeline`` wherever one is named."""
    out = []
    for route in iter_route_contexts(app.routes):
        if isinstance(route.original_route, Mount):
            continue  # static files: no ledger data
        assert route.path, route
        clean = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        url = clean.replace("{pipeline}", pipeline).replace("{topic}", A_TOPIC).replace("{batch}", "0")
        if clean.startswith("/v1/"):  # the legacy endpoints name theirs in the query
            url += f"?topicName={A_TOPIC}" if "Topic" in clean else f"?pipelineName={pipeline}"
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            if method == "HEAD":
                continue
            out.append((method, clean, url, _BODIES.get(clean)))
    return out


def test_every_route_hides_the_other_teams_pipeline(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine)
    app = client.app
    before = _b_rows(engine)
    by_pipeline = {n: _requests(app, n) for n in (A, B, UNKNOWN)}
    assert len(by_pipeline[B]) >= 25  # the legacy, resource, console, policy, verify and service routes
    named = 0
    for (method, path, url_b, body), (_, _, url_c, _) in zip(by_pipeline[B], by_pipeline[UNKNOWN]):
        r_b = client.request(method, url_b, json=body, headers=A_AUTH)
        if "{pipeline}" in path or path.startswith("/v1/") and "Topic" not in path:
            named += 1
            # B named by A's token: exactly the answer an unknown name gets (with that name in it).
            r_c = client.request(method, url_c, json=body, headers=A_AUTH)
            assert (r_b.status_code, r_b.text.replace(B, UNKNOWN)) == (r_c.status_code, r_c.text), (method, path)
            if path.startswith(("/api/", "/v1/")):
                assert r_b.status_code == 404 and r_b.json()["error"] == "UnknownPipeline", (method, path, r_b.text)
            text = r_b.text.replace(B, "")
        else:
            text = r_b.text
        for secret in (B, B_TOPIC, B_GROUP, "l-team-b"):
            assert secret not in text, (method, path, secret, text[:500])
    assert named >= 16
    for method, path, url, body in by_pipeline[A]:
        r = client.request(method, url, json=body, headers=A_AUTH)
        assert r.status_code < 500, (method, path, r.text)
        for secret in (B, B_TOPIC, B_GROUP, "l-team-b"):
            assert secret not in r.text, (method, path, secret, r.text[:500])
    assert _b_rows(engine) == before  # nothing of B was written through A's token


def test_lists_metrics_and_errors_show_only_the_scope(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine)
    body = client.get("/api/v1/pipelines", headers=A_AUTH).json()
    assert [(p["pipeline"], p["findings"]) for p in body["pipelines"]] == [(A, 1)]
    console = client.get("/api/v1/console/pipelines", headers=A_AUTH).json()["pipelines"]
    assert [(p["pipeline"], p["groupCount"]) for p in console] == [(A, 1)]
    metrics = client.get("/metrics", headers=A_AUTH).text
    assert f'pipeline="{A}"' in metrics and "l-team-a-orders" in metrics and B not in metrics
    # The unknown-name refusal lists only what the token may see.
    r = client.get(f"/v1/getCurrentOffsets?pipelineName={UNKNOWN}", headers=A_AUTH)
    assert r.status_code == 404 and r.json()["known"] == [A], r.text
    assert client.get(f"/api/v1/pipelines/{A}/offsets", headers=A_AUTH).status_code == 200
    # The other team's read token sees B and only B; the unscoped admin sees both.
    b_auth = {"Authorization": "Bearer team-b-secret-0123456789"}
    assert [p["pipeline"] for p in client.get("/api/v1/pipelines", headers=b_auth).json()["pipelines"]] == [B]
    assert client.get(f"/api/v1/pipelines/{A}/history", headers=b_auth).status_code == 404
    admin = {"Authorization": "Bearer admin-secret-0123456789"}
    assert {p["pipeline"] for p in client.get("/api/v1/pipelines", headers=admin).json()["pipelines"]} == {A, B}
    assert B in client.get("/metrics", headers=admin).text


def test_a_scoped_reset_is_audited_with_the_tokens_name(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine)
    r = client.post(f"/api/v1/pipelines/{A}/resets", json={"mode": "earliest", "dryRun": False, "reason": "replay",
                                                           "actor": "alice"}, headers=A_AUTH)
    assert r.status_code == 200, r.text
    with engine.connect() as conn:
        actors = [row.actor for row in conn.execute(select(resets).where(resets.c.pipeline == A, ~resets.c.dry_run))]
    assert actors == ["a-bot (alice)"]
    r = client.post(f"/api/v1/pipelines/{B}/policies", json={"policies": {"firstRun": "latest"}, "reason": "x",
                                                             "newPipeline": True}, headers=A_AUTH)
    assert r.status_code in (404, 405)
    # A pipeline not run yet, outside the scope: a policy for it is refused as unknown, not stored.
    r = client.put("/api/v1/pipelines/team-b-new/policies", headers=A_AUTH,
                   json={"policies": {"firstRun": "latest"}, "reason": "x", "newPipeline": True})
    assert r.status_code == 404 and r.json()["error"] == "UnknownPipeline", r.text
    r = client.put("/api/v1/pipelines/team-a-new/policies", headers=A_AUTH,
                   json={"policies": {"firstRun": "latest"}, "reason": "x", "newPipeline": True})
    assert r.status_code == 200, r.text


def test_scope_syntax() -> None:
    scope = parse_scope("orders|team-a-*| team-a-x-* |team-a-y")
    assert scope.patterns == ("orders", "team-a-*")  # a prefix covers the names and prefixes it starts
    assert [scope.allows(n) for n in ("orders", "orders2", "team-a-", "team-a-x", "team-b", None)] == [
        True, False, True, True, False, False]
    assert parse_scope("x|*") is EVERYTHING and EVERYTHING.allows(None)
    for bad in ("", "|", "a|", "te*am", "a**", "x\x01"):
        with pytest.raises(InvalidInput):
            parse_scope(bad)
    assert like_prefix("a_b%c\\") == "a\\_b\\%c\\\\%"
    token = parse_tokens("t:read[orders:eu|team-a-*]:s3cret:with:colons", "env")[0]
    assert (token.scope.patterns, token.secret) == (("orders:eu", "team-a-*"), b"s3cret:with:colons")
    assert "scope='orders:eu|team-a-*'" in repr(token) and "s3cret" not in repr(token)
    assert parse_tokens("t:operate:plain", "env")[0].scope is EVERYTHING
    for bad in ("t:read[]:secret", "t:read[a*b]:secret", "t:admin[x]:secret"):
        with pytest.raises(ConfigError, match="token 't'"):
            parse_tokens(bad, "env")
    assert ApiToken("n", "read").scope is EVERYTHING
    assert json.loads(json.dumps(list(scope.patterns))) == ["orders", "team-a-*"]
