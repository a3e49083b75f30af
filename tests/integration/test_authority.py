"""Which run is authoritative, on the real stack: the operator mistakes and events of issue 9.

Each test restarts a pipeline more than once and compares what Spark processed with what was
produced: nothing re-read, nothing skipped, and the ledger says what happened.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from offset_ledger import OffsetLedgerListener, start_from_ledger
from offset_ledger.errors import AmbiguousConsumerGroup, DataLossError, FirstRunRefused
from offset_ledger.ledger.tables import checkpoint_generations, findings, positions, resets
from tests.integration.test_restart import _rows, _run, _values

_CLI = [sys.executable, "-c", "from offset_ledger.cli.main import main; main()"]


def _start(kafka, pg_dsn: str, topic: str, root: Path, **kw: Any):  # type: ignore[no-untyped-def]
    return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(root), dsn=pg_dsn, **kw)


def _recorded_run(spark, kafka, pg_dsn: str, topic: str, plan, tmp_path: Path, *,  # type: ignore[no-untyped-def]
                  group: str | None = None, checkpoint: str | None = None, max_per_trigger: int | None = None):
    """Run the query with the real listener until it has read what is available; the values it read."""
    listener = OffsetLedgerListener(dsn=pg_dsn, pipeline="orders", consumer_group=group,
                                    spool_dir=tmp_path / "spool")
    spark.streams.addListener(listener)
    try:
        seen, end = _run(spark, kafka.bootstrap_servers, topic, plan.starting_offsets_json,
                         checkpoint or plan.checkpoint_location, max_offsets_per_trigger=max_per_trigger)
        assert listener.flush(60), listener.health()
    finally:
        spark.streams.removeListener(listener)
        listener.close()
    return seen, end


def _positions(pg_dsn: str, group: str = "orders") -> dict[int, int]:
    return {r.partition: r.next_offset for r in _rows(pg_dsn, positions) if r.consumer_group == group}


def test_consumer_group_given_on_one_side_only_never_replays(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, _values("a", 300))
    # The listener names a group; the restart below does not.
    first = _start(kafka, pg_dsn, topic, tmp_path, consumer_group="orders-etl")
    seen1, _ = _recorded_run(spark, kafka, pg_dsn, topic, first, tmp_path, group="orders-etl", max_per_trigger=60)
    assert seen1 == Counter(_values("a", 300))
    assert _positions(pg_dsn, "orders-etl") == {0: 100, 1: 100, 2: 100}

    kafka.produce(topic, _values("b", 30))
    plan = _start(kafka, pg_dsn, topic, tmp_path, app_version="2")  # no consumer_group: the only one
    assert plan.consumer_group == "orders-etl" and plan.fresh_checkpoint
    assert plan.starting_offsets == {topic: {"0": 100, "1": 100, "2": 100}}
    seen2, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan, tmp_path, group="orders-etl")
    assert seen2 == Counter(_values("b", 30))  # 0 of 300 read again

    # The wrong group named explicitly: a loud refusal that says what the ledger has, nothing written.
    generations_before = len(_rows(pg_dsn, checkpoint_generations))
    with pytest.raises(FirstRunRefused) as refused:
        _start(kafka, pg_dsn, topic, tmp_path, consumer_group="orders", app_version="3")
    assert "orders-etl" in refused.value.message and "batches" in refused.value.message
    assert len(_rows(pg_dsn, checkpoint_generations)) == generations_before
    # Starting over on purpose stays possible, and says so.
    over = _start(kafka, pg_dsn, topic, tmp_path, consumer_group="orders", first_run="latest",
                  allow_first_run=True, app_version="3")
    assert over.starting_offsets == {topic: {"0": 110, "1": 110, "2": 110}}  # latest: the log-end seen then
    # Two groups now: naming none is ambiguous.
    with pytest.raises(AmbiguousConsumerGroup):
        _start(kafka, pg_dsn, topic, tmp_path, app_version="4")


def test_recreated_topic_is_read_exactly_once_across_two_later_restarts(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("old", 1000))
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    seen1, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan1, tmp_path, max_per_trigger=400)
    assert seen1 == Counter(_values("old", 1000))
    assert _positions(pg_dsn) == {0: 500, 1: 500}

    kafka.recreate_topic(topic, partitions=2)
    kafka.produce(topic, _values("new", 50))
    # The positions (500) lie beyond the new log-end (25): the default policy refuses, naming it.
    with pytest.raises(DataLossError) as lost:
        _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    assert "re-created" in lost.value.message
    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1", on_data_loss="earliest")
    assert plan2.fresh_checkpoint and plan2.starting_offsets == {topic: {"0": 0, "1": 0}}
    assert {f.kind for f in plan2.findings} == {"data_loss"}
    assert all(f.details["kind"] == "topic_recreated" for f in plan2.findings)
    seen2, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan2, tmp_path)
    assert seen2 == Counter(_values("new", 50))
    assert _positions(pg_dsn) == {0: 25, 1: 25}  # the new incarnation's offsets, not 500

    kafka.produce(topic, _values("more", 2000))
    plan3 = _start(kafka, pg_dsn, topic, tmp_path, app_version="2")
    assert plan3.starting_offsets == {topic: {"0": 25, "1": 25}} and plan3.findings == ()
    seen3, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan3, tmp_path, max_per_trigger=700)
    assert seen3 == Counter(_values("more", 2000))  # 0 skipped, 0 re-read
    plan4 = _start(kafka, pg_dsn, topic, tmp_path, app_version="3")
    seen4, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan4, tmp_path)
    assert seen4 == Counter()

    engine = create_engine(pg_dsn)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT kind, topic, \"partition\", generation_id, message FROM v_findings "
                "WHERE pipeline = 'orders' AND kind = 'data_loss' ORDER BY \"partition\"")).all()
    finally:
        engine.dispose()
    assert [(r.kind, r.topic, r.partition) for r in rows] == [("data_loss", topic, 0), ("data_loss", topic, 1)]
    assert all(r.generation_id is not None and "re-created" in r.message for r in rows)
    assert not [f for f in _rows(pg_dsn, findings) if f.kind == "regression"]


def test_run_on_an_old_generation_after_a_reset_is_foreign(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 100))
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    _recorded_run(spark, kafka, pg_dsn, topic, plan1, tmp_path)
    assert _positions(pg_dsn) == {0: 50, 1: 50}
    _cli("reset", "orders", "--shift-by", "-20", "--execute", "--reason", "replay 20",
         dsn=pg_dsn, bootstrap=kafka.bootstrap_servers)
    assert _positions(pg_dsn) == {0: 30, 1: 30}
    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    assert plan2.fresh_checkpoint and plan2.starting_offsets == {topic: {"0": 30, "1": 30}}

    # Someone restarts the job on generation 1's checkpoint (the old deployment script).
    kafka.produce(topic, _values("b", 40))
    old_seen, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan1, tmp_path)
    assert old_seen == Counter(_values("b", 40))
    assert _positions(pg_dsn) == {0: 30, 1: 30}  # the reset's positions stay in place
    foreign = [f for f in _rows(pg_dsn, findings) if f.kind == "foreign_run"]
    assert len(foreign) == 1 and "generation 2" in foreign[0].message

    # The current generation reads from the reset: 20 replayed per partition, then everything new.
    seen2, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan2, tmp_path)
    assert sum(seen2.values()) == 40 + 40
    assert _positions(pg_dsn) == {0: 70, 1: 70}
    assert [r.status for r in _rows(pg_dsn, resets)] == ["consumed"]


def _cli(*args: str, dsn: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OFFSET_LEDGER_DSN": dsn, "OFFSET_LEDGER_BOOTSTRAP_SERVERS": bootstrap}
    done = subprocess.run([*_CLI, *args], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_concurrent_shifts_account_for_every_executed_shift(kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, _values("a", 1000))
    _start(kafka, pg_dsn, topic, tmp_path, first_run="latest")  # positions: 1000
    assert _positions(pg_dsn) == {0: 1000}
    env = {**os.environ, "OFFSET_LEDGER_DSN": pg_dsn, "OFFSET_LEDGER_BOOTSTRAP_SERVERS": kafka.bootstrap_servers}
    procs = [subprocess.Popen([*_CLI, "reset", "orders", "--shift-by", "-10",
                               "--execute", "--force", "--reason", f"shift {i}"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(8)]
    outcomes = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    for p in procs:
        for stream in (p.stdout, p.stderr):
            if stream:
                stream.close()
    assert [code for code, _ in outcomes] == [0] * 8, outcomes
    assert _positions(pg_dsn) == {0: 920}
    engine = create_engine(pg_dsn)
    try:
        with engine.connect() as conn:
            chain = conn.execute(text(
                "SELECT before_next_offset, after_next_offset FROM v_resets "
                "WHERE pipeline = 'orders' AND NOT dry_run ORDER BY reset_id")).all()
    finally:
        engine.dispose()
    # Each audit row's "before" is what the previous reset left: no lost update, no stale audit.
    assert [tuple(r) for r in chain] == [(1000 - 10 * i, 990 - 10 * i) for i in range(8)]
