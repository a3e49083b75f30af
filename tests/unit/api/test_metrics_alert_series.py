"""The /metrics series the alert rules need (issue 52): the pipeline's running state as every face shows it,
the driver heartbeat's age, resets pending and the newest executed reset, findings by kind, and the
consumer_group label on every pipeline series (Alertmanager routes per team on it)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from fastapi.testclient import TestClient
from sqlalchemy import insert, update

from offset_ledger.ledger.tables import findings, listener_health, resets, runs
from tests.ops_seed import seed_pipeline
from tests.unit.api.test_api_validation import _client, engine  # noqa: F401  (the fixture)


def _samples(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(\{{.*\}}) (\S+)", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def _state(client: TestClient, pipeline: str) -> str:
    return next(r for r in client.get("/api/v1/pipelines", params={"lag": "false"}).json()["pipelines"]
                if r["pipeline"] == pipeline)["state"]


def test_pipeline_state_is_the_verdict_every_face_shows(engine) -> None:  # type: ignore[no-untyped-def]
    ids = seed_pipeline(engine, "live", {"orders": {0: 50}}, active=True)
    client = _client(engine)
    text = client.get("/metrics").text
    got = _samples(text, "offset_ledger_pipeline_state")
    for pipeline, want in (("live", "running"), ("orders-etl", "stopped")):
        assert _state(client, pipeline) == want
        mine = {k: v for k, v in got.items() if f'pipeline="{pipeline}",consumer_group="{pipeline}"' in k}
        assert {re.search(r'state="(\w+)"', k).group(1): v for k, v in mine.items()} == {  # type: ignore[union-attr]
            s: float(s == want) for s in ("running", "uncertain", "stale", "stopped")}
    # Beats 5 s old: the age is about 5 s and only the running pipeline has one.
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == ids["run_id"])
                     .values(beat_at=datetime.now(timezone.utc) - timedelta(seconds=5),
                             last_heartbeat_at=datetime.now(timezone.utc) - timedelta(seconds=6)))
    ages = _samples(client.get("/metrics").text, "offset_ledger_driver_heartbeat_age_seconds")
    assert list(ages) == ['{pipeline="live",consumer_group="live"}'] and 4 <= ages[list(ages)[0]] < 30
    # The beat stops (SIGKILL): stale, the age keeps growing, and the state says stale.
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == ids["run_id"])
                     .values(beat_at=datetime.now(timezone.utc) - timedelta(seconds=45),
                             last_heartbeat_at=datetime.now(timezone.utc) - timedelta(seconds=45)))
    text = client.get("/metrics").text
    assert _state(client, "live") == "stale"
    assert _samples(text, "offset_ledger_pipeline_state")['{pipeline="live",consumer_group="live",state="stale"}'] == 1
    assert _samples(text, "offset_ledger_driver_heartbeat_age_seconds")['{pipeline="live",consumer_group="live"}'] >= 45


def test_resets_pending_last_reset_and_findings_by_kind(engine) -> None:  # type: ignore[no-untyped-def]
    seed_pipeline(engine, "other", {"orders": {0: 5}}, consumer_group="g2")
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with engine.begin() as conn:
        for status, dry, when in (("consumed", False, at - timedelta(hours=1)), ("pending", False, at),
                                  ("dry_run", True, at + timedelta(hours=1))):
            conn.execute(insert(resets).values(pipeline="orders-etl", consumer_group="orders-etl", mode="latest",
                                               actor="t", dry_run=dry, forced=False, created_at=when, status=status))
        for kind in ("gap", "gap", "overlap"):
            conn.execute(insert(findings).values(pipeline="orders-etl", consumer_group="orders-etl", kind=kind,
                                                 message="m", created_at=at))
    text = _client(engine).get("/metrics").text
    assert _samples(text, "offset_ledger_resets_pending") == {
        '{pipeline="orders-etl",consumer_group="orders-etl"}': 1, '{pipeline="other",consumer_group="g2"}': 0}
    # The newest executed reset, not the later dry run.
    assert _samples(text, "offset_ledger_last_reset_timestamp_seconds") == {
        '{pipeline="orders-etl",consumer_group="orders-etl"}': at.timestamp()}
    assert _samples(text, "offset_ledger_findings") == {
        '{pipeline="orders-etl",consumer_group="orders-etl",kind="gap"}': 2,
        '{pipeline="orders-etl",consumer_group="orders-etl",kind="overlap"}': 1}


def test_every_pipeline_series_carries_pipeline_and_consumer_group(engine) -> None:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        conn.execute(insert(listener_health).values(
            listener_id="l-1", pipeline="orders-etl", host="h", reported_at=datetime.now(timezone.utc),
            queued=3, written=120, retried=2, spilled=0, failed=1, last_error=None))
        conn.execute(insert(findings).values(pipeline="orders-etl", consumer_group="orders-etl", kind="gap",
                                             message="m", created_at=datetime.now(timezone.utc)))
    text = _client(engine).get("/metrics").text
    assert 'offset_ledger_listener_written_total{listener_id="l-1",pipeline="orders-etl",' \
           'consumer_group="orders-etl",host="h"} 120' in text
    names = set()
    for line in text.splitlines():
        if line.startswith("offset_ledger_") and not line.startswith("offset_ledger_kafka_up"):
            names.add(line.split("{")[0])
            assert 'pipeline="' in line and 'consumer_group="' in line, line
    assert _samples(text, "offset_ledger_last_batch_id") == {'{pipeline="orders-etl",consumer_group="orders-etl"}': 2}
    assert {"offset_ledger_pipeline_state", "offset_ledger_resets_pending", "offset_ledger_findings",
            "offset_ledger_listener_healthy", "offset_ledger_lag_records"} <= names
