"""A pipeline's running state tells the truth (issue 40), on the real stack.

The oracle is what Spark itself did: a query stopped (``query.stop()`` returned), a driver SIGKILLed
(the process group gone), a query never watched by a listener. The API, the console's list, the
CLI's ``pipelines`` and the 409 of a refused reset give the same answer and evidence.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from offset_ledger import OffsetLedgerListener, start_from_ledger
from offset_ledger.ledger.engine import make_engine
from offset_ledger.ledger.tables import batches, resets, runs
from offset_ledger.sinks import PostgresSink
from tests.integration.sink_helper import create_target
from tests.integration.test_api import serving
from tests.integration.test_cli_ops import cli_env, run
from tests.integration.test_restart import _values

DRIVER = Path(__file__).with_name("status_driver.py")
AGO = r"\d+ (s|min)"


def listed(srv: Any, pipeline: str) -> dict[str, Any]:
    answer = httpx.get(f"{srv.url}/api/v1/pipelines", params={"lag": "false"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return next((r for r in answer.json()["pipelines"] if r["pipeline"] == pipeline),
                {"state": None, "stateReason": "not in the ledger yet"})


def console_row(srv: Any, pipeline: str) -> dict[str, Any]:
    rows = httpx.get(f"{srv.url}/api/v1/console/pipelines", timeout=30).json()["pipelines"]
    return next(r for r in rows if r["pipeline"] == pipeline)


def cli_row(env: dict[str, str], pipeline: str) -> dict[str, Any]:
    r = run(env, "pipelines", "--no-lag", "--format", "json")
    assert r.returncode == 0, r.stderr
    return next(x for x in json.loads(r.stdout) if x["pipeline"] == pipeline)


def wait_for_state(srv: Any, pipeline: str, want: set[str], timeout: float) -> tuple[dict[str, Any], float]:
    began = time.monotonic()
    while True:
        row = listed(srv, pipeline)
        if row["state"] in want:
            return row, time.monotonic() - began
        if time.monotonic() - began > timeout:
            raise AssertionError(f"{pipeline} still {row['state']} after {timeout} s: {row['stateReason']}")
        time.sleep(0.25)


def kafka_frame(spark, kafka, topic: str, plan):  # type: ignore[no-untyped-def]
    return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
            .option("subscribe", topic).option("startingOffsets", plan.starting_offsets_json)
            .option("maxOffsetsPerTrigger", "10").load()
            .selectExpr("CAST(value AS STRING) AS value", "topic", "partition", "offset"))


def test_a_stopped_query_shows_stopped_within_seconds_and_a_reset_right_after_needs_no_force(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 40))
    create_target(pg_dsn, "orders_out")
    plan = start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "ck"), app_version="1", dsn=pg_dsn, first_run="earliest")
    listener = OffsetLedgerListener(dsn=pg_dsn, pipeline="orders", spool_dir=tmp_path / "spool")
    spark.streams.addListener(listener)
    env = cli_env(pg_dsn, kafka.bootstrap_servers)
    sink = PostgresSink(table="orders_out", checkpoint_location=plan.checkpoint_location, pipeline="orders",
                        dsn=pg_dsn)
    query = (kafka_frame(spark, kafka, topic, plan).writeStream.foreachBatch(sink)
             .option("checkpointLocation", plan.checkpoint_location).trigger(processingTime="500 milliseconds").start())
    try:
        with serving(pg_dsn, kafka.bootstrap_servers) as srv:
            query.processAllAvailable()
            assert listener.flush(30)
            row, _ = wait_for_state(srv, "orders", {"running"}, 30)
            run_id = str(query.runId)
            assert row["stateRunId"] == run_id
            assert re.fullmatch(rf"driver heartbeat {AGO} ago from run {run_id[:8]} \(bound 30 s\)", row["stateReason"])
            # The sink's record of the same query follows the listener's run, it is not evidence of its own.
            sink_run = next(r for r in row["runs"] if r["runId"].startswith("sink:"))
            assert sink_run["state"] == "active" and not sink_run["inferred"]
            assert sink_run["why"].startswith(f"follows listener run {run_id[:8]}")
            # Every face says the same.
            assert console_row(srv, "orders")["stateRunId"] == run_id
            cli = cli_row(env, "orders")
            assert (cli["state"], cli["stateRunId"]) == ("running", run_id)
            # A reset while it runs: still refused, and the refusal gives the evidence.
            refused = httpx.post(f"{srv.url}/api/v1/pipelines/orders/resets", timeout=30,
                                 json={"mode": "earliest", "dryRun": False, "reason": "while running"})
            assert refused.status_code == 409
            assert re.search(rf"\(running: driver heartbeat {AGO} ago from run {run_id[:8]} ", refused.json()["message"])
            r = run(env, "reset", "orders", "--to-earliest", "--execute", "--reason", "while running")
            assert r.returncode == 3 and f"from run {run_id[:8]}" in r.stderr

            query.stop()
            assert listener.flush(30)
            row, took = wait_for_state(srv, "orders", {"stopped"}, 10)
            print(f"stopped {took:.2f} s after flush()")
            assert took < 5
            assert re.fullmatch(rf"query ended {AGO} ago \(run {run_id[:8]}\)", row["stateReason"])
            assert row["runs"] == []  # the sink's run ended with the query
            assert cli_row(env, "orders")["state"] == "stopped"
            r = run(env, "reset", "orders", "--to-earliest", "--execute", "--reason", "after a normal stop")
            assert r.returncode == 0, r.stderr
    finally:
        if query.isActive:
            query.stop()
        spark.streams.removeListener(listener)
        listener.close(10)
    engine = make_engine(pg_dsn)
    try:
        with engine.connect() as conn:
            ended = dict(conn.execute(select(runs.c.run_id, runs.c.terminated_at)).all())
    finally:
        engine.dispose()
    assert ended[run_id] is not None and ended[next(k for k in ended if k.startswith("sink:"))] == ended[run_id]


def test_a_sink_only_pipeline_is_uncertain_and_says_why(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("s", 20))
    create_target(pg_dsn, "solo_out")
    plan = start_from_ledger("solo", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "ck"), app_version="1", dsn=pg_dsn, first_run="earliest")
    sink = PostgresSink(table="solo_out", checkpoint_location=plan.checkpoint_location, pipeline="solo", dsn=pg_dsn)
    query = (kafka_frame(spark, kafka, topic, plan).writeStream.foreachBatch(sink)
             .option("checkpointLocation", plan.checkpoint_location).trigger(availableNow=True).start())
    query.awaitTermination()
    env = cli_env(pg_dsn, kafka.bootstrap_servers)
    with serving(pg_dsn, kafka.bootstrap_servers) as srv:
        row = listed(srv, "solo")
        assert row["state"] == "uncertain" and row["stateRunId"].startswith("sink:")
        assert re.fullmatch(rf"no listener: running inferred from the last batch {AGO} ago from run sink:\w+ "
                            rf"\(bound 10 min\)", row["stateReason"])
        cli = cli_row(env, "solo")
        assert cli["state"] == "uncertain" and cli["stateRunId"] == row["stateRunId"]
        assert cli["stateReason"].startswith("no listener: running inferred from the last batch")
        # Nothing tells it stopped: the guard still holds, and says on what it rests.
        refused = httpx.post(f"{srv.url}/api/v1/pipelines/solo/resets", timeout=30,
                             json={"mode": "earliest", "dryRun": False, "reason": "sink only"})
        assert refused.status_code == 409 and "(uncertain: no listener: running inferred" in refused.json()["message"]


def _slow_trigger_refused_then_sigkilled(stack, kafka, ledger, pg_dsn: str, tmp_path: Path,  # type: ignore[no-untyped-def]
                                        *, trigger: str, watch: float, every: float) -> None:
    """A driver on a slow trigger (events only at triggers): running, and refused a reset, for ``watch``
    seconds (past the old silence floor and a trigger); then SIGKILLed: not running within 3 heartbeat
    periods, and a reset goes through without force. The oracle is the process itself (alive, then killed)."""
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("k", 30))
    create_target(pg_dsn, "killed_out")
    cfg = {"pipeline": "killed", "topic": topic, "bootstrap": kafka.bootstrap_servers, "dsn": pg_dsn,
           "jars": stack.spark_jars, "checkpoint_root": str(tmp_path / "ck"), "table": "killed_out",
           "spool_dir": str(tmp_path / "spool"), "idle_interval": "10s", "trigger": trigger}
    env = dict(os.environ, OFFSET_LEDGER_HEARTBEAT_INTERVAL=f"{every}s")
    proc = subprocess.Popen([sys.executable, str(DRIVER), json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    cli = cli_env(pg_dsn, kafka.bootstrap_servers)
    try:
        with serving(pg_dsn, kafka.bootstrap_servers) as srv:
            # Until the listener has recorded the first batch of a run that beats.
            deadline = time.monotonic() + 150
            while True:
                with ledger.connect() as conn:
                    facts = conn.execute(select(runs.c.run_id, runs.c.beat_every_ms)
                                         .where(runs.c.pipeline == "killed", runs.c.beat_every_ms.is_not(None),
                                                ~runs.c.run_id.like("sink:%"))).first()
                    recorded = conn.execute(select(func.count()).select_from(batches)
                                            .where(batches.c.pipeline == "killed")).scalar()
                if facts is not None and recorded:
                    break
                assert time.monotonic() < deadline and proc.poll() is None, "the driver never recorded a batch"
                time.sleep(0.5)
            assert facts.beat_every_ms == int(every * 1000)
            began, probes, cli_probes = time.monotonic(), 0, 0
            while time.monotonic() - began < watch:
                assert proc.poll() is None, "the driver died by itself"
                row = listed(srv, "killed")
                assert row["state"] == "running" and row["stateRunId"] == facts.run_id, row["stateReason"]
                refused = httpx.post(f"{srv.url}/api/v1/pipelines/killed/resets", timeout=30,
                                     json={"mode": "earliest", "dryRun": False, "reason": "while it runs"})
                assert refused.status_code == 409, refused.text
                probes += 1
                if probes % 10 == 1:  # the CLI's guard is the same verdict
                    r = run(cli, "reset", "killed", "--to-earliest", "--execute", "--reason", "while it runs")
                    assert r.returncode == 3 and "driver heartbeat" in r.stderr, r.stderr
                    cli_probes += 1
                time.sleep(2)
            print(f"refused {probes} resets ({cli_probes} by the CLI) over {watch:.0f} s on a {trigger} trigger")
            with ledger.connect() as conn:
                assert conn.execute(select(func.count()).select_from(resets)
                                    .where(resets.c.pipeline == "killed")).scalar() == 0
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            killed_at = time.monotonic()
            row, _ = wait_for_state(srv, "killed", {"stale", "stopped"}, 3 * every + 30)
            took = time.monotonic() - killed_at
            print(f"not running {took:.1f} s after the SIGKILL (bound {3 * every:.0f} s from the last beat)")
            assert took <= 3 * every + 2, (took, every)  # the last beat is at most one period before the kill
            assert row["state"] == "stale" and "driver heartbeat stopped" in row["stateReason"]
            # The sink's run of the query follows the dead listener run.
            assert {r["state"] for r in row["runs"]} == {"stale"}
            done = httpx.post(f"{srv.url}/api/v1/pipelines/killed/resets", timeout=30,
                              json={"mode": "earliest", "dryRun": False, "reason": "after the crash"})
            assert done.status_code == 200, done.text
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out = proc.communicate()[0] if proc.stdout else ""
        print(out[-3000:])


def test_a_slow_trigger_is_running_and_refused_until_its_driver_is_sigkilled(
        stack, kafka, ledger, pg_dsn: str, tmp_path: Path,  # type: ignore[no-untyped-def]
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A 5 s floor for runs without a heartbeat (the old inference would call this 20 s trigger crashed
    # 5 s after each batch and let a reset through); the heartbeat every second keeps the test short.
    monkeypatch.setenv("OFFSET_LEDGER_RUN_SILENCE_FLOOR", "5s")
    _slow_trigger_refused_then_sigkilled(stack, kafka, ledger, pg_dsn, tmp_path, trigger="20 seconds", watch=25,
                                         every=1.0)


@pytest.mark.long
def test_a_two_minute_trigger_is_refused_a_reset_throughout_and_seen_ended_after_a_sigkill(
        stack, kafka, ledger, pg_dsn: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The case on the defaults (60 s floor): the old inference let a reset through 100 s after
    # the first batch; 130 s spans that and the second trigger.
    _slow_trigger_refused_then_sigkilled(stack, kafka, ledger, pg_dsn, tmp_path, trigger="2 minutes", watch=130,
                                         every=2.0)
