"""The failover path on the shared stack, in seconds: checkpoints topic -> plan -> generation -> restart.

The long test (test_failover.py) runs Apache Kafka's MirrorMaker 2 between two clusters of its own.
This one keeps the same path in the default run: the checkpoint records are written in MM2's format
(``encode_checkpoint``, whose layout the unit tests pin byte by byte and the long test reads from
MM2 itself) to a checkpoints topic on the real broker, and the CLI, the ledger and the restart do
the rest for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.engine import Engine

from offset_ledger import start_from_ledger
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.tables import checkpoint_generations, findings
from offset_ledger.rules.failover import Mm2Checkpoint, checkpoints_topic, encode_checkpoint
from tests.integration.test_listener import position_map


CLI = [sys.executable, "-c", "from offset_ledger.cli.main import main; main()"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it (one line and an exit code on errors come from main())."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120)


def _seed(ledger: Engine, pipeline: str, root: str) -> None:
    """A pipeline that read ``orders`` on the old cluster up to 6 and 5 (a generation, as restarts write)."""
    with ledger.begin() as conn:
        gens.create_generation(conn, gens.NewGeneration(
                               pipeline=pipeline, consumer_group=pipeline, checkpoint_root=root,
                               app_version="1", reason="first", starting_offsets={"orders": {"0": 6, "1": 5}},
                               resolved_offsets={"orders": {"0": 6, "1": 5}}))


def test_failover_cli_refuses_uncheckpointed_partitions_then_records_the_generation(
        kafka, ledger: Engine, tmp_path: Path) -> None:
    dsn = ledger.url.render_as_string(hide_password=False)
    alias = f"dc{uuid.uuid4().hex[:6]}"
    target = kafka.create_topic(2, name=f"{alias}.orders")
    kafka.produce(target, [f"v{i}" for i in range(10)])  # 5 per partition on the "backup"
    cps = kafka.create_topic(1, name=checkpoints_topic(alias))
    pipeline = f"fos_{uuid.uuid4().hex[:6]}"
    # MM2 translated partition 0 conservatively (upstream 6 -> downstream 4); partition 1 not yet.
    for cp in (Mm2Checkpoint("someone-else", target, 1, 3, 3, ""), Mm2Checkpoint(pipeline, target, 0, 6, 4, "m")):
        key, value = encode_checkpoint(cp)
        kafka.producer.send(cps, key=key, value=value)
    kafka.producer.flush()
    root = str(tmp_path / "checkpoints")
    _seed(ledger, pipeline, root)
    base = ["failover", pipeline, "--to-bootstrap", kafka.bootstrap_servers, "--source-alias", alias, "--dsn", dsn]

    bad = _cli(*base, "--uncheckpointed", "later")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr

    refused = _cli(*base)
    print(refused.stderr)
    assert refused.returncode == 3, refused.stderr
    assert f"{target}:1 (no_checkpoint)" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert position_map(ledger, pipeline) == {("orders", 0): 6, ("orders", 1): 5}  # nothing written

    dry = _cli(*base, "--uncheckpointed", "earliest", "--dry-run", "-f", "json")
    assert dry.returncode == 0, dry.stderr
    doc = json.loads(dry.stdout)
    assert doc["dryRun"] and doc["generation"] is None and doc["checkpointLocation"] is None
    assert doc["startingOffsets"] == {target: {"0": 4, "1": 0}} and doc["rereadMax"] == 6
    assert [(p["partition"], p["reason"]) for p in doc["problems"]] == [(1, "no_checkpoint")]
    assert position_map(ledger, pipeline) == {("orders", 0): 6, ("orders", 1): 5}  # still nothing written

    done = _cli(*base, "--uncheckpointed", "earliest", "--execute")
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    assert f'startingOffsets: {{"{target}":{{"0":4,"1":0}}}}' in done.stdout
    assert position_map(ledger, pipeline) == {(target, 0): 4, (target, 1): 0}
    with ledger.connect() as conn:
        gen = conn.execute(select(checkpoint_generations).where(checkpoint_generations.c.pipeline == pipeline)
                           .order_by(checkpoint_generations.c.generation.desc())).first()
        stored = conn.execute(select(findings.c.kind, findings.c.details).where(
            findings.c.pipeline == pipeline, findings.c.generation_id == gen.id)).all()
    assert gen.reason == "failover" and set(gen.topic_ids) == {target}
    assert [k for k, _ in stored] == ["failover", "failover"]
    summary = stored[0].details
    # at most 1 record again on partition 0 (5 - 4) and all 5 of partition 1 (read from the log start)
    assert summary["reread_max"] == 6 and summary["target_cluster_id"]

    # A restart on the backup resumes the failover generation at the same offsets.
    plan = start_from_ledger(pipeline, [target], bootstrap_servers=kafka.bootstrap_servers, dsn=dsn,
                             checkpoint_root=root, app_version="1")
    assert plan.checkpoint_location == gen.location and not plan.fresh_checkpoint
    assert plan.starting_offsets == {target: {"0": 4, "1": 0}}
