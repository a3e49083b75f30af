"""Every Kafka-facing command and the restart reach a SASL-secured broker through the one client
configuration (--command-config, --kafka-option, OFFSET_LEDGER_KAFKA_*), and fail fast without it.

The devstack's broker has a SASL_PLAINTEXT listener (PLAIN) beside its plain one; the oracle is
the plain listener of the same broker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka import KafkaAdminClient

from offset_ledger import devstack, start_from_ledger
from offset_ledger.errors import KafkaUnavailable
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.queries import current_positions
from tests.ops_seed import seed_pipeline

CLI = [sys.executable, "-c", "from offset_ledger.cli.main import main; main()"]
# A SASL listener beside the plain one: ~40 s, so ./scripts/test --long (CI runs it).
pytestmark = pytest.mark.long
# Without credentials a client waits this long for the broker before exit code 5 (not a hang).
FAST = "3000"


@pytest.fixture
def sasl(stack: devstack.StackInfo) -> str:
    if not stack.sasl_bootstrap_servers:
        pytest.fail("the stack has no SASL listener (OFFSET_LEDGER_TEST_SASL_BOOTSTRAP_SERVERS)", pytrace=False)
    return stack.sasl_bootstrap_servers


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120)


def positions(pg_dsn: str, pipeline: str) -> dict[int, int]:
    engine = make_engine(pg_dsn)
    try:
        with engine.connect() as conn:
            return {p.partition: p.next_offset for p in current_positions(conn, pipeline)}
    finally:
        engine.dispose()


def test_commands_and_restart_on_a_sasl_listener(pg_dsn: str, kafka, sasl: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(40)])  # 20 per partition, via the plain listener
    engine = make_engine(pg_dsn)
    upgrade(engine)
    seed_pipeline(engine, "etl", {topic: {0: 12, 1: 18}}, n_batches=3)
    engine.dispose()
    props = devstack.sasl_client_properties()
    config = tmp_path / "client.properties"
    config.write_text("# as kafka-consumer-groups --command-config takes it\n"
                      + "".join(f"{k}={v}\n" for k, v in props.items()))
    base = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    env = dict(base, OFFSET_LEDGER_DSN=pg_dsn, OFFSET_LEDGER_BOOTSTRAP_SERVERS=sasl)
    env_secured = dict(env, **{"OFFSET_LEDGER_KAFKA_" + k.upper().replace(".", "_"): v for k, v in props.items()})
    options = [x for k, v in props.items() for x in ("--kafka-option", f"{k}={v}")]

    # pipelines: lag needs Kafka; without credentials it degrades to unknown, with them it is there.
    r = run(env, "pipelines", "--format", "json", "--timeout", FAST)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["lag"] is None
    r = run(env, "pipelines", "--format", "json", "--command-config", str(config))
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["lag"] == (20 - 12) + (20 - 18)

    # lag, through --kafka-option; the oracle is the plain listener's log-end offsets.
    r = run(env, "lag", "etl", "--format", "json", *options)
    assert r.returncode == 0, r.stderr
    ends = kafka.end_offsets(topic)
    assert [(x["partition"], x["logEndOffset"], x["lag"]) for x in json.loads(r.stdout)] == [
        (0, ends[0], ends[0] - 12), (1, ends[1], ends[1] - 18)]

    # topic and replay, through OFFSET_LEDGER_KAFKA_* alone.
    r = run(env_secured, "topic", topic, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["partitions"] == {"0": {"logStartOffset": 0, "logEndOffset": 20},
                                                  "1": {"logStartOffset": 0, "logEndOffset": 20}}
    r = run(env_secured, "replay", "etl", "--batch", "2", "--format", "json")
    assert r.returncode == 0, r.stderr
    replay = json.loads(r.stdout)
    assert replay["retentionChecked"] is True
    assert replay["endingOffsets"] == {topic: {"0": 12, "1": 18}} and not replay["warnings"]
    # replay degrades without Kafka (the range is the ledger's), and says retention went unchecked.
    r = run(env, "replay", "etl", "--batch", "2", "--format", "json", "--timeout", FAST)
    assert r.returncode == 0, r.stderr
    unchecked = json.loads(r.stdout)
    assert unchecked["retentionChecked"] is False and "security.protocol" in unchecked["warnings"][-1]

    # mirror: the group's committed offsets, read back over the plain listener, are the ledger's.
    r = run(env, "mirror", "etl", "--command-config", str(config))
    assert r.returncode == 0, r.stderr
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        committed = admin.list_group_offsets({"etl": None})["etl"]
    finally:
        admin.close()
    assert {tp.partition: om.offset for tp, om in committed.items() if tp.topic == topic} == {0: 12, 1: 18}

    # reset through the file, then a restart through the Python API with Spark-style options.
    r = run(env, "reset", "etl", "--to-latest", "--execute", "--reason", "test", "--command-config", str(config))
    assert r.returncode == 0, r.stderr
    assert positions(pg_dsn, "etl") == {0: 20, 1: 20}
    plan = start_from_ledger("etl", [topic], bootstrap_servers=sasl, checkpoint_root=str(tmp_path / "ckpt"),
                             dsn=pg_dsn, kafka_options={f"kafka.{k}": v for k, v in props.items()})
    assert plan.starting_offsets == {topic: {"0": 20, "1": 20}} and plan.fresh_checkpoint

    # Without credentials (or with a wrong password): exit code 5, one line, within the timeout.
    wrong = devstack.sasl_client_properties(password="wrong")
    for args, environment in (
        (["lag", "etl"], env), (["topic", topic], env),
        (["mirror", "etl"], env), (["reset", "etl", "--to-earliest"], env),
        (["lag", "etl", *[x for k, v in wrong.items() for x in ("-o", f"{k}={v}")]], env),
    ):
        started = time.monotonic()
        r = run(environment, *args, "--timeout", FAST)
        assert r.returncode == 5, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("offset-ledger: error: cannot reach Kafka") and r.stderr.count("\n") == 1
        assert "security.protocol" in r.stderr
        assert time.monotonic() - started < 30, args
    assert positions(pg_dsn, "etl") == {0: 20, 1: 20}  # the refused reset wrote nothing
    with pytest.raises(KafkaUnavailable):
        start_from_ledger("etl", [topic], bootstrap_servers=sasl, checkpoint_root=str(tmp_path / "ckpt"),
                          dsn=pg_dsn)


def test_serve_reaches_the_sasl_listener_with_a_command_config(pg_dsn: str, kafka, sasl: str,  # type: ignore[no-untyped-def]
                                                               tmp_path: Path) -> None:
    import httpx

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(10)])
    upgrade(make_engine(pg_dsn))
    config = tmp_path / "client.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in devstack.sasl_client_properties().items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    env.update(OFFSET_LEDGER_DSN=pg_dsn, OFFSET_LEDGER_BOOTSTRAP_SERVERS=sasl)
    port = devstack.free_port()
    proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--log-level", "warning", "--command-config",
                             str(config)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "serve did not come up"
                time.sleep(0.2)
        answer = httpx.get(f"http://127.0.0.1:{port}/v1/getTopicDetails/", params={"topicName": topic}, timeout=30)
        assert answer.status_code == 200, answer.text
        ends = kafka.end_offsets(topic)
        assert answer.json()["partitions"] == {str(p): {"firstOffset": 0, "lastOffset": e} for p, e in ends.items()}
    finally:
        proc.terminate()
        proc.wait(15)


def test_a_spark_pipeline_on_the_sasl_listener_records_and_restarts(spark, pg_dsn: str, kafka, sasl: str,  # type: ignore[no-untyped-def]
                                                                    tmp_path: Path) -> None:
    """The options the job gives Spark's reader are the options start_from_ledger takes: one dict."""
    from offset_ledger import OffsetLedgerListener

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"a{i}" for i in range(30)])  # 15 per partition
    reader_options = {"kafka.bootstrap.servers": sasl,
                      **{f"kafka.{k}": v for k, v in devstack.sasl_client_properties().items()}}
    root = str(tmp_path / "ckpt")
    plan = start_from_ledger("secure", [topic], checkpoint_root=root, dsn=pg_dsn, kafka_options=reader_options)
    assert plan.starting_offsets == {topic: {"0": -2, "1": -2}}

    seen: list[str] = []
    listener = OffsetLedgerListener(dsn=pg_dsn, pipeline="secure", spool_dir=tmp_path / "spool")
    spark.streams.addListener(listener)
    try:
        query = (spark.readStream.format("kafka").options(**reader_options).option("subscribe", topic)
                 .option("startingOffsets", plan.starting_offsets_json).load()
                 .writeStream.foreachBatch(lambda df, _id: seen.extend(
                     r.value for r in df.selectExpr("CAST(value AS STRING) AS value").collect()))
                 .option("checkpointLocation", plan.checkpoint_location).trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(180) and query.exception() is None
            (source,) = [s for s in query.lastProgress["sources"] if s["description"].startswith("KafkaV2")]
        finally:
            query.stop()
        assert listener.flush(60), listener.health()
    finally:
        spark.streams.removeListener(listener)
        listener.close()
    end = source["endOffset"]
    end = json.loads(end) if isinstance(end, str) else end
    assert sorted(seen) == sorted(f"a{i}" for i in range(30))
    assert positions(pg_dsn, "secure") == {int(p): o for p, o in end[topic].items()} == {0: 15, 1: 15}

    kafka.produce(topic, [f"b{i}" for i in range(10)])
    again = start_from_ledger("secure", [topic], checkpoint_root=root, dsn=pg_dsn, kafka_options=reader_options)
    assert again.starting_offsets == {topic: {"0": 15, "1": 15}} and not again.fresh_checkpoint
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    env.update(OFFSET_LEDGER_DSN=pg_dsn, OFFSET_LEDGER_BOOTSTRAP_SERVERS=sasl,
               **{"OFFSET_LEDGER_KAFKA_" + k.upper().replace(".", "_"): v
                  for k, v in devstack.sasl_client_properties().items()})
    r = run(env, "lag", "secure", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert sum(x["lag"] for x in json.loads(r.stdout)) == 10
