"""Issue 53's Done-means: Kafka -> Kafka through ``KafkaSink`` under random SIGKILLs, on a standalone Spark cluster.

A 6-partition input; a Spark standalone master and worker started here from the installed PySpark's
``bin/spark-class`` (stopped by the pids started here); drivers run as subprocesses (``kafka_sink_driver.py``)
and are SIGKILLed while the executors are in their transactions, after Kafka's commits and before the
ledger's, and after the ledger's and before Spark's commit file; executors are SIGKILLed mid-run (the
worker starts new ones, Spark retries the tasks). Restarts alternate between the same checkpoint and an
upgrade on a clean one. Oracles: a ``read_committed`` reader finds every input's output exactly once;
``offset-ledger verify`` exits 0; ``kafka-consumer-groups --describe`` shows the sink's group at the
ledger's positions; Spark's own Kafka sink, fed the same batches in the same runs, holds duplicates.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offset_ledger import devstack
from tests.integration.kafka_sink_helper import ledger_positions, produce_keyed, read_topic
from tests.integration.test_adopt_replay import _cli
from tests.integration.test_restart import _values

DRIVER = Path(__file__).with_name("kafka_sink_driver.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Standalone:
    """A Spark standalone master and one worker (2 cores), from the installed PySpark's ``bin/spark-class``."""

    def __init__(self, root: Path) -> None:
        import pyspark

        home = Path(pyspark.__file__).parent
        self.port, self.ui = _free_port(), _free_port()
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
               "SPARK_LOG_DIR": str(root / "logs"), "SPARK_WORKER_DIR": str(root / "work")}
        cls = str(home / "bin" / "spark-class")
        root.mkdir(parents=True, exist_ok=True)
        self.log = open(root / "cluster.log", "w")  # noqa: SIM115 - closed in stop()
        # Own sessions: each daemon is its process group's leader, the worker's executors in its group.
        self.master = subprocess.Popen([cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                                        str(self.port), "--webui-port", str(self.ui)], env=env, stdout=self.log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"spark://127.0.0.1:{self.port}"
        self.worker = subprocess.Popen([cls, "org.apache.spark.deploy.worker.Worker", self.url, "--cores", "2",
                                        "--memory", "1500m", "--webui-port", str(_free_port()), "--work-dir",
                                        str(root / "work")], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        try:
            self._wait_for_the_worker()
        except BaseException:
            self.stop()  # the daemons started here never outlive a failed start (a first version's did)
            raise

    def _wait_for_the_worker(self) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=2) as r:
                    if json.load(r).get("aliveworkers", 0) >= 1:
                        return
            except (OSError, ValueError):  # not listening yet, or not answering JSON yet
                pass
            time.sleep(0.5)
        raise AssertionError("the standalone worker did not register with its master in 90 s")

    def executors(self) -> list[int]:
        """The executor JVMs the worker started (its children)."""
        out = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                cmd = (stat.parent / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == self.worker.pid and b"CoarseGrainedExecutorBackend" in cmd:
                out.append(int(stat.parent.name))
        return out

    def stop(self) -> None:
        for proc in (self.worker, self.master):
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the group of the pid started here (the worker's executors)
            except ProcessLookupError:
                pass
            proc.wait(30)
        self.log.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Standalone]:
    c = Standalone(tmp_path / "spark")
    try:
        yield c
    finally:
        c.stop()


def _drive(cfg: dict[str, Any], cluster: Standalone, kill_executor_after: float | None,
           timeout: float = 150) -> tuple[int, str, int]:
    """(exit status, output, executors killed) of one driver run."""
    proc = subprocess.Popen([sys.executable, str(DRIVER), json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    killed = [0]

    def kill_executor() -> None:
        assert kill_executor_after is not None
        time.sleep(kill_executor_after)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            pids = cluster.executors()
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed[0] += 1
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_executor, daemon=True) if kill_executor_after is not None else None
    if killer:
        killer.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the driver did not finish in {timeout} s:\n{out[-4000:]}") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the driver's group outlives it
        except ProcessLookupError:
            pass
    if killer:
        killer.join(35)
    return proc.returncode, out, killed[0]


def _kcg_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """CURRENT-OFFSET per partition as ``kafka-consumer-groups --describe`` prints it."""
    out = devstack.consumer_groups_command(bootstrap, "--describe", "--group", group)
    found = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 4 and cols[0] == group and cols[3].isdigit():
            found[(cols[1], int(cols[2]))] = int(cols[3])
    return found


@pytest.mark.long
def test_random_sigkills_of_drivers_and_executors_leave_every_output_once(
        kafka, pg_dsn: str, stack, cluster: Standalone, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("KAFKA_SINK_CRASH_SEED", "53")))
    bootstrap = kafka.bootstrap_servers
    source, out, anchor = (kafka.create_topic(partitions=6) for _ in range(3))
    produced = _values("r", 360)
    produce_keyed(bootstrap, source, produced, 6)
    cfg = {"pipeline": "k2k", "topic": source, "out": out, "anchor": anchor, "bootstrap": bootstrap, "dsn": pg_dsn,
           "checkpoint_root": str(tmp_path / "ck"), "jars": stack.spark_jars, "master": cluster.url,
           "max_per_trigger": 60}
    points: list[list[Any]] = [["write", 2], ["commit", 2], ["after", 1], ["executor", 0], ["write", 1], ["commit", 1]]
    rng.shuffle(points)
    version, runs = 1, []
    started = time.monotonic()
    for n, point in enumerate(points):
        more = _values(f"r{n}-", 120)
        produce_keyed(bootstrap, source, more, 6)
        produced += more
        if n % 2 == 1:
            version += 1  # every other restart is an upgrade on a clean checkpoint
        run_cfg = {**cfg, "app_version": str(version), "delay": rng.uniform(0.2, 1.5)}
        if point[0] != "executor":
            run_cfg["kill_at"] = point
        code, output, killed = _drive(run_cfg, cluster, rng.uniform(14, 22) if point[0] == "executor" else None)
        (tmp_path / f"driver-{n}.log").write_text(output)
        runs.append((version, point, code, killed, [ln for ln in output.splitlines() if ln.startswith("PLAN")]))
        if point[0] == "executor":
            assert code == 0 and "DONE" in output and killed == 1, (runs, output[-4000:])
        else:
            assert code == -signal.SIGKILL and f"KILL {point[0]}" in output, (runs, output[-4000:])
    code, output, _ = _drive({**cfg, "app_version": str(version + 1)}, cluster, None)
    assert code == 0 and "DONE" in output, output[-4000:]

    expected = Counter(f"out-{v}" for v in produced)
    records = read_topic(bootstrap, out)
    assert Counter(r.value().decode() for r in records) == expected, runs  # each output exactly once
    keys = {r.value().decode(): r.key().decode() for r in records}
    assert keys == {f"out-{v}": f"k{i % 5}" for i, v in enumerate(produced)}
    verify = _cli("verify", "k2k", "--dsn", pg_dsn)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    group = f"offset-ledger-sink.k2k:{out}"
    positions = ledger_positions(pg_dsn, "k2k")
    assert _kcg_offsets(bootstrap, group) == positions and sum(positions.values()) == len(produced)
    # The anchor: Spark's own sink on the same batches holds every output at least once, and duplicates.
    spark_sink = Counter(r.value().decode() for r in read_topic(bootstrap, anchor))
    duplicates = sum(c - 1 for c in spark_sink.values())
    assert set(spark_sink) == set(expected) and duplicates > 0
    print(f"KAFKA_SINK_CRASHES records={len(produced)} sink_duplicates=0 spark_kafka_sink_duplicates={duplicates} "
          f"seconds={time.monotonic() - started:.0f} runs={[(v, p, c, k) for v, p, c, k, _ in runs]}")
