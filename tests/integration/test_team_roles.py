"""One ledger, two teams (issue 39) on the real Postgres: database roles made by ``db grant`` and
scoped API tokens.

Team A's role records its own pipeline; pointed at team B's it is refused by the database (row-level
security), nothing of B changes (read back as the owner), and the listener's writer dead-letters
the events with the role and pipeline named instead of spooling them. Every write path is tried as
the wrong role. Team A's token sees only A in every list, metric and console page.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timezone
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.engine import Engine, make_url
from typer.testing import CliRunner

from offset_ledger.operate import reads, reset_operations
from offset_ledger.api import create_app
from offset_ledger.api.tokens import parse_tokens
from offset_ledger.addresses import LedgerAddress
from offset_ledger.capture.writer import EventWriter, WriterOptions
from offset_ledger.errors import UnknownPipeline
from offset_ledger.ledger.engine import ensure_schema, make_engine, permission_denied
from offset_ledger.ledger.policy_store import set_policies
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger import position_store
from offset_ledger.ledger.position_store import Placed
from offset_ledger.ledger.tables import (
    batch_offsets,
    batches,
    checkpoint_generations,
    findings,
    listener_health,
    offset_ranges,
    pipeline_policies,
    positions,
    positions_legacy,
    topic_positions,
    reset_partitions,
    resets,
    runs,
    sink_batches,
    sinks,
)
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.resets import ResetRequest
from tests.ops_seed import seed_pipeline
from tests.unit.capture.test_writer import ev, progress, started

A, B = "team-a-orders", "team-b-payments"


def _grant(dsn: str, role: str, patterns: str, *extra: str) -> Any:
    from offset_ledger.cli.main import app

    return CliRunner().invoke(app, ["db", "grant", "--role", role, "--pipelines", patterns, "--dsn", dsn, *extra])


@pytest.fixture
def teams(pg_dsn: str) -> Iterator[dict[str, Any]]:
    """The owner's engine with A's and B's pipelines, and an engine per team role."""
    admin = make_engine(pg_dsn)
    ensure_schema(admin)
    seed_pipeline(admin, A, {"orders-a": {0: 500, 1: 600}})
    seed_pipeline(admin, B, {"payments-b": {0: 700, 1: 800}})
    suffix = uuid.uuid4().hex[:8]
    roles = {"a": f"team_a_{suffix}", "b": f"team_b_{suffix}"}
    engines: dict[str, Engine] = {}
    try:
        for key, pattern in (("a", "team-a-*"), ("b", "team-b-*,billing")):
            result = _grant(pg_dsn, roles[key], pattern, "--execute")
            assert result.exit_code == 0, result.output
            with admin.begin() as conn:
                conn.execute(text(f'ALTER ROLE "{roles[key]}" PASSWORD \'pw-{suffix}\''))
            url = make_url(pg_dsn).set(username=roles[key], password=f"pw-{suffix}")
            engines[key] = make_engine(url.render_as_string(hide_password=False), create=False)
        yield {"admin": admin, "roles": roles, "engines": engines, "dsn": pg_dsn}
    finally:
        for eng in engines.values():
            eng.dispose()
        with admin.begin() as conn:
            for role in roles.values():
                if conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
                    conn.execute(text(f'DROP OWNED BY "{role}"'))
                    conn.execute(text(f'DROP ROLE "{role}"'))
        admin.dispose()


def _b_state(admin: Engine) -> dict[str, Any]:
    """Every row of B, per table, as the owner reads it (row security does not apply to the owner)."""
    out: dict[str, Any] = {}
    with admin.connect() as conn:
        for table in (runs, batches, batch_offsets, positions, positions_legacy, topic_positions, findings, resets,
                      checkpoint_generations, listener_health, pipeline_policies, sinks, sink_batches):
            rows = conn.execute(select(table).where(table.c.pipeline == B)).all()
            out[table.name] = sorted(repr(tuple(r)) for r in rows)
        out["reset_partitions"] = conn.execute(select(func.count()).select_from(reset_partitions)).scalar_one()
        out["offset_ranges"] = conn.execute(select(func.count()).select_from(offset_ranges).join(
            batches, batches.c.id == offset_ranges.c.batch_pk).where(batches.c.pipeline == B)).scalar_one()
    return out


def _refused(engine: Engine, stmt: Any) -> bool:
    """Whether the database refuses ``stmt`` for this role as a permission error (and writes nothing)."""
    try:
        with engine.begin() as conn:
            conn.execute(stmt)
    except Exception as exc:  # noqa: BLE001 - the classification is what is checked
        assert permission_denied(exc), exc
        return True
    return False


def test_role_a_records_its_own_pipeline_and_is_refused_team_bs(teams, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    admin, role_a, eng_a = teams["admin"], teams["roles"]["a"], teams["engines"]["a"]
    before = _b_state(admin)
    w = EventWriter(LedgerAddress(teams["dsn"]), spool_dir=tmp_path / "spool", store_factory=lambda: Recorder(eng_a),
                    options=WriterOptions(initial_backoff=0.01, max_backoff=0.05))
    qa, qb = str(uuid.uuid4()), str(uuid.uuid4())
    w.submit(ev("started", started(A, qa), A, A))
    for i in range(3):
        w.submit(ev("progress", progress(i, name=A, query=qa), A, A))
    w.submit(ev("started", started(B, qb), B, B))
    w.submit(ev("progress", progress(0, name=B, query=qb), B, B))
    started_at = time.monotonic()
    assert w.flush(30)
    health = w.health()
    assert w.close(10)
    assert time.monotonic() - started_at < 20  # refused for good, never retried with backoff
    with admin.connect() as conn:
        a_batches = [r.batch_id for r in conn.execute(select(batches).where(batches.c.query_id == qa))]
        b_rows = conn.execute(select(func.count()).select_from(batches).where(batches.c.query_id == qb)).scalar_one()
    assert sorted(a_batches) == [0, 1, 2] and b_rows == 0
    assert _b_state(admin) == before
    assert health.counters()["failed"] == 2 and health.counters()["retried"] == 0, health
    dead = [json.loads(line) for line in Path(health.dead_letter_path).read_text().splitlines()]
    assert len(dead) == 2
    for entry in dead:
        assert f"ledger role {role_a!r} may not write pipeline {B!r}" in entry["error"], entry["error"]
        assert entry["event"]["pipeline"] == B
    spooled = [p for p in (tmp_path / "spool").rglob("*") if p.is_file() and p != Path(health.dead_letter_path)]
    assert all(p.stat().st_size == 0 for p in spooled), spooled  # nothing left to retry


def test_every_write_path_as_the_wrong_role(teams) -> None:  # type: ignore[no-untyped-def]
    admin, eng_a = teams["admin"], teams["engines"]["a"]
    with admin.begin() as conn:  # a reset of B with its partitions, and a finding of A's own
        reset_id = conn.execute(insert(resets).values(
            pipeline=B, consumer_group=B, mode="earliest", actor="ops", dry_run=False, forced=False,
            created_at=func.now(), status="pending").returning(resets.c.id)).scalar_one()
        conn.execute(insert(reset_partitions).values(reset_id=reset_id, topic="payments-b", partition=0,
                                                     after_next_offset=0))
        conn.execute(insert(findings).values(pipeline=A, consumer_group=A, kind="gap", message="gap",
                                             created_at=func.now()))
        b_batch = conn.execute(insert(batches).values(
            pipeline=B, consumer_group=B, query_id="qb", run_id="rb", batch_id=0, batch_time=func.now(),
            recorded_at=func.now(), input_rows=0).returning(batches.c.id)).scalar_one()
    before = _b_state(admin)
    now = func.now()
    wrong = {
        "batches": insert(batches).values(pipeline=B, consumer_group=B, query_id="q", run_id="r", batch_id=9,
                                          batch_time=now, recorded_at=now, input_rows=0),
        "batch_offsets": insert(batch_offsets).values(pipeline=B, consumer_group=B, query_id="q", batch_id=9,
                                                      source_index=0, topic="payments-b", partition=0,
                                                      until_offset=1, batch_time=now),
        # A's ranges added to B's batch (the compact table names its batch, not its pipeline: the check
        # runs after the statement, see row_security.Guarded.checked_after).
        "offset_ranges": insert(offset_ranges).values(batch_pk=b_batch, source_index=0, topic="orders-a",
                                                      partitions=[0], from_offsets=[0], until_offsets=[5]),
        # The previous release's write target (0016 folds its rows into offset_ranges).
        "batch_offsets table": text("INSERT INTO batch_offsets (pipeline, consumer_group, query_id, batch_id, "
                                    "source_index, topic, \"partition\", from_offset, until_offset, batch_time) "
                                    f"VALUES ('{B}', '{B}', 'qb', 0, 0, 'payments-b', 3, 0, 5, now())"),
        # The previous release's positions (0024 folds its writes into topic_positions), and the rows per topic.
        "positions": insert(positions_legacy).values(pipeline=B, consumer_group=B, topic="payments-b", partition=5,
                                                     next_offset=1, updated_at=now),
        "topic_positions": insert(topic_positions).values(
            pipeline=B, consumer_group=B, topic="payments-x", partitions=[0], next_offsets=[1], moved_at=[datetime.now(timezone.utc)],
            moved_batch_ids=[None], moved_reset_ids=[None], moved_generation_ids=[None], moved_query_ids=[None]),
        "runs": insert(runs).values(run_id="r-b", query_id="q", pipeline=B, consumer_group=B, started_at=now),
        "resets": insert(resets).values(pipeline=B, consumer_group=B, mode="latest", actor="a", dry_run=False,
                                        forced=True, created_at=now, status="pending"),
        "reset_partitions": insert(reset_partitions).values(reset_id=reset_id, topic="payments-b", partition=1,
                                                            after_next_offset=0),
        "findings": insert(findings).values(pipeline=B, consumer_group=B, kind="gap", message="x", created_at=now),
        "checkpoint_generations": insert(checkpoint_generations).values(
            pipeline=B, consumer_group=B, generation=9, checkpoint_root="/c", location="/c/9", reason="requested",
            created_at=now),
        "listener_health": insert(listener_health).values(listener_id="l-b", pipeline=B, reported_at=now),
        "pipeline_policies": insert(pipeline_policies).values(pipeline=B, policies={}, actor="a", created_at=now),
        "sinks": insert(sinks).values(sink="s-b", pipeline=B, consumer_group=B, kind="postgres", target="t",
                                      last_sequence=0, updated_at=now),
        "sink_batches": insert(sink_batches).values(sink="s-b", pipeline=B, consumer_group=B, sequence=1,
                                                    generation_id=1, query_id="q", batch_id=0, target="t",
                                                    committed_at=now, recorded_at=now),
        # The audit history is append-only, the team's own rows included.
        "update own finding": update(findings).where(findings.c.pipeline == A).values(message="rewritten"),
        "update own reset reason": update(resets).values(reason="rewritten"),
        "delete own finding": findings.delete().where(findings.c.pipeline == A),
        "delete own reset": resets.delete().where(resets.c.pipeline == A),
        "delete own position's generation": checkpoint_generations.delete().where(
            checkpoint_generations.c.pipeline == A),
        "move a row to B": update(topic_positions).where(topic_positions.c.pipeline == A).values(pipeline=B),
    }
    refused = {name: _refused(eng_a, stmt) for name, stmt in wrong.items()}
    assert refused == {name: True for name in wrong}, refused
    # B's rows are invisible to A: an update or delete of them finds nothing to change.
    with eng_a.begin() as conn:
        assert conn.execute(update(topic_positions).where(topic_positions.c.pipeline == B)
                            .values(next_offsets=[0])).rowcount == 0
        # its prune may delete batches (issue 48): its own only, B's are not there for it
        assert conn.execute(batches.delete().where(batches.c.pipeline == B)).rowcount == 0
        assert conn.execute(select(func.count()).select_from(batches).where(batches.c.pipeline == B)).scalar() == 0
        for view in ("v_current_positions", "v_batch_history"):
            names = {r[0] for r in conn.execute(text(f"SELECT DISTINCT pipeline FROM {view}"))}
            assert names == {A}, (view, names)
    # The verbs as team A: B does not exist for it; the policy store refuses B's name.
    ops = Operations(eng_a)
    assert [p.pipeline for p in reads.list_pipelines(ops, with_lag=False)] == [A]
    with pytest.raises(UnknownPipeline) as info:
        reset_operations.reset(ops, B, ResetRequest(mode="earliest"), actor="a", reason="x", dry_run=False)
    assert info.value.details["known"] == [A]
    with pytest.raises(Exception) as policy:
        with eng_a.begin() as conn:
            set_policies(conn, B, {"first_run": "latest"}, actor="a", reason="x")
    assert permission_denied(policy.value), policy.value
    assert _b_state(admin) == before
    # Team A's own writes pass: its findings repeat-counter, positions and policies.
    with eng_a.begin() as conn:
        conn.execute(update(findings).where(findings.c.pipeline == A).values(occurrences=2))
        moved = {(p.topic, p.partition): Placed(1, datetime.now(timezone.utc)) for p in conn.execute(
            select(positions.c.topic, positions.c.partition).where(positions.c.pipeline == A))}
        assert moved
        position_store.write(conn, A, A, moved)
        set_policies(conn, A, {"first_run": "latest"}, actor="a", reason="own")
    # Migrations keep working with the policies in place, and re-apply them.
    result = CliRunner().invoke(__import__("offset_ledger.cli.main", fromlist=["app"]).app,
                                ["db", "upgrade", "--dsn", teams["dsn"]])
    assert result.exit_code == 0 and "row-level security re-applied" in result.output, result.output


def test_grant_dry_run_prints_sql_and_changes_nothing(teams, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    role = f"team_c_{uuid.uuid4().hex[:8]}"
    result = _grant(teams["dsn"], role, "team-c-*")
    assert result.exit_code == 0, result.output
    assert f'CREATE ROLE "{role}" LOGIN' in result.output and "starts_with(pipeline, s.pattern)" in result.output
    assert f"'{role}', 'team-c-', true" in result.output
    with teams["admin"].connect() as conn:
        assert conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first() is None
    from offset_ledger.cli.main import main

    sqlite = make_engine(f"sqlite:///{tmp_path / 'l.db'}")
    ensure_schema(sqlite)  # a real SQLite ledger: refused for having no roles, not for being absent
    sqlite.dispose()
    for argv, says in ((["--role", "Team A", "--pipelines", "x", "--dsn", teams["dsn"]], "--role 'Team A'"),
                       (["--role", "team_d", "--pipelines", "a*b", "--dsn", teams["dsn"]], "'*' may only end"),
                       (["--role", "team_d", "--pipelines", "x", "--dsn", "sqlite:///" + str(tmp_path / "l.db"),
                         "--execute"], "SQLite is a single-user file")):
        with pytest.raises(SystemExit) as code:
            main(["db", "grant", *argv])
        err = capsys.readouterr().err
        assert code.value.code == 2 and says in err and err.count("\n") == 1, err


def test_scoped_tokens_on_postgres(teams, kafka) -> None:  # type: ignore[no-untyped-def]
    secret_a, secret_b = "team-a-secret-0123456789", "team-b-secret-0123456789"
    tokens = parse_tokens(f"a-bot:operate[team-a-*]:{secret_a},b-bot:read[team-b-*]:{secret_b}", "test")
    ops = Operations(teams["admin"], bootstrap_servers=kafka.bootstrap_servers)
    client = TestClient(create_app(operations=ops, tokens=tokens), raise_server_exceptions=False,
                        base_url="http://localhost")
    auth = {"Authorization": f"Bearer {secret_a}"}
    for path in ("/api/v1/pipelines", "/api/v1/console/pipelines", "/metrics", "/", "/pipelines/" + A,
                 f"/api/v1/pipelines/{A}/offsets", f"/api/v1/pipelines/{A}/findings", f"/api/v1/pipelines/{A}/runs",
                 f"/api/v1/pipelines/{A}/resets", f"/api/v1/pipelines/{A}/history", f"/v1/getCurrentOffsets?pipelineName={A}"):
        r = client.get(path, headers=auth)
        assert r.status_code == 200, (path, r.text)
        assert B not in r.text and "payments-b" not in r.text, path
    assert [p["pipeline"] for p in client.get("/api/v1/pipelines", headers=auth).json()["pipelines"]] == [A]
    assert f'pipeline="{A}"' in client.get("/metrics", headers=auth).text
    for path in (f"/api/v1/pipelines/{B}/offsets", f"/v1/getCurrentOffsets?pipelineName={B}",
                 f"/api/v1/pipelines/{B}/verify"):
        r = client.get(path, headers=auth)
        unknown = client.get(path.replace(B, "team-z-unknown"), headers=auth)
        assert r.status_code == 404 and r.text.replace(B, "team-z-unknown") == unknown.text, (path, r.text)
    r = client.post(f"/api/v1/pipelines/{B}/resets", headers=auth, json={"mode": "earliest", "dryRun": False,
                                                                         "reason": "x"})
    assert r.status_code == 404 and r.json() == {"error": "UnknownPipeline", "message": f"unknown pipeline {B!r} "
                                                 f"(pipelines: {A})", "pipeline": B, "known": [A]}
    b_view = client.get("/api/v1/pipelines", headers={"Authorization": f"Bearer {secret_b}"}).json()
    assert [p["pipeline"] for p in b_view["pipelines"]] == [B]
