"""The operations CLI as a user runs it (a subprocess) against real Kafka and Postgres."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from offset_ledger.devstack import free_port
from offset_ledger.ledger.engine import make_engine, upgrade
from tests.ops_seed import seed_pipeline

CLI = [sys.executable, "-c", "from offset_ledger.cli.main import main; main()"]


def run(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120, input=stdin)


def cli_env(pg_dsn: str, bootstrap: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    env.update(OFFSET_LEDGER_DSN=pg_dsn, OFFSET_LEDGER_BOOTSTRAP_SERVERS=bootstrap)
    return env


def test_read_commands_in_every_format(pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(40)])  # 20 per partition
    engine = make_engine(pg_dsn)
    upgrade(engine)
    seed_pipeline(engine, "etl", {topic: {0: 12, 1: 20}}, n_batches=4)
    engine.dispose()
    env = cli_env(pg_dsn, kafka.bootstrap_servers)

    r = run(env, "pipelines")
    assert r.returncode == 0, r.stderr
    header, row = r.stdout.splitlines()
    assert header.split() == ["PIPELINE", "CONSUMER_GROUP", "STATE", "STATUS", "GENERATION", "FOREIGN_RUNS",
                              "PARTITIONS", "LAST_BATCH_TIME", "LAST_BATCH_ID", "LAG", "HEADROOM", "FINDINGS",
                              "STATE_REASON"]
    cells = row.split()
    assert cells[:3] == ["etl", "etl", "stopped"] and cells[4:7] == ["-", "-", "2"]
    # the default retention (7 days) minus the age of the record at partition 0's position
    assert cells[9] == "8" and cells[10].startswith("OK:6d") and cells[11] == "0"
    assert " ".join(cells[12:]).startswith("query ended ")  # STATE_REASON: the stopped state's evidence (rules.liveness)

    r = run(env, "offsets", "etl", "--format", "json")
    assert json.loads(r.stdout) == {topic: {"0": 12, "1": 20}}
    r = run(env, "offsets", "etl", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [(x["topic"], x["partition"], x["nextOffset"], x["placedBy"]) for x in rows] == [
        (topic, "0", "12", "batch"), (topic, "1", "20", "batch")]

    r = run(env, "history", "etl", "--limit", "2", "--format", "json")
    doc = json.loads(r.stdout)
    assert [b["batchId"] for b in doc["batches"]] == [3, 2] and doc["nextCursor"]
    r = run(env, "history", "etl", "--limit", "2", "--format", "csv")
    assert r.stderr == f"more: --cursor {doc['nextCursor']} (or --all)\n"  # machine formats say they were cut
    r = run(env, "history", "etl", "--limit", "2", "--cursor", doc["nextCursor"], "--format", "csv")
    assert sorted({x["batchId"] for x in csv.DictReader(io.StringIO(r.stdout))}) == ["0", "1"] and not r.stderr
    r = run(env, "history", "etl", "--limit", "1", "--all", "--format", "csv")
    assert sorted({x["batchId"] for x in csv.DictReader(io.StringIO(r.stdout))}) == ["0", "1", "2", "3"]
    assert not r.stderr

    r = run(env, "topic", topic, "--format", "json")
    assert json.loads(r.stdout) == {"name": topic, "partitions": {"0": {"logStartOffset": 0, "logEndOffset": 20},
                                                                   "1": {"logStartOffset": 0, "logEndOffset": 20}}}
    r = run(env, "lag", "etl", "--format", "json")
    assert [(x["partition"], x["lag"]) for x in json.loads(r.stdout)] == [(0, 8), (1, 0)]

    for args in (["offsets", "nope"], ["topic", "no_such_topic_zz"], ["history", "etl", "--since", "soon"],
                 ["offsets", "etl", "--format", "xml"]):
        r = run(env, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("offset-ledger: error: ") and len(r.stderr.strip().splitlines()) == 1


def test_reset_dry_run_execute_and_refusals(pg_dsn: str, kafka, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(40)])  # 20 per partition
    engine = make_engine(pg_dsn)
    upgrade(engine)
    seed_pipeline(engine, "etl", {topic: {0: 12, 1: 20}})
    seed_pipeline(engine, "live", {topic: {0: 5, 1: 5}}, active=True)
    env = cli_env(pg_dsn, kafka.bootstrap_servers)

    def offsets(p: str) -> dict:
        # Read the ledger directly (the offsets command itself is covered above; subprocesses are slow).
        from offset_ledger.ledger.queries import current_positions

        with engine.connect() as conn:
            out: dict = {}
            for pos in current_positions(conn, p):
                out.setdefault(pos.topic, {})[str(pos.partition)] = pos.next_offset
            return out

    r = run(env, "reset", "etl", "--to-earliest", "--reason", "look")
    assert r.returncode == 0, r.stderr
    assert "dry run recorded as reset" in r.stderr and "--execute" in r.stderr
    row = r.stdout.splitlines()[1].split()
    # topic partition before target logStart logEnd replayed skipped bytes span outOfRange clamped requested
    assert row[:8] + row[10:] == [topic, "0", "12", "0", "0", "20", "12", "0", "-", "False", "0"]
    assert int(row[8]) > 0 and float(row[9]) >= 0  # about how many bytes, over how many seconds (test_move_cost)
    assert "cost: re-reads 32 records" in r.stderr
    assert offsets("etl") == {topic: {"0": 12, "1": 20}}

    target = tmp_path / "offsets.json"
    target.write_text(json.dumps({topic: {"0": 3, "1": -2}}))
    r = run(env, "reset", "etl", "--to-offsets", str(target), "--execute", "--reason", "replay", "--actor", "bob",
            "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "pending" and doc["newPositions"] == {topic: {"0": 3, "1": 0}}
    assert offsets("etl") == {topic: {"0": 3, "1": 0}}

    r = run(env, "reset", "etl", "--shift-by", "4", "--topic", f"{topic}:1", "--execute")
    assert r.returncode == 2 and "needs a reason" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert offsets("etl") == {topic: {"0": 3, "1": 0}}
    r = run(env, "reset", "etl", "--shift-by", "4", "--topic", f"{topic}:1", "--execute", "--reason", "r")
    assert r.returncode == 0, r.stderr
    assert offsets("etl") == {topic: {"0": 3, "1": 4}}

    r = run(env, "reset", "etl", "--to-datetime", "2999-01-01T00:00:00Z", "--execute", "--reason", "r")  # nothing that new
    assert r.returncode == 0, r.stderr
    assert offsets("etl") == {topic: {"0": 20, "1": 20}}

    r = run(env, "reset", "etl", "--to-offsets", "-", "--execute", "--reason", "r", stdin=json.dumps({topic: {"0": 99}}))
    assert r.returncode == 3 and "outside the log" in r.stderr
    r = run(env, "reset", "etl", "--to-offsets", "-", "--execute", "--reason", "r", "--out-of-range", "clamp",
            stdin=json.dumps({topic: {"0": 99}}))
    assert r.returncode == 0 and offsets("etl") == {topic: {"0": 20, "1": 20}}

    r = run(env, "reset", "live", "--to-earliest", "--execute", "--reason", "r")
    assert r.returncode == 3 and "active run" in r.stderr
    assert offsets("live") == {topic: {"0": 5, "1": 5}}
    r = run(env, "reset", "live", "--to-earliest", "--execute", "--force", "--reason", "incident")
    assert r.returncode == 0 and offsets("live") == {topic: {"0": 0, "1": 0}}

    for args in (["reset", "etl"], ["reset", "etl", "--to-earliest", "--to-latest"],
                 ["reset", "etl", "--to-offsets", str(tmp_path / "missing.json")],
                 ["reset", "etl", "--to-latest", "--topic", f"{topic}:x"],
                 ["reset", "etl", "--to-latest", "--topic", f"{topic}:7"],
                 ["reset", "nope", "--to-latest"]):
        r = run(env, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr

    from sqlalchemy import text

    with engine.connect() as conn:
        audit = conn.execute(text("SELECT mode, status, actor, reason FROM resets WHERE pipeline = 'etl' ORDER BY id")).all()
    engine.dispose()
    assert [(a.mode, a.status) for a in audit] == [
        ("earliest", "dry_run"), ("offsets", "pending"), ("shift", "pending"), ("timestamp", "pending"),
        ("offsets", "pending")]
    assert audit[1].actor == "bob" and audit[1].reason == "replay"


def test_serve_binds_loopback_and_refuses_open_binds_without_a_token(pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=1)
    engine = make_engine(pg_dsn)
    upgrade(engine)
    seed_pipeline(engine, "p", {topic: {0: 0}})
    engine.dispose()
    env = cli_env(pg_dsn, kafka.bootstrap_servers)

    r = run(env, "serve", "--host", "0.0.0.0", "--port", str(free_port()))
    assert r.returncode == 2 and "OFFSET_LEDGER_API_TOKEN" in r.stderr

    port = free_port()
    proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--log-level", "warning"],
                            env=dict(env, OFFSET_LEDGER_API_TOKEN="t0k"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r2 = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "serve did not come up"
                time.sleep(0.2)
        assert r2.status_code == 200
        url = f"http://127.0.0.1:{port}/v1/getCurrentOffsets/?pipelineName=p"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer t0k"}).json() == {topic: {"0": 0}}
    finally:
        proc.terminate()
        proc.wait(15)
