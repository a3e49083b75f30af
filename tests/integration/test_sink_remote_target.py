"""The Postgres sink with its target in another database than the ledger, on the real stack.

No transaction spans two databases: the target commits rows + sequence + the batch's record, the
ledger follows. A driver lost between the two leaves the ledger behind; the restart reconciles from
the target's commit log before it plans, so a clean checkpoint still starts after the last batch
the target holds. Oracle: the topic's records, each exactly once in the target.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from offset_ledger import start_from_ledger
from offset_ledger.sinks import PostgresSink
from tests.integration.conftest import fresh_database
from tests.integration.sink_helper import create_target, target_values
from tests.integration.test_restart import _values
from tests.integration.test_sink_postgres import _positions, _run


@pytest.fixture
def target_dsn(stack) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """The sink's target: another database than the ledger's."""
    with fresh_database(stack, f"target_{uuid.uuid4().hex[:8]}") as dsn:
        yield dsn


class _LostBeforeTheLedger(PostgresSink):
    """Fails after the target committed its n-th batch and before the ledger heard of it."""

    def __init__(self, crash_at: int | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.crash_at, self.calls = crash_at, 0

    def _tell_ledger(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        if self.calls == self.crash_at:
            raise RuntimeError("driver lost between the target's commit and the ledger's")
        super()._tell_ledger(*args, **kwargs)


def _target_sequences(dsn: str) -> list[int]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text("SELECT sequence FROM offset_ledger_sink_commits ORDER BY sequence")).scalars())
    finally:
        engine.dispose()


def _ledger_sequences(dsn: str) -> list[tuple[int, str]]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT sequence, target_database FROM v_batch_outputs ORDER BY sequence"))]
    finally:
        engine.dispose()


def test_a_ledger_behind_its_remote_target_is_reconciled_before_a_clean_checkpoint_restart(
        spark, kafka, pg_dsn: str, target_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    produced = _values("t", 50)
    kafka.produce(topic, produced)
    create_target(target_dsn, "orders_out")
    root = str(tmp_path / "ck")

    def plan(version: str, sink: PostgresSink):  # type: ignore[no-untyped-def]
        return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers, checkpoint_root=root,
                                 app_version=version, dsn=pg_dsn, first_run="earliest", sinks=[sink])

    lost = _LostBeforeTheLedger(3, table="orders_out", pipeline="orders", dsn=pg_dsn, target_dsn=target_dsn)
    p1 = plan("1", lost)
    assert not _run(spark, kafka, topic, p1, lost.bind(p1.checkpoint_location))
    # The target holds three batches, the ledger two: a restart planned from the ledger alone
    # would read the third batch again into the target.
    assert _target_sequences(target_dsn) == [1, 2, 3] and len(_ledger_sequences(pg_dsn)) == 2
    assert sum(_positions(pg_dsn).values()) == 20

    sink = PostgresSink(table="orders_out", pipeline="orders", dsn=pg_dsn, target_dsn=target_dsn)
    p2 = plan("2", sink)
    assert p2.fresh_checkpoint
    assert [f.kind for f in p2.findings if f.kind == "sink_reconciled"] == ["sink_reconciled"]
    assert sum(p2.starting_offsets[topic].values()) == 30
    assert _run(spark, kafka, topic, p2, sink.bind(p2.checkpoint_location))
    assert target_values(target_dsn, "orders_out") == Counter(produced)
    ledger = _ledger_sequences(pg_dsn)
    assert [s for s, _ in ledger] == _target_sequences(target_dsn) == [1, 2, 3, 4, 5]
    where = make_url(target_dsn)
    assert {w for _, w in ledger} == {f"{where.host}:{where.port}/{where.database}"}  # never the password
    assert sum(_positions(pg_dsn).values()) == 50


class _Seen(PostgresSink):
    """The sink, keeping what each batch raised (classic Spark runs foreachBatch in this process)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.raised: list[BaseException] = []

    def write(self, df, batch_id):  # type: ignore[no-untyped-def]
        try:
            return super().write(df, batch_id)
        except BaseException as exc:
            self.raised.append(exc)
            raise


def _tables(dsn: str) -> list[str]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return sorted(conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars())
    finally:
        engine.dispose()


def test_a_sink_name_moved_to_another_target_database_is_refused_before_it_writes(
        spark, kafka, pg_dsn: str, target_dsn: str, stack, tmp_path: Path) -> None:
    from offset_ledger.errors import SinkTargetChanged, exit_code

    topic = kafka.create_topic(partitions=2)
    first, more = _values("m", 20), _values("n", 20)
    kafka.produce(topic, first)
    create_target(target_dsn, "orders_out")
    root = str(tmp_path / "ck")

    def plan(sink: PostgresSink):  # type: ignore[no-untyped-def]
        return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers, checkpoint_root=root,
                                 app_version="1", dsn=pg_dsn, first_run="earliest", sinks=[sink])

    sink = PostgresSink(table="orders_out", pipeline="orders", dsn=pg_dsn, target_dsn=target_dsn)
    p1 = plan(sink)
    assert _run(spark, kafka, topic, p1, sink.bind(p1.checkpoint_location))
    kafka.produce(topic, more)
    with fresh_database(stack, f"moved_{uuid.uuid4().hex[:8]}") as moved_dsn:
        create_target(moved_dsn, "orders_out")
        # The same name (pipeline:table by default) on another database: the restart refuses it ...
        moved = _Seen(table="orders_out", pipeline="orders", dsn=pg_dsn, target_dsn=moved_dsn)
        with pytest.raises(SinkTargetChanged) as refused:
            plan(moved)
        assert exit_code(refused.value) == 3
        where, there = make_url(target_dsn), make_url(moved_dsn)
        assert str(refused.value) == (
            f"sink 'orders:orders_out' is bound to postgres table orders_out in {where.host}:{where.port}/"
            f"{where.database} (pipeline 'orders', group 'orders'); this sink writes postgres table orders_out in "
            f"{there.host}:{there.port}/{there.database} (pipeline 'orders', group 'orders'). One sink name, one "
            f"target: nothing was written. Give the new target its own name (name=...), or point the sink back "
            f"at its target")
        # ... and so does its first batch, started on the checkpoint without the plan: nothing staged or
        # committed in the new database, nothing recorded in the ledger.
        assert not _run(spark, kafka, topic, p1, moved.bind(p1.checkpoint_location))
        assert [type(e) for e in moved.raised] == [SinkTargetChanged]
        assert target_values(moved_dsn, "orders_out") == Counter() and _tables(moved_dsn) == ["orders_out"]
    assert [s for s, _ in _ledger_sequences(pg_dsn)] == _target_sequences(target_dsn) == [1, 2]
    # Back on its own target, the sink goes on where it stood.
    assert _run(spark, kafka, topic, p1, sink.bind(p1.checkpoint_location))
    assert target_values(target_dsn, "orders_out") == Counter(first + more)
    assert [s for s, _ in _ledger_sequences(pg_dsn)] == _target_sequences(target_dsn) == [1, 2, 3, 4]


class _Zombie(PostgresSink):
    """Generation 1's driver on a remote target: its last fence check passes, the upgrade opens generation 2,
    then it commits ``armed`` to the target (and, with ``lost``, dies before the ledger hears of it).

    The window the two-database mode cannot close (docs/sinks.md): the fence reads the ledger just before
    the target's transaction. What must hold is that the upgraded job neither skips nor repeats it.
    """

    def __init__(self, upgrade: Any, armed: int, lost: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.upgrade, self.armed, self.lost, self.committing = upgrade, armed, lost, False

    def _commit_remote(self, *args: Any, **kwargs: Any) -> Any:
        self.committing = True
        try:
            return super()._commit_remote(*args, **kwargs)
        finally:
            self.committing = False

    def _read_ledger(self, ledger: Any, batch_id: int, query_id: str) -> Any:
        read = super()._read_ledger(ledger, batch_id, query_id)
        if self.committing and batch_id == self.armed and self.upgrade is not None:
            upgrade, self.upgrade = self.upgrade, None
            upgrade()  # the restart opens generation 2 between the zombie's fence check and its commit
        return read

    def _tell_ledger(self, ledger: Any, decision: Any, *args: Any, **kwargs: Any) -> None:
        if self.lost and decision.sequence == self.armed + 1:
            raise RuntimeError("the zombie died between the target's commit and the ledger's")
        super()._tell_ledger(ledger, decision, *args, **kwargs)


@pytest.mark.parametrize("lost", [False, True], ids=["ledger_told", "ledger_never_told"])
def test_a_zombie_committing_to_a_remote_target_after_the_upgrade_fences_the_upgraded_batch(
        spark, kafka, pg_dsn: str, target_dsn: str, tmp_path: Path, lost: bool) -> None:
    """Oracle: every produced record in the target exactly once, and a refused batch writes nothing.

    On main the upgraded job's batch 0 (from the positions the zombie's batch never moved) got the next
    sequence in the target's log and wrote the zombie's 10 records a second time.
    """
    from offset_ledger.errors import SinkFenced

    topic = kafka.create_topic(partitions=2)
    produced = _values("z", 40)
    kafka.produce(topic, produced)
    create_target(target_dsn, "orders_out")
    root = str(tmp_path / "ck")

    def plan(version: str, sink: PostgresSink):  # type: ignore[no-untyped-def]
        return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers, checkpoint_root=root,
                                 app_version=version, dsn=pg_dsn, first_run="earliest", sinks=[sink])

    def once() -> Counter:  # type: ignore[type-arg]
        held = target_values(target_dsn, "orders_out")
        twice = sorted(v for v, n in held.items() if n > 1)
        assert not twice, f"records written twice: {twice}"
        return held

    upgraded: list[Any] = []
    sink = _Seen(table="orders_out", pipeline="orders", dsn=pg_dsn, target_dsn=target_dsn)
    zombie = _Zombie(lambda: upgraded.append(plan("2", sink)), 2, lost, table="orders_out", pipeline="orders",
                     dsn=pg_dsn, target_dsn=target_dsn)
    p1 = plan("1", zombie)
    _run(spark, kafka, topic, p1, zombie.bind(p1.checkpoint_location))
    assert _target_sequences(target_dsn) == [1, 2, 3]  # batches 0-2 of generation 1; 2 landed after the upgrade
    p2, = upgraded
    assert p2.fresh_checkpoint and sum(p2.starting_offsets[topic].values()) == 20
    assert len(once()) == 30

    # The upgraded job: its batch 0 would write offsets 10-15 of each partition, which the zombie wrote.
    bound = sink.bind(p2.checkpoint_location)
    ran = _run(spark, kafka, topic, p2, bound)
    assert len(once()) == 30 and _target_sequences(target_dsn) == [1, 2, 3] and not ran
    assert _tables(target_dsn) == ["offset_ledger_sink_commits", "offset_ledger_sink_fence", "orders_out"]
    refused = [e for e in bound.raised if isinstance(e, SinkFenced)]
    assert refused, bound.raised
    print("LATE", refused[0])  # docs/sinks.md
    assert "after this generation opened at 10" in str(refused[0]) and "sink_ahead" in str(refused[0])

    # The restart the refusal asks for starts where the zombie's batch ended.
    p3 = plan("3", sink)
    print("SINK_AHEAD", [f.message for f in p3.findings if f.kind == "sink_ahead"])  # docs/sinks.md
    assert "sink_ahead" in [f.kind for f in p3.findings] and p3.fresh_checkpoint
    assert sum(p3.starting_offsets[topic].values()) == 30
    assert _run(spark, kafka, topic, p3, sink.bind(p3.checkpoint_location))
    assert once() == Counter(produced)
    assert [s for s, _ in _ledger_sequences(pg_dsn)] == _target_sequences(target_dsn) == [1, 2, 3, 4]
