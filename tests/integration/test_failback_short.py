"""Failing back on the shared stack, in seconds: refused specifically, then from the original topic's log start.

The long test (test_failback.py) shows what MirrorMaker 2 does backup -> primary: no checkpoint of
the pipeline's group on ``primary.<topic>``, ever. Here the pipeline sits on ``<alias>.orders``
(its failover replica) and fails back to ``orders`` on the real broker, where no reverse MM2 flow
ever ran; the CLI, the ledger and the restart are real.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from sqlalchemy.engine import Engine

from offset_ledger import start_from_ledger
from offset_ledger.ledger import generations as gens
from tests.integration.test_failover_short import _cli
from tests.integration.test_listener import position_map


def test_failing_back_is_refused_by_name_then_starts_the_original_topic_at_its_log_start(
        kafka, ledger: Engine, tmp_path: Path) -> None:
    dsn = ledger.url.render_as_string(hide_password=False)
    home = f"pr{uuid.uuid4().hex[:6]}"  # the primary's MM2 alias
    topic = kafka.create_topic(2, name=f"orders_{uuid.uuid4().hex[:6]}")
    kafka.produce(topic, [f"v{i}" for i in range(10)])
    pipeline = f"fbs_{uuid.uuid4().hex[:6]}"
    root = str(tmp_path / "checkpoints")
    with ledger.begin() as conn:  # the pipeline after its failover: on the backup's replica of the topic
        gens.create_generation(conn, gens.NewGeneration(
                               pipeline=pipeline, consumer_group=pipeline, checkpoint_root=root,
                               app_version="1", reason="failover", starting_offsets={f"{home}.{topic}": {"0": 3, "1": 4}},
                               resolved_offsets={f"{home}.{topic}": {"0": 3, "1": 4}}))
    base = ["failover", pipeline, "--to-bootstrap", kafka.bootstrap_servers, "--source-alias", f"bk{home[2:]}",
            "--target-alias", home, "--dsn", dsn]

    refused = _cli(*base)
    print(refused.stderr)
    assert refused.returncode == 3 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"does not translate offsets on {home}.{topic}:0, {home}.{topic}:1" in refused.stderr
    assert "waiting does not help" in refused.stderr
    assert position_map(ledger, pipeline) == {(f"{home}.{topic}", 0): 3, (f"{home}.{topic}", 1): 4}

    done = _cli(*base, "--uncheckpointed", "earliest", "-f", "json", "--execute")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["topics"] == [topic] and doc["generation"] == 2
    assert doc["startingOffsets"] == {topic: {"0": 0, "1": 0}} and doc["rereadMax"] == 10
    assert [p["reason"] for p in doc["problems"]] == ["not_translated_back"] * 2
    assert position_map(ledger, pipeline) == {(topic, 0): 0, (topic, 1): 0}

    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=kafka.bootstrap_servers, dsn=dsn,
                             checkpoint_root=root, app_version="1")
    assert plan.checkpoint_location == doc["checkpointLocation"] and not plan.fresh_checkpoint
    assert plan.starting_offsets == {topic: {"0": 0, "1": 0}}
