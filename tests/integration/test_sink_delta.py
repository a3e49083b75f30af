"""The Delta sink on the real stack, including the batch-id-restart trap of a plain ``txnVersion=batchId`` writer.

delta-spark must support the PySpark that runs the driver: delta-spark 4.4.1 (PySpark 4.2) is not
served by Maven Central here, delta-spark_2.13 4.0.0 is, so the driver runs in the PySpark 4.0.0
venv of the compatibility matrix (``.venv-pyspark-4.0.0``, or ``OFFSET_LEDGER_DELTA_PYTHON``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.integration.test_restart import _values

ROOT = Path(__file__).resolve().parents[2]
DELTA = "4.0.0"


def _delta_python() -> str:
    python = os.environ.get("OFFSET_LEDGER_DELTA_PYTHON") or str(ROOT / ".venv-pyspark-4.0.0" / "bin" / "python")
    if not Path(python).exists():
        message = f"no interpreter with PySpark 4.0 for delta-spark {DELTA} ({python}); ./scripts/test --long makes it"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return python


def _delta_jars() -> list[str]:
    repo = Path.home() / ".m2" / "repository" / "io" / "delta"
    jars = [repo / "delta-spark_2.13" / DELTA / f"delta-spark_2.13-{DELTA}.jar",
            repo / "delta-storage" / DELTA / f"delta-storage-{DELTA}.jar"]
    if not all(j.exists() for j in jars):
        subprocess.run(["mvn", "-q", "-B", "dependency:get", f"-Dartifact=io.delta:delta-spark_2.13:{DELTA}"],
                       check=True, capture_output=True, timeout=600)
    return [str(j) for j in jars]


def _drive(python: str, cfg: dict) -> dict:  # type: ignore[type-arg]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([python, str(ROOT / "tests" / "integration" / "delta_driver.py"), json.dumps(cfg)],
                          capture_output=True, text=True, timeout=900, env=env, check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.stdout[-3000:], done.stderr[-5000:])
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.long
def test_the_delta_sink_keeps_every_record_once_where_a_batch_id_txn_writer_loses_the_upgrade(
        kafka, pg_dsn: str, tmp_path: Path) -> None:
    python = _delta_python()
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 40))
    cfg = {"topic": topic, "bootstrap": kafka.bootstrap_servers, "dsn": pg_dsn, "root": str(tmp_path),
           "delta_jars": _delta_jars(), "more": 40}
    result = _drive(python, cfg)
    produced = Counter(_values("a", 40) + _values("b", 40))
    assert result["ok"] == {"sink_1": False, "plain_1": True, "sink_2": True, "plain_2": True}
    # The oracle: every record of the topic exactly once through the sink ...
    assert Counter(result["sink"]) == produced
    assert "sink_reconciled" in result["findings"]["delta_sink:2"]
    # ... while the plain writer's new generation reused txn versions Delta had seen: rows lost.
    plain = Counter(result["plain"])
    assert set(plain.values()) == {1} and set(_values("a", 40)) <= set(plain)
    assert sum(plain.values()) <= 80 - 30, plain  # at least generation 2's batches 0-2 were dropped as "seen"
    engine = create_engine(pg_dsn)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT sequence, generation, table_version, row_count FROM v_batch_outputs "
                                 "WHERE sink_kind = 'delta' ORDER BY sequence")).all()
    engine.dispose()
    assert [r.sequence for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 8
    assert [r.table_version for r in rows] == list(range(len(rows)))  # "which input made version N": one query
    assert sum(r.row_count for r in rows) == 80


@pytest.mark.long
def test_a_delta_txn_collision_is_refused_and_never_recorded_as_the_live_batchs_commit(
        kafka, pg_dsn: str, tmp_path: Path) -> None:
    python = _delta_python()
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 40))
    result = _drive(python, {"scenario": "collision", "topic": topic, "bootstrap": kafka.bootstrap_servers,
                             "dsn": pg_dsn, "root": str(tmp_path), "delta_jars": _delta_jars(), "more": 40})
    # 1 died between Delta's 3rd commit and the ledger's; 2 (no sinks=[sink], bigger batches) met
    # sequence 3 held by generation 1's batch 2: refused, loudly, instead of recorded as its own.
    assert result["ok"] == {"1": False, "2": False, "3": True}, result
    refusal = [m for m in result["raised"]["2"] if m.startswith("SinkFenced")]
    assert refusal and refusal[0].startswith("SinkFenced: sink 'delta_col:"), result
    assert "table version 2 carries txn (delta_col:" in refusal[0] and ", 3) but was written by sink" in refusal[0]
    assert "batch 2 of generation 1" in refusal[0] and "not by batch 0 of generation 2" in refusal[0]
    # The oracle: the table holds generation 1's three batches once and nothing of the skipped write.
    assert sum(result["sink"].values()) == 30 and set(result["sink"].values()) == {1}
    assert not any(v.startswith("b") for v in result["sink"])
    engine = create_engine(pg_dsn)
    with engine.connect() as conn:
        def outputs() -> list:  # type: ignore[type-arg]
            return [tuple(r) for r in conn.execute(text(
                "SELECT sequence, generation, batch_id, table_version, row_count FROM v_batch_outputs "
                "ORDER BY sequence"))]
        rows = outputs()
    engine.dispose()
    # Never recorded as generation 2's commit: sequence 3 is generation 1's batch 2 (table version
    # 2), recorded by the reconciling restart's plan from the Delta log.
    assert "sink_reconciled" in result["findings"]["3"]
    assert [r[:4] for r in rows][:3] == [(1, 1, 0, 0), (2, 1, 1, 1), (3, 1, 2, 2)]
    # ... and the recovery's batches follow on generation 3 (the fresh one), 80 rows in all.
    assert {r[1] for r in rows[3:]} == {3} and [r[0] for r in rows] == list(range(1, len(rows) + 1))
    assert sum(r[4] for r in rows) == 80
    assert "plans from where that version's batch ended" in refusal[0]
    # The recovery: version 2's batch belongs to generation 1, not the authority, so recording it
    # moves no position; the plan moves past what the table holds (30 of the first 40 records) on
    # a fresh checkpoint, and the run writes each record of the topic once.
    print("REFUSAL", refusal[0], "\nSINK_AHEAD", result["plans"]["3"]["messages"].get("sink_ahead"))  # docs/sinks.md
    assert "sink_ahead" in result["findings"]["3"] and result["plans"]["3"]["fresh"], result["plans"]["3"]
    assert result["plan_3"] == {"0": 15, "1": 15}, result["plans"]
    assert "table version 2, batch 2 of generation 1" in result["plans"]["3"]["messages"]["sink_ahead"]
    assert result["ok"]["3"] and not result["raised"]["3"], result
    assert Counter(result["after"]) == Counter(_values("a", 40) + _values("b", 40)), result["after"]


@pytest.mark.long
def test_a_zombie_committing_after_the_upgrade_is_refused_and_every_record_lands_once(
        kafka, pg_dsn: str, tmp_path: Path) -> None:
    python = _delta_python()
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 40))
    result = _drive(python, {"scenario": "zombie", "topic": topic, "bootstrap": kafka.bootstrap_servers,
                             "dsn": pg_dsn, "root": str(tmp_path), "delta_jars": _delta_jars(), "more": 40})
    # Generation 1 ran to the end; its driver, not stopped, wrote batch 4 after the upgrade opened
    # generation 2, and its next batch was fenced.
    assert result["ok"] == {"1": True, "zombie": False, "2": False, "3": True}, result
    assert any("is not the pipeline's current checkpoint generation" in m for m in result["raised"]["zombie"])
    # Generation 2's batch 0 would have written the zombie's records again: refused, nothing written.
    (refusal,) = result["raised"]["2"]
    print("LATE", refusal, "\nSINK_AHEAD", result["plans"]["3"]["findings"].get("sink_ahead"))  # docs/sinks.md
    assert refusal.startswith("SinkFenced: sink 'delta_zom:") and "batch 4 of generation 1" in refusal, refusal
    assert "after this generation opened at 20" in refusal and "sink_ahead" in refusal, refusal
    # The restart plans from where the zombie's batch ended, on a fresh checkpoint.
    assert result["plans"]["2"]["offsets"] == {"0": 20, "1": 20}
    assert result["plans"]["3"]["offsets"] == {"0": 25, "1": 25} and result["plans"]["3"]["fresh"], result["plans"]
    assert "sink_ahead" in result["plans"]["3"]["findings"]
    # The oracle: every record of the topic in the table exactly once.
    assert Counter(result["sink"]) == Counter(_values("a", 40) + _values("b", 40)), result["sink"]

