"""Safe by default: cross-site and rebinding refusals, token roles, audit identity, no 5xx from input.

The ledger is an embedded SQLite file, Kafka the in-memory stand-in of test_api_validation;
the same requests over real HTTP against Postgres and Kafka are in tests/integration/test_security.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from offset_ledger.api import create_app
from offset_ledger.api.guard import LEGACY_RESET_PATHS, changes_state, check_request, host_name
from offset_ledger.api.tokens import ApiToken, load_tokens, parse_tokens, weak_token_names
from offset_ledger.config import Settings
from offset_ledger.errors import ConfigError
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.tables import positions, resets
from offset_ledger.operate.inputs import audit_actor, encode_cursor
from offset_ledger.operate.operations import Operations
from tests.ops_seed import seed_pipeline
from tests.unit.api.test_api_validation import StandInKafka

OPERATE = ApiToken("ci-bot", "operate", b"operate-secret-0123456789")
READ = ApiToken("dashboard", "read", b"read-secret-0123456789ab")
SEEDED = {0: 500, 1: 600, 2: 700}
BODY = json.dumps({"orders": {"0": 20, "1": 30, "2": 40}}).encode()


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    eng = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    upgrade(eng)
    seed_pipeline(eng, "orders-etl", {"orders": {0: 500, 1: 600, 2: 700}})
    yield eng
    eng.dispose()


def _client(engine, tokens: list[ApiToken] | None = None, base: str = "http://localhost:9090") -> TestClient:  # type: ignore[no-untyped-def]
    ops = Operations(engine, kafka=StandInKafka())  # type: ignore[arg-type]
    app = create_app(operations=ops, tokens=tokens or [])
    client = TestClient(app, raise_server_exceptions=False, base_url=base)
    client.schema = app.openapi()  # type: ignore[attr-defined]
    return client


def _state(engine) -> tuple[int, dict[int, int]]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(resets)).scalar_one()
        return n, {r.partition: r.next_offset for r in conn.execute(select(positions))}


def _state_changing_operations(client: TestClient) -> list[tuple[str, str]]:
    """(method, path) of every route that may write, read from the app itself (new routes are covered)."""
    out = []
    for path, item in client.schema["paths"].items():  # type: ignore[attr-defined]
        for method in sorted(m.upper() for m in item):
            if changes_state(method, path):
                out.append((method, path.replace("{pipeline}", "orders-etl") + "?pipelineName=orders-etl"))
    return out


# Requests as a browser on another site builds them.
ATTACKS = {
    "img": ("GET", {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image",
                    "Referer": "https://evil.example/page"}, None),
    "form": ("POST", {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Origin": "https://evil.example",
                      "Content-Type": "application/x-www-form-urlencoded"}, BODY),
    "text-plain": ("POST", {"Content-Type": "text/plain"}, BODY),  # an old browser: no Origin, no Sec-Fetch
    "foreign-origin": ("POST", {"Origin": "http://localhost:3000", "Content-Type": "application/json"}, BODY),
    "same-site": ("POST", {"Sec-Fetch-Site": "same-site", "Content-Type": "application/json"}, BODY),
    "null-origin": ("POST", {"Origin": "null", "Content-Type": "application/json"}, BODY),
    "rebound-host": ("GET", {"Host": "attacker.example:9090"}, BODY),
}


@pytest.mark.parametrize("with_token", [False, True])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_cross_site_requests_to_every_state_changing_route_are_refused(engine, attack: str, with_token: bool) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine, [OPERATE] if with_token else None)
    operations = _state_changing_operations(client)
    # Three legacy resets on GET and POST, the resource reset, and the policy change (PUT).
    assert len(operations) == 8 and {p.split("?")[0] for _, p in operations} >= LEGACY_RESET_PATHS
    method, headers, body = ATTACKS[attack]
    auth = {"Authorization": f"Bearer {OPERATE.secret.decode()}"} if with_token else {}
    for route_method, path in operations:
        verb = route_method if attack == "rebound-host" or route_method == "PUT" else method
        if verb == "GET" and not path.startswith("/v1/"):
            continue  # the resource reset has no GET route
        content = body
        if path.startswith("/api/") and body is not None:
            content = json.dumps({"mode": "earliest", "dryRun": False, "reason": "evil"}).encode()
        r = client.request(verb, path, content=content, headers={**headers, **auth})
        assert r.status_code in (400, 403, 415), (attack, path, r.status_code, r.text)
        assert r.json()["error"] in ("CrossSiteRequest", "UnsupportedMediaType", "InvalidHost"), r.text
        assert _state(engine) == (0, SEEDED), (attack, path)


def test_the_seeds_curl_requests_and_the_console_still_work(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine, base="http://127.0.0.1:9090")
    curl = {"Accept": "*/*", "User-Agent": "curl/8.5.0"}
    assert client.get("/v1/getCurrentOffsets/?pipelineName=orders-etl", headers=curl).status_code == 200
    assert client.get("http://127.0.0.1:9090//v1/resetOffsetOfAllPartitionsToEarliest/?pipelineName=orders-etl",
                      headers=curl).json() == {
        "orders": {"0": 10, "1": 10, "2": 10}}
    assert client.post("/v1/resetOffsetOfAllPartitionsToLatest/?pipelineName=orders-etl", headers=curl).status_code == 200
    # GET with a JSON body, with and without -H 'Content-Type: application/json'.
    for ctype in ("application/json", "application/x-www-form-urlencoded"):
        r = client.request("GET", "/v1/resetOffsetOfPartitions/?pipelineName=orders-etl", content=BODY,
                           headers={**curl, "Content-Type": ctype})
        assert r.status_code == 200 and r.json() == {"orders": {"0": 20, "1": 30, "2": 40}}, r.text
    # The console: same-origin fetch with a JSON body.
    r = client.post("/api/v1/pipelines/orders-etl/resets", json={"mode": "earliest", "actor": "console"},
                    headers={"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:9090"})
    assert r.status_code == 200, r.text
    # A typed URL or bookmark (Sec-Fetch-Site: none) is the operator's own request.
    r = client.get("/v1/resetOffsetOfAllPartitionsToEarliest?pipelineName=orders-etl",
                   headers={"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"})
    assert r.status_code == 200
    assert _state(engine)[0] == 6  # four legacy resets, a dry run, a typed URL


def test_host_allowlist(engine, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    for base in ("http://localhost:9090", "http://127.0.0.1", "http://[::1]:9090"):
        assert _client(engine, base=base).get("/api/v1/pipelines").status_code == 200, base
    client = _client(engine, base="http://ledger.internal:9090")
    r = client.get("/api/v1/pipelines")
    assert r.status_code == 400 and "OFFSET_LEDGER_ALLOWED_HOSTS" in r.json()["message"]
    assert client.get("/healthz").status_code == 200  # probes use the pod address
    monkeypatch.setenv("OFFSET_LEDGER_ALLOWED_HOSTS", "ledger.internal, other.example")
    assert _client(engine, base="http://ledger.internal:9090").get("/api/v1/pipelines").status_code == 200
    assert host_name("[::1]:9090") == "::1" and host_name("Ledger.Internal.:80") == "ledger.internal"


def test_guard_rule_directly() -> None:
    hosts = frozenset({"localhost"})
    ok = check_request("POST", "/api/v1/pipelines/p/resets",
                       {"host": "localhost:9090", "origin": "http://localhost:9090", "content-type": "application/json"},
                       hosts)
    assert ok is None
    # Same host, other port: another origin (another local dev server).
    refused = check_request("POST", "/api/v1/pipelines/p/resets",
                            {"host": "localhost:9090", "origin": "http://localhost:8080",
                             "content-type": "application/json"}, hosts)
    assert refused is not None and refused.status == 403
    assert check_request("GET", "/api/v1/pipelines", {"host": "localhost", "sec-fetch-site": "cross-site"}, hosts) is None
    assert check_request("POST", "/x", {"host": "localhost", "content-length": "3"}, hosts).status == 415  # type: ignore[union-attr]


@pytest.mark.parametrize("origin,host,same", [
    ("http://localhost:9090", "localhost:9090", True), ("http://localhost:9091", "localhost:9090", False),
    ("http://127.0.0.1:9090/pipelines/x", "127.0.0.1:9090", True), ("http://[::1]:9090", "[::1]:9090", True),
    ("https://ledger.example.com", "ledger.example.com", True),  # behind a TLS proxy that keeps Host
    ("https://evil.example", "ledger.example.com", False), ("null", "localhost", False),
    ("http://localhost", "localhost:80", True), ("javascript:alert(1)", "localhost", False),
    ("http://localhost.evil.example:9090", "localhost:9090", False),
])
def test_same_origin(origin: str, host: str, same: bool) -> None:
    from offset_ledger.api.guard import same_origin

    assert same_origin(origin, host) is same


def test_read_token_sees_but_cannot_reset(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine, [OPERATE, READ])
    read = {"Authorization": f"Bearer {READ.secret.decode()}"}
    assert client.get("/v1/getCurrentOffsets?pipelineName=orders-etl", headers=read).status_code == 200
    assert client.get("/api/v1/pipelines/orders-etl/resets", headers=read).status_code == 200
    for method, path in _state_changing_operations(client):
        r = client.request(method, path, headers={**read, "Content-Type": "application/json"},
                           content=BODY if "Partitions" in path else json.dumps({"mode": "earliest"}).encode())
        assert r.status_code == 403 and r.json()["error"] == "Forbidden", (method, path, r.text)
        assert "dashboard" in r.json()["message"]
    assert _state(engine) == (0, SEEDED)


def test_operate_tokens_name_is_the_audit_actor(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine, [OPERATE, READ])
    auth = {"Authorization": f"Bearer {OPERATE.secret.decode()}"}
    r = client.post("/api/v1/pipelines/orders-etl/resets", headers=auth,
                    json={"mode": "earliest", "dryRun": False, "reason": "replay", "actor": "alice@admin"})
    assert r.status_code == 200, r.text
    r = client.get("/v1/resetOffsetOfAllPartitionsToLatest?pipelineName=orders-etl", headers={**auth, "X-Actor": "console"})
    assert r.status_code == 200
    r = client.get("/v1/resetOffsetOfAllPartitionsToEarliest?pipelineName=orders-etl", headers=auth)
    audit = client.get("/api/v1/pipelines/orders-etl/resets", headers=auth).json()["resets"]
    assert [a["actor"] for a in audit] == ["ci-bot", "ci-bot (console)", "ci-bot (alice@admin)"]
    assert audit_actor(None, None, "api") == "api" and audit_actor(None, "alice", "api") == "alice"
    assert len(audit_actor("n" * 64, "x" * 255, "api")) == 255


def test_executed_resets_need_a_reason(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine)
    for reason in (None, "", "   "):
        body = {"mode": "earliest", "dryRun": False, **({"reason": reason} if reason is not None else {})}
        r = client.post("/api/v1/pipelines/orders-etl/resets", json=body)
        assert r.status_code == 400 and "reason" in r.json()["message"], r.text
    assert _state(engine) == (0, SEEDED)
    # A dry run needs none; the legacy resets carry their endpoint's name as the reason.
    assert client.post("/api/v1/pipelines/orders-etl/resets", json={"mode": "earliest"}).status_code == 200
    client.get("/v1/resetOffsetOfAllPartitionsToLatest?pipelineName=orders-etl")
    audit = client.get("/api/v1/pipelines/orders-etl/resets").json()["resets"]
    assert audit[0]["reason"] == "legacy resetOffsetOfAllPartitionsToLatest"


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_lone_surrogate_in_a_legacy_body_is_400(engine, method: str) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine)
    r = client.request(method, "/v1/resetOffsetOfPartitions?pipelineName=orders-etl",
                       content=b'{"\\ud800": {"0": 1}}', headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "InvalidInput" or r.json()["error"].startswith("Unknown")
    r = client.get("/v1/getCurrentOffsets?pipelineName=%ED%A0%80")
    assert r.status_code in (400, 404)
    r = client.get("/api/v1/pipelines/%ED%A0%80/offsets")
    assert r.status_code == 400 and r.json()["error"] == "InvalidPath"
    assert _state(engine) == (0, SEEDED)


def test_numbers_beyond_bigint_are_400_not_500(engine) -> None:  # type: ignore[no-untyped-def]
    from datetime import datetime, timezone

    client = _client(engine)
    for row_id in (2**63, 2**64 + 5, -1):
        cursor = encode_cursor(datetime(2024, 1, 1, tzinfo=timezone.utc), row_id)
        r = client.get("/api/v1/pipelines/orders-etl/history", params={"cursor": cursor})
        assert r.status_code == 400 and r.json()["error"] == "InvalidInput", r.text
    r = client.get(f"/api/v1/pipelines/orders-etl/batches/{2**63}/range")
    assert r.status_code == 422, r.text
    r = client.get("/api/v1/pipelines/orders-etl/batches/1/range", params={"generation": 2**63})
    assert r.status_code == 422, r.text


def test_a_slash_in_a_pipeline_name_round_trips(engine) -> None:  # type: ignore[no-untyped-def]
    seed_pipeline(engine, "orders/eu", {"orders": {0: 50, 1: 50, 2: 50}})
    seed_pipeline(engine, "100%/x", {"orders": {0: 7, 1: 7, 2: 7}})
    client = _client(engine)
    listed = {p["pipeline"] for p in client.get("/api/v1/pipelines").json()["pipelines"]}
    assert {"orders/eu", "100%/x"} <= listed
    doc = client.get("/api/v1/pipelines/orders%2Feu/offsets").json()
    assert doc["pipeline"] == "orders/eu" and [p["nextOffset"] for p in doc["positions"]] == [50, 50, 50]
    assert client.get("/api/v1/pipelines/100%25%2Fx/lag").json()["pipeline"] == "100%/x"
    r = client.post("/api/v1/pipelines/orders%2Feu/resets", json={"mode": "earliest", "dryRun": False, "reason": "r"})
    assert r.status_code == 200 and r.json()["newPositions"] == {"orders": {"0": 10, "1": 10, "2": 10}}
    for sub in ("history", "resets", "runs", "findings"):
        assert client.get(f"/api/v1/pipelines/orders%2Feu/{sub}").status_code == 200, sub
    assert client.get("/api/v1/pipelines/orders/eu/offsets").status_code == 404  # a real slash is a path
    assert client.get("/v1/getCurrentOffsets", params={"pipelineName": "orders/eu"}).json() == {
        "orders": {"0": 10, "1": 10, "2": 10}}


def test_docs_are_served_without_a_cdn(engine) -> None:  # type: ignore[no-untyped-def]
    client = _client(engine, [OPERATE])
    page = client.get("/docs")
    assert page.status_code == 200 and "docs.js" in page.text  # the shell loads without a token
    assert "cdn" not in page.text.lower() and "default-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/redoc").status_code in (401, 404)
    assert client.get("/openapi.json").status_code == 401
    doc = client.get("/openapi.json", headers={"Authorization": f"Bearer {OPERATE.secret.decode()}"}).json()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert {"400", "401", "503"} <= set(op["responses"]), (method, path)


def test_token_sources_and_weakness(tmp_path: Path) -> None:
    tokens = parse_tokens("ci-bot:operate:abc # a comment\ndash:read:x:y:z, other:read:q", "test")
    assert [(t.name, t.role, t.secret) for t in tokens] == [
        ("ci-bot", "operate", b"abc"), ("dash", "read", b"x:y:z"), ("other", "read", b"q")]
    assert "secret" not in repr(tokens[0]) and "abc" not in repr(tokens[0])
    for bad in ("nameonly", "a:admin:x", "a b:read:x", "a:read:"):
        with pytest.raises(ConfigError):
            parse_tokens(bad, "test")
    file = tmp_path / "tokens"
    file.write_text("# name:role:secret\nfile-op:operate:" + "f" * 32 + "\n")
    s = Settings(api_token="change-me", api_tokens="r:read:" + "r" * 20, api_tokens_file=file)
    loaded = load_tokens(s)
    assert [(t.name, t.role) for t in loaded] == [("api-token", "operate"), ("r", "read"), ("file-op", "operate")]
    assert weak_token_names(loaded) == ["api-token"]
    assert weak_token_names([ApiToken("x", "read", b"Change-Me")]) == ["x"]
    with pytest.raises(ConfigError, match="duplicate"):
        load_tokens(Settings(api_tokens="a:read:" + "1" * 20 + ",a:operate:" + "2" * 20))
    with pytest.raises(ConfigError, match="share a secret"):
        load_tokens(Settings(api_tokens="a:read:" + "1" * 20 + ",b:operate:" + "1" * 20))


def _serve(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from offset_ledger.cli.main import main; main(sys.argv[1:])"
    base = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    return subprocess.run([sys.executable, "-c", code, "serve", *args], env={**base, **env},
                          capture_output=True, text=True, timeout=30)


def test_serve_refuses_weak_tokens_off_loopback(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'l.db'}"
    for env in ({"OFFSET_LEDGER_API_TOKEN": "change-me"}, {"OFFSET_LEDGER_API_TOKEN": "short-random"},
                {"OFFSET_LEDGER_API_TOKENS": "ops:operate:" + "k" * 40 + ",ro:read:tooshort"}):
        r = _serve({**env, "OFFSET_LEDGER_DSN": dsn}, "--host", "0.0.0.0", "--port", "1")
        assert r.returncode == 2, (env, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "weak API token" in lines[0] and "secrets.token_urlsafe" in lines[0], lines
        # --insecure does not lift it.
        assert _serve({**env, "OFFSET_LEDGER_DSN": dsn}, "--host", "0.0.0.0", "--insecure").returncode == 2


class OneBadTopicKafka(StandInKafka):
    """The cluster refuses any request that names the topic ``bad/topic`` (Kafka rejects the name)."""

    def watermarks(self, topics):  # type: ignore[no-untyped-def, override]
        from offset_ledger.errors import KafkaError

        if "bad/topic" in topics:
            raise KafkaError("InvalidTopicError: bad/topic")
        return super().watermarks(topics)


def test_one_bad_topic_degrades_only_its_own_row(engine) -> None:  # type: ignore[no-untyped-def]
    seed_pipeline(engine, "mixed", {"orders": {0: 900}, "bad/topic": {0: 5}})
    ops = Operations(engine, kafka=OneBadTopicKafka())  # type: ignore[arg-type]
    client = TestClient(create_app(operations=ops, tokens=[]), base_url="http://localhost")
    lags = {p["pipeline"]: p["lag"] for p in client.get("/api/v1/pipelines").json()["pipelines"]}
    assert lags == {"orders-etl": (1000 - 500) + (1000 - 600) + (1000 - 700), "mixed": 100}
    doc = client.get("/api/v1/pipelines/mixed/lag").json()
    rows = {(p["topic"], p["partition"]): p for p in doc["partitions"]}
    assert rows[("orders", 0)]["lag"] == 100 and rows[("bad/topic", 0)]["lag"] is None
    assert rows[("bad/topic", 0)]["nextOffset"] == 5 and doc["totalLag"] == 100


def test_cli_history_cursor_beyond_bigint_and_reset_without_reason_are_usage_errors(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from datetime import datetime, timezone

    dsn = str(engine.url)
    cursor = encode_cursor(datetime(2024, 1, 1, tzinfo=timezone.utc), 2**63)
    code = "import sys; from offset_ledger.cli.main import main; main(sys.argv[1:])"
    base = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    for args in (["history", "orders-etl", "--cursor", cursor, "--dsn", dsn],
                 ["reset", "orders-etl", "--to-earliest", "--execute", "--dsn", dsn, "--bootstrap-servers", "x:1"]):
        r = subprocess.run([sys.executable, "-c", code, *args], env=base, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert _state(engine) == (0, SEEDED)
