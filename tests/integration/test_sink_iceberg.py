"""The Iceberg sink on the real stack: random SIGKILLs across a clean-checkpoint upgrade, every record once.

Iceberg's Spark runtime is built per Spark line and Maven Central serves
``iceberg-spark-runtime-4.1_2.13`` 1.12.0 here (none for Spark 4.2 yet), so the driver runs in the
PySpark 4.1.1 venv of the compatibility matrix (``.venv-pyspark-4.1.1``, or
``OFFSET_LEDGER_ICEBERG_PYTHON``) with a Hadoop catalog in a local warehouse directory. The oracle
is the topic: every value produced is unique and the table must hold each exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from offset_ledger import devstack
from tests.integration.test_restart import _values

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("iceberg_driver.py")


def _iceberg_python() -> str:
    python = os.environ.get("OFFSET_LEDGER_ICEBERG_PYTHON") or str(ROOT / ".venv-pyspark-4.1.1" / "bin" / "python")
    if not Path(python).exists():
        message = (f"no interpreter with PySpark 4.1 for iceberg-spark-runtime-4.1 ({python}); "
                   "./scripts/test --long makes it")
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    devstack.iceberg_spark_jars()  # resolved here, not inside a driver the test may kill
    return python


def _drive(python: str, cfg: dict[str, Any], timeout: float = 600) -> tuple[int, str]:
    """(exit status, output) of one driver run in its own process group; negative: the signal."""
    proc = subprocess.Popen([python, str(DRIVER), json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the group (its JVM) outlives the run
        except ProcessLookupError:
            pass
    return proc.returncode, out


def _result(out: str) -> dict[str, Any]:
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    assert lines, out[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT "))  # type: ignore[no-any-return]


@pytest.mark.long
def test_random_sigkills_across_an_upgrade_keep_every_record_once_where_a_batch_id_key_loses_records(
        kafka, pg_dsn: str, tmp_path: Path) -> None:
    python = _iceberg_python()
    rng = random.Random(int(os.environ.get("SINK_CRASH_SEED", "37")))
    topic = kafka.create_topic(partitions=2)
    produced = _values("a", 40)
    kafka.produce(topic, produced)
    cfg = {"topic": topic, "bootstrap": kafka.bootstrap_servers, "dsn": pg_dsn, "root": str(tmp_path / "ck"),
           "warehouse": str(tmp_path / "warehouse")}
    # Three runs killed at each point once, in a random order at a random batch; each on the same
    # checkpoint or on a clean one (an upgrade, at least once), with 20 more records before each.
    points = ["write", "commit", "after"]
    rng.shuffle(points)
    upgrades = [True, *(rng.random() < 0.5 for _ in points[1:])]
    rng.shuffle(upgrades)
    version, kills = 1, []
    for n, (point, upgrade) in enumerate(zip(points, upgrades)):
        more = _values(f"k{n}-", 20)
        produced += more
        version += int(upgrade and n > 0)
        kill_at = [point, rng.randint(1, 2)]
        code, out = _drive(python, {**cfg, "runs": [{"kind": "sink", "app_version": str(version),
                                                     "kill_at": kill_at, "produce": more}]})
        kills.append((version, kill_at, code, [x for x in out.splitlines() if x.startswith(("PLAN", "BATCH"))]))
        if n > 0 and points[n - 1] == "commit":  # the table is ahead of the ledger: the restart records it
            assert any(x.startswith("FINDINGS") and '"sink_reconciled"' in x for x in out.splitlines()), kills
        assert code == -signal.SIGKILL and f"KILL {point}" in out, (kills, out[-4000:])
    # An upgrade to the end of the topic; then the contrast: the plain batch-id writer, to the end,
    # more records, and its upgrade (batch ids from 0 again).
    more = _values("z", 20)
    produced += more
    code, out = _drive(python, {**cfg, "runs": [
        {"kind": "sink", "app_version": str(version + 1), "produce": more},
        {"kind": "plain", "app_version": "1"},
        {"kind": "plain", "app_version": "2", "produce": _values("p", 40)}]})
    assert code == 0, out[-4000:]
    result = _result(out)
    # The oracle: every record of the topic exactly once through the sink ...
    trace = [x for x in out.splitlines() if x.startswith(("PLAN", "BATCH", "PLAIN"))]
    assert Counter(result["sink"]) == Counter(produced), (kills, trace, result["findings"],
                                                          [s for _, s in result["snapshots"]][-2:])
    # ... while the plain writer's upgrade skipped batch ids the table had: its first batches lost.
    plain = Counter(result["plain"])
    assert set(plain.values()) == {1} and set(produced) <= set(plain)
    assert set(plain) == set(produced) and all(f"PLAIN {n} skip" in out for n in range(4))
    engine = create_engine(pg_dsn)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT sequence, generation, table_version, row_count FROM v_batch_outputs "
                                 "WHERE sink_kind = 'iceberg' ORDER BY sequence")).all()
    engine.dispose()
    # v_batch_outputs names each batch's snapshot: the table's own, in the same order.
    assert [r.sequence for r in rows] == list(range(1, len(rows) + 1))
    ours = [(sid, s) for sid, s in result["snapshots"] if "offset-ledger.sequence" in s]
    assert [r.table_version for r in rows] == [sid for sid, _ in ours]
    assert [int(s["offset-ledger.sequence"]) for _, s in ours] == [r.sequence for r in rows]
    assert sum(r.row_count for r in rows) == len(produced)
    assert len({r.generation for r in rows}) >= 2
    print("KILLS", kills, "\nOUTPUTS", [tuple(r) for r in rows], "\nSUMMARY", json.dumps(ours[-1][1]),
          "\nFINDINGS", result["findings"])  # docs/sinks.md quotes these
