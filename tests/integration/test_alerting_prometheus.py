"""The shipped alert rules on a real Prometheus (issue 52): Debian's ``prometheus`` server, started here on a
free loopback port with a temporary config and data directory, scrapes a real ``offset-ledger serve``
(uvicorn, ``serving``) over a real pipeline (a Spark driver with the listener and the Postgres sink,
``status_driver.py``). The oracle is the driver process itself: alive on a slow trigger, nothing fires;
SIGKILLed, the crash alert fires within its documented bound (docs/alerting.md):

    3 x OFFSET_LEDGER_HEARTBEAT_INTERVAL + --crash-for + scrape interval + evaluation interval

Short settings keep it quick: a 1 s heartbeat, scrape and evaluation every second, ``--crash-for 2s``.
Without the prometheus binary the test skips, under CI it fails (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from offset_ledger.operate.alert_rules import Thresholds, render_yaml, rules_document
from offset_ledger.devstack import free_port
from offset_ledger.ledger.tables import batches, runs
from tests.integration.sink_helper import create_target
from tests.integration.test_api import serving
from tests.integration.test_restart import _values

DRIVER = Path(__file__).with_name("status_driver.py")
PROMETHEUS = os.environ.get("OFFSET_LEDGER_PROMETHEUS", "/usr/bin/prometheus")
EVERY = 1.0  # heartbeat, scrape and evaluation interval (s)
CRASH_FOR = timedelta(seconds=2)


def _binary() -> str:
    found = shutil.which(PROMETHEUS) or shutil.which("prometheus")
    if found is None:
        message = f"{PROMETHEUS} missing: apt-get install prometheus"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found


@contextmanager
def prometheus(target_port: int, rules: str, tmp: Path) -> Iterator[str]:
    """A Prometheus server scraping ``127.0.0.1:target_port/metrics``; yields its base URL. Stopped by its pid."""
    binary = _binary()
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "rules.yml").write_text(rules, encoding="utf-8")
    (tmp / "prometheus.yml").write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": f"{EVERY:g}s", "evaluation_interval": f"{EVERY:g}s",
                   "scrape_timeout": f"{EVERY:g}s"},
        "rule_files": [str(tmp / "rules.yml")],
        "scrape_configs": [{"job_name": "offset-ledger", "metrics_path": "/metrics",
                            "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}],
    }), encoding="utf-8")
    port = free_port()
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp / "prometheus.log").read_text()
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
        log.close()


def firing(url: str) -> list[dict[str, Any]]:
    got = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return [a for a in got if a["state"] == "firing"]


def scraped(url: str) -> bool:
    got = httpx.get(f"{url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    return bool(got) and got[0]["health"] == "up"


def query(url: str, expr: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()["data"]["result"]


@pytest.mark.long
def test_a_slow_trigger_pages_nothing_and_a_sigkilled_driver_pages_within_the_bound(
        stack, kafka, ledger, pg_dsn: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("p", 30))
    create_target(pg_dsn, "paged_out")
    cfg = {"pipeline": "paged", "topic": topic, "bootstrap": kafka.bootstrap_servers, "dsn": pg_dsn,
           "jars": stack.spark_jars, "checkpoint_root": str(tmp_path / "ck"), "table": "paged_out",
           "spool_dir": str(tmp_path / "spool"), "idle_interval": "10s", "trigger": "20 seconds"}
    env = dict(os.environ, OFFSET_LEDGER_HEARTBEAT_INTERVAL=f"{EVERY:g}s")
    # The team's thresholds, short: the test passes them as the CLI's options would.
    rules = render_yaml(rules_document(Thresholds(crash_for=CRASH_FOR, lag_seconds=300, lag_for=timedelta(seconds=10),
                                                  ledger_for=timedelta(seconds=10))))
    proc = subprocess.Popen([sys.executable, str(DRIVER), json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    try:
        with serving(pg_dsn, kafka.bootstrap_servers) as srv, prometheus(srv.port, rules, tmp_path / "prom") as prom:
            deadline = time.monotonic() + 150
            while True:  # until the listener recorded a batch of a run that beats
                with ledger.connect() as conn:
                    beating = conn.execute(select(func.count()).select_from(runs).where(
                        runs.c.pipeline == "paged", runs.c.beat_every_ms.is_not(None))).scalar()
                    recorded = conn.execute(select(func.count()).select_from(batches)
                                            .where(batches.c.pipeline == "paged")).scalar()
                if beating and recorded:
                    break
                assert time.monotonic() < deadline and proc.poll() is None, "the driver never recorded a batch"
                time.sleep(0.5)
            while not query(prom, 'offset_ledger_pipeline_state{pipeline="paged",state="running"} == 1'):
                assert time.monotonic() < deadline, "Prometheus never saw the pipeline running"
                time.sleep(0.5)
            # The slow trigger: 25 s spans a 20 s trigger interval with no batch; nothing may page.
            began = time.monotonic()
            while time.monotonic() - began < 25:
                assert proc.poll() is None, "the driver died by itself"
                assert scraped(prom), "Prometheus cannot scrape /metrics"
                assert firing(prom) == [], firing(prom)
                time.sleep(1)
            since = query(prom, 'max_over_time(offset_ledger_seconds_since_last_batch{pipeline="paged"}[30s])')
            print(f"longest silence between batches seen by Prometheus: {since[0]['value'][1]} s; nothing fired")
            assert float(since[0]["value"][1]) > 3 * EVERY + CRASH_FOR.total_seconds()  # longer than the bound

            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            killed = time.monotonic()
            bound = 3 * EVERY + CRASH_FOR.total_seconds() + 2 * EVERY
            while True:
                alerts = [a for a in firing(prom) if a["labels"]["alertname"] == "OffsetLedgerPipelinePresumedCrashed"]
                if alerts:
                    break
                assert time.monotonic() - killed < bound + 30, f"no crash alert {bound + 30:.0f} s after SIGKILL"
                time.sleep(0.2)
            took = time.monotonic() - killed
            print(f"crash alert firing {took:.1f} s after the SIGKILL (documented bound {bound:.0f} s)")
            # The last beat is at most a period before the kill; a scrape takes a moment to build.
            assert took <= bound + 3, (took, bound)
            (alert,) = alerts
            assert alert["labels"] | {"instance": "", "job": ""} == {
                "alertname": "OffsetLedgerPipelinePresumedCrashed", "pipeline": "paged", "consumer_group": "paged",
                "state": "stale", "severity": "critical", "instance": "", "job": ""}
            assert alert["annotations"]["command"] == "offset-ledger pipelines --no-lag"
            assert alert["annotations"]["runbook_url"].endswith("#pipeline-presumed-crashed")
            others = [a["labels"]["alertname"] for a in firing(prom) if a is not alert
                      and a["labels"]["alertname"] != "OffsetLedgerPipelinePresumedCrashed"]
            assert others == []
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out = proc.communicate()[0] if proc.stdout else ""
        print(out[-3000:])


@pytest.mark.long
def test_records_deleted_before_they_were_read_page_records_lost(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """DeleteRecords past the job's unread offsets (failOnDataLoss=false, as test_retention_loss runs it): the
    records-lost alert fires on the partition, with the count the job's own output lacks."""
    from offset_ledger.ledger.engine import ensure_schema, make_engine
    from tests.integration.test_retention_loss import VALUE
    from tests.integration.test_retention_loss import _run as run_losing_job

    engine = make_engine(pg_dsn)
    ensure_schema(engine)
    engine.dispose()
    topic = kafka.create_topic(partitions=1)
    for _ in range(300):
        kafka.producer.send(topic, value=VALUE, partition=0)
    kafka.producer.flush()
    rules = render_yaml(rules_document(Thresholds(lost_window=timedelta(minutes=1))))
    with serving(pg_dsn, kafka.bootstrap_servers) as srv, prometheus(srv.port, rules, tmp_path / "prom") as prom:
        while not scraped(prom):
            time.sleep(0.5)
        assert firing(prom) == []

        def retention(batch_id: int) -> None:
            if batch_id == 1:  # the job stands at 100: retention removes up to 200, unread
                kafka.delete_records(topic, {0: 200})

        read = run_losing_job(spark, pg_dsn, kafka, topic, tmp_path, per_trigger=50, during=retention)
        lost = 300 - len(set(read))
        assert 0 < lost <= 100  # the oracle: what the job's output lacks
        began = time.monotonic()
        first: float | None = None
        counted = f'offset_ledger_records_lost_total{{topic="{topic}"}}'
        while True:
            alerts = [a for a in firing(prom) if a["labels"]["alertname"] == "OffsetLedgerRecordsLost"]
            if alerts and first is None:
                first = time.monotonic() - began
            # It fires at the first lost record. The series it pages on counts the whole loss once the
            # ledger recorded it. The alert's own value is that count only when Prometheus first saw the
            # series whole; a loaded machine scrapes between the batches that record the loss, and then
            # it is increase()'s extrapolation over the window (not a count), so the count is read here.
            total = [float(r["value"][1]) for r in query(prom, counted)]
            if len(alerts) == 1 and total == [lost]:
                break
            assert time.monotonic() - began < 60, \
                f"no records-lost alert with {lost} counted 60 s after the job: {alerts}, counted {total}"
            time.sleep(0.5)
        print(f"records-lost alert firing {first:.1f} s after the job ended, all {lost} lost counted "
              f"{time.monotonic() - began:.1f} s after")
        (alert,) = alerts
        assert {k: alert["labels"][k] for k in ("pipeline", "consumer_group", "topic", "partition", "severity")} == {
            "pipeline": "orders", "consumer_group": "orders", "topic": topic, "partition": "0",
            "severity": "critical"}
        assert float(alert["value"]) > 0
        assert alert["annotations"]["command"] == "offset-ledger verify orders --consumer-group orders"
