"""``offset-ledger plan`` previews an upgrade exactly as ``start_from_ledger`` then makes it, and writes
nothing (issue 50, item 3). Real Kafka and Postgres; ``start_from_ledger`` plans without Spark.

The oracle is the restart itself: after each preview, ``start_from_ledger`` with the same arguments
runs, and its plan (fresh or resumed, generation, location, startingOffsets, findings, cost) must be
the preview's. Every ledger table is dumped before and after each preview and compared row by row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import select, text, update

from offset_ledger import start_from_ledger
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.tables import metadata, positions
from offset_ledger.rules.plan import RestartPlan
from offset_ledger.operate.answers import move_cost_answer

CLI = [sys.executable, "-c", "from offset_ledger.cli.main import main; main()"]


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120)


def _dump(dsn: str) -> dict[str, list[str]]:
    """Every row of every ledger table (and the schema revision), as text, in a stable order."""
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            out = {t.name: sorted(repr(tuple(r)) for r in conn.execute(select(t))) for t in metadata.sorted_tables}
            out["alembic_version"] = [str(v) for v in conn.execute(text("SELECT version_num FROM alembic_version"))]
            return out
    finally:
        engine.dispose()


def _compare(preview: dict[str, Any], done: RestartPlan) -> None:
    ck = preview["checkpoint"]
    assert ck["fresh"] == done.fresh_checkpoint and ck["generation"] == done.generation
    if done.fresh_checkpoint:  # the new directory's id is drawn when the generation is written
        assert ck["location"].replace("<new id>", "") == done.checkpoint_location[:-8], (ck, done)
    else:
        assert ck["location"] == done.checkpoint_location
    assert preview["startingOffsets"] == {t: dict(p) for t, p in done.starting_offsets.items()}
    assert preview["consumerGroup"] == done.consumer_group
    assert [(f["kind"], f["topic"], f["partition"], f["message"]) for f in preview["findings"]] == \
        [(f.kind, f.topic, f.partition, f.message) for f in done.findings]
    expected = move_cost_answer(done.cost) if done.cost is not None else None
    assert preview["cost"] == expected


def test_plan_previews_the_upgrade_start_from_ledger_makes(  # type: ignore[no-untyped-def]
        pg_dsn: str, kafka, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(60)])  # 30 per partition
    engine = make_engine(pg_dsn)
    upgrade(engine)
    engine.dispose()
    root = str(tmp_path / "checkpoints")
    args = {"bootstrap_servers": kafka.bootstrap_servers, "checkpoint_root": root, "dsn": pg_dsn}
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    env.update(OFFSET_LEDGER_DSN=pg_dsn, OFFSET_LEDGER_BOOTSTRAP_SERVERS=kafka.bootstrap_servers)

    # An unknown pipeline: refused with what exists, unless --first-run says where it starts.
    r = _run(env, "plan", "orders", "--app-version", "1.0", "--checkpoint-root", root, "--topic", topic)
    assert r.returncode == 2 and "unknown pipeline 'orders'" in r.stderr, r.stderr
    before = _dump(pg_dsn)
    r = _run(env, "plan", "orders", "--app-version", "1.0", "--checkpoint-root", root, "--topic", topic,
             "--first-run", "earliest", "-f", "json")
    assert r.returncode == 0, r.stderr
    assert _dump(pg_dsn) == before
    _compare(json.loads(r.stdout), start_from_ledger("orders", [topic], app_version="1.0", first_run="earliest",
                                                     **args))

    # Version 1 read some of it (its positions, as its listener leaves them); the topic grows while it is down.
    engine = make_engine(pg_dsn)
    with engine.begin() as conn:
        for partition, offset in ((0, 12), (1, 17)):
            conn.execute(update(positions).where(positions.c.pipeline == "orders", positions.c.topic == topic,
                                                 positions.c.partition == partition).values(next_offset=offset))
    engine.dispose()
    kafka.add_partitions(topic, 3)
    kafka.produce(topic, [f"w{i}" for i in range(5)], partition=2)

    r = _run(env, "plan", "ordrs", "--app-version", "2.0", "--checkpoint-root", root, "--topic", topic)
    assert r.returncode == 2 and "did you mean 'orders'" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = _run(env, "resolve", "ordrs", "--topic", topic)  # the same typo: no replay-everything plan, exit 2
    assert r.returncode == 2 and "did you mean 'orders'" in r.stderr and r.stdout == "", r.stderr

    # The upgrade: a fresh generation 2, from the ledger's positions, the new partition from earliest.
    before = _dump(pg_dsn)
    r = _run(env, "plan", "orders", "--app-version", "2.0", "--checkpoint-root", root, "--topic", topic,
             "-f", "json")
    assert r.returncode == 0, r.stderr
    preview = json.loads(r.stdout)
    table = _run(env, "plan", "orders", "--app-version", "2.0", "--checkpoint-root", root, "--topic", topic)
    assert _dump(pg_dsn) == before, "plan wrote to the ledger"
    assert preview["checkpoint"]["fresh"] and preview["checkpoint"]["reason"] == "app_version"
    assert preview["startingOffsets"] == {topic: {"0": 12, "1": 17, "2": -2}}
    assert "FRESH checkpoint generation 2" in table.stdout and "app version changes from 1.0 to 2.0" in table.stdout
    done = start_from_ledger("orders", [topic], app_version="2.0", **args)
    _compare(preview, done)
    assert any(f.kind == "new_partition" for f in done.findings)

    # Started again unchanged: the preview says it resumes generation 2 where the restart does.
    before = _dump(pg_dsn)
    r = _run(env, "plan", "orders", "--app-version", "2.0", "--checkpoint-root", root, "--topic", topic,
             "-f", "json")
    assert r.returncode == 0 and _dump(pg_dsn) == before, r.stderr
    preview = json.loads(r.stdout)
    assert preview["checkpoint"]["fresh"] is False
    _compare(preview, start_from_ledger("orders", [topic], app_version="2.0", **args))

    # A pending reset: the preview names it and its consumption, as the restart then reports it.
    r = _run(env, "reset", "orders", "--to-earliest", "--topic", topic, "--execute", "--reason", "replay")
    assert r.returncode == 0, r.stderr
    before = _dump(pg_dsn)
    r = _run(env, "plan", "orders", "--app-version", "2.0", "--checkpoint-root", root, "--topic", topic,
             "-f", "json")
    assert r.returncode == 0 and _dump(pg_dsn) == before, r.stderr
    preview = json.loads(r.stdout)
    assert preview["checkpoint"]["reason"] == "reset" and preview["pendingResets"]
    _compare(preview, start_from_ledger("orders", [topic], app_version="2.0", **args))
