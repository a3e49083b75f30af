"""The console's pages, static files and JSON reads without a browser (embedded SQLite, stand-in Kafka).

The browser itself is driven in tests/integration/test_console.py against the real stack.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select, update

from offset_ledger.api import create_app
from offset_ledger.ledger.engine import head_revision
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.tables import checkpoint_generations, findings, runs
from offset_ledger.operate.operations import Operations
from tests.ops_seed import seed_pipeline
from tests.unit.api.test_api_validation import StandInKafka

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10 has no tomllib; the package-data test needs it only there
    tomllib = None

TOKEN = "console-unit-token"
ROOT = Path(__file__).resolve().parents[3]
CONSOLE = ROOT / "offset_ledger" / "console"


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    eng = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    upgrade(eng)
    yield eng
    eng.dispose()


def _client(engine, token: str = "") -> TestClient:  # type: ignore[no-untyped-def]
    ops = Operations(engine, kafka=StandInKafka())  # type: ignore[arg-type]
    return TestClient(create_app(operations=ops, api_token=token), raise_server_exceptions=False, base_url="http://localhost")


def test_pages_and_static_files_load_without_a_token_but_the_data_does_not(engine) -> None:  # type: ignore[no-untyped-def]
    seed_pipeline(engine, "orders", {"orders": {0: 48213}})
    c = _client(engine, TOKEN)
    for path in ("/", "/pipelines/orders", "/pipelines/orders?group=orders"):
        r = c.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), path
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert "48213" not in r.text and "48,213" not in r.text, "ledger data in the HTML shell"
    for path in ("/console/static/console.js", "/console/static/pipeline.js", "/console/static/console.css",
                 "/console/static/vendor/uplot/uPlot.iife.min.js", "/console/static/vendor/uplot/LICENSE"):
        assert c.get(path).status_code == 200, path
    for path in ("/api/v1/console/pipelines", "/api/v1/pipelines/orders/runs", "/api/v1/pipelines/orders/findings",
                 "/api/v1/pipelines/orders/offsets", "/v1/getCurrentOffsets?pipelineName=orders", "/metrics"):
        r = c.get(path)
        assert r.status_code == 401 and r.json()["error"] == "Unauthorized", path
    r = c.post("/api/v1/pipelines/orders/resets", json={"mode": "earliest", "dryRun": False, "reason": "x"})
    assert r.status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert c.get("/api/v1/console/pipelines", headers=auth).json()["pipelines"][0]["pipeline"] == "orders"


def test_legacy_paths_still_reach_the_api_not_the_console(engine) -> None:  # type: ignore[no-untyped-def]
    seed_pipeline(engine, "orders", {"orders": {0: 500}})
    c = _client(engine)
    assert c.get("http://localhost//v1/getCurrentOffsets/?pipelineName=orders").json() == {"orders": {"0": 500}}
    # A trailing slash on the API is the API's, not the console's /pipelines/... page.
    assert c.get("/api/v1/pipelines/").json()["pipelines"][0]["pipeline"] == "orders"
    r = c.get("/console/static/no-such-file.js")
    assert r.status_code == 404 and r.json()["error"] == "NotFound"
    assert c.get("/healthz").json() == {"status": "ok", "ledger": {"reachable": True, "schema": head_revision()}}
    assert c.get("/livez").json() == {"status": "alive"}


def test_pipeline_names_are_escaped_in_the_page(engine) -> None:  # type: ignore[no-untyped-def]
    c = _client(engine)
    r = c.get('/pipelines/%3Cscript%3Ealert(1)%3C%2Fscript%3E"x')
    assert r.status_code == 200
    assert "<script>alert(1)</script>" not in r.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text


def test_console_reads_state_findings_generation_and_runs(engine) -> None:  # type: ignore[no-untyped-def]
    ids = seed_pipeline(engine, "orders", {"orders": {0: 500, 1: 600}})
    crashed = seed_pipeline(engine, "crashed", {"orders": {0: 5}}, active=True)
    seed_pipeline(engine, "live", {"orders": {0: 7}}, active=True)
    now = datetime.now(timezone.utc)
    with engine.begin() as conn:
        # A driver killed an hour ago: never terminated, silent since.
        conn.execute(update(runs).where(runs.c.run_id == crashed["run_id"]).values(
            started_at=now - timedelta(hours=2), last_heartbeat_at=now - timedelta(hours=1),
            beat_at=now - timedelta(hours=1)))
        conn.execute(update(runs).where(runs.c.run_id == ids["run_id"]).values(
            app_version="2.0", checkpoint_location="file:/ck/orders/gen-2-abc"))
        conn.execute(insert(checkpoint_generations), [
            {"pipeline": "orders", "consumer_group": "orders", "generation": g, "checkpoint_root": "/ck/orders",
             "location": f"/ck/orders/gen-{g}-{'abc' if g == 2 else 'old'}", "app_version": f"{g}.0",
             "reason": "first" if g == 1 else "app_version", "created_at": now - timedelta(minutes=10 - g)}
            for g in (1, 2)])
        # What the recorder writes when the run starts on generation 2's checkpoint.
        gen2 = conn.execute(select(checkpoint_generations.c.id).where(checkpoint_generations.c.generation == 2)).scalar()
        conn.execute(update(runs).where(runs.c.run_id == ids["run_id"]).values(generation_id=gen2))
        conn.execute(insert(findings), [
            {"pipeline": "orders", "consumer_group": "orders", "kind": "gap", "topic": "orders", "partition": 0,
             "message": f"gap {i}", "created_at": now} for i in range(2)])
    c = _client(engine)
    rows = {p["pipeline"]: p for p in c.get("/api/v1/console/pipelines").json()["pipelines"]}
    assert {k: v["state"] for k, v in rows.items()} == {"orders": "stopped", "crashed": "stale", "live": "running"}
    assert rows["crashed"]["staleRunIds"] == [crashed["run_id"]]
    assert (rows["orders"]["findings"], rows["orders"]["generation"]["generation"], rows["orders"]["appVersion"]) == (
        2, 2, "2.0")
    assert rows["orders"]["lag"] == (1000 - 500) + (1000 - 600)  # stand-in log-end 1000
    assert (rows["live"]["findings"], rows["live"]["generation"], rows["live"]["appVersion"]) == (0, None, None)

    detail = c.get("/api/v1/pipelines/orders/runs").json()
    assert [g["generation"] for g in detail["generations"]] == [2, 1]
    assert [(r["runId"], r["generation"], r["foreign"]) for r in detail["runs"]] == [(ids["run_id"], 2, False)]
    found = c.get("/api/v1/pipelines/orders/findings?limit=1").json()["findings"]
    assert len(found) == 1 and found[0]["kind"] == "gap"


@pytest.mark.parametrize("path", [
    "/api/v1/pipelines/nope/runs", "/api/v1/pipelines/nope/findings",
    "/api/v1/pipelines/orders/runs?consumerGroup=other", "/api/v1/pipelines/orders/findings?limit=0",
    "/api/v1/pipelines/orders/findings?limit=abc", "/api/v1/pipelines/orders/runs?consumerGroup=",
])
def test_bad_console_reads_are_4xx_json(engine, path: str) -> None:  # type: ignore[no-untyped-def]
    seed_pipeline(engine, "orders", {"orders": {0: 1}})
    r = _client(engine).get(path)
    assert 400 <= r.status_code < 500 and "message" in r.json(), (path, r.status_code, r.text)


@pytest.mark.skipif(tomllib is None and not os.environ.get("CI"), reason="tomllib needs Python 3.11")
def test_package_data_ships_every_template_and_static_file() -> None:
    assert tomllib is not None, "tomllib needs Python 3.11 (CI runs 3.11)"
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["offset_ledger"]
    files = [p.relative_to(ROOT / "offset_ledger").as_posix()
             for d in ("templates", "static") for p in (CONSOLE / d).rglob("*") if p.is_file()]
    assert files and "console/static/vendor/uplot/LICENSE" in files
    missing = [f for f in files if not any(_glob_match(f, pat) for pat in patterns)]
    assert not missing, missing



def _glob_match(path: str, pattern: str) -> bool:
    """setuptools' glob semantics: ``*`` never crosses a ``/``."""
    parts, pats = path.split("/"), pattern.split("/")
    return len(parts) == len(pats) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pats))


def test_findings_that_need_a_look_are_counted_apart(engine) -> None:  # type: ignore[no-untyped-def]
    """The console colours the findings count only for findings that need a look (issue 50, item 7):
    a first run and a new partition read from earliest are informational."""
    seed_pipeline(engine, "orders", {"orders": {0: 500}})
    seed_pipeline(engine, "calm", {"orders": {0: 5}})
    now = datetime.now(timezone.utc)
    with engine.begin() as conn:
        conn.execute(insert(findings), [
            {"pipeline": p, "consumer_group": p, "kind": kind, "topic": "orders", "partition": 0, "message": kind,
             "created_at": now}
            for p, kind in (("calm", "first_run"), ("calm", "new_partition"), ("orders", "first_run"),
                            ("orders", "gap"))])
    c = _client(engine)
    rows = {p["pipeline"]: p for p in c.get("/api/v1/console/pipelines").json()["pipelines"]}
    assert (rows["calm"]["findings"], rows["calm"]["findingsAttention"]) == (2, 0)
    assert (rows["orders"]["findings"], rows["orders"]["findingsAttention"]) == (2, 1)
    api = {p["pipeline"]: p for p in c.get("/api/v1/pipelines?lag=false").json()["pipelines"]}
    assert (api["calm"]["findingsAttention"], api["orders"]["findingsAttention"]) == (0, 1)
    script = (Path(__file__).resolve().parents[3] / "offset_ledger/console/static/pipelines.js").read_text()
    assert 'class: p.findingsAttention ? "num attention" : "num"' in script


def test_the_favicon_needs_no_token(engine) -> None:  # type: ignore[no-untyped-def]
    c = _client(engine, TOKEN)
    r = c.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml") and b"<svg" in r.content
    assert c.get("/api/v1/pipelines").status_code == 401  # the data still needs one


def test_the_chart_counts_from_zero() -> None:
    script = (Path(__file__).resolve().parents[3] / "offset_ledger/console/static/pipeline.js").read_text()
    assert "rec: { range: fromZero }" in script and "return [0, max > 0 ? max * 1.1 : 1];" in script
