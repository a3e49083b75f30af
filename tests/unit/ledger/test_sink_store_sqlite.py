"""The sink's ledger rows on the embedded SQLite ledger: fence row, commits, the batch -> output view."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import select, text

from offset_ledger.errors import SinkTargetChanged, exit_code
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger import sink_outputs, sink_store
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.ledger.tables import batches, positions
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress
from offset_ledger.rules.sink_identity import decide

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    e = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(e)
    yield e
    e.dispose()


def _generation(engine, location: str) -> int:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        g, _ = gens.create_generation(conn, gens.NewGeneration(
                                   pipeline="orders", consumer_group="orders", checkpoint_root="/ck",
                                   app_version="1", reason="first", starting_offsets={"t": {"0": 0}},
                                   resolved_offsets={"t": {"0": 0}}, location=location))
    return g.id


def _records(location: str, batch_id: int, start: int, end: int) -> list:  # type: ignore[type-arg]
    run = RunStart("orders", "orders", "q1", "sink:q1", None, T0, checkpoint_location=location)
    batch = BatchOffsets("q1", "sink:q1", None, batch_id, T0, end - start,
                         (SourceProgress(0, "kafka", (PartitionRange("t", 0, start, end),), end - start),),
                         recorded_by="sink")
    return [run, BatchRecord("orders", "orders", batch)]


SPEC = sink_store.SinkSpec("orders:out", "orders", "orders", "postgres", "out")


def _commit(engine, generation_id: int, batch_id: int, rows: int, location: str):  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        state = sink_store.lock_sink(conn, SPEC, T0)
        d = decide(state, generation_id=generation_id, batch_id=batch_id,
                   current_generation_id=sink_store.current_generation_id(conn, "orders", "orders"),
                   committed_sequence=sink_store.committed_sequence(conn, SPEC.sink, generation_id, batch_id))
        if d.verdict == "commit":
            sink_store.record_commit(conn, SPEC, sink_store.SinkCommit(d.sequence, generation_id, "q1", batch_id,
                                                                       row_count=rows),
                                     committed_at=T0, now=T0, records=_records(location, batch_id, batch_id * 10, batch_id * 10 + 10))
    return d


def test_commits_record_the_batch_its_positions_and_its_output(engine) -> None:  # type: ignore[no-untyped-def]
    gen = _generation(engine, "/ck/gen-1-a")
    with engine.connect() as conn:
        assert sink_store.generation_of(conn, "orders", "orders", "file:///ck/gen-1-a") == gen
        assert sink_store.generation_of(conn, "orders", "orders", "/elsewhere") is None
    assert _commit(engine, gen, 0, 10, "/ck/gen-1-a").sequence == 1
    assert _commit(engine, gen, 1, 10, "/ck/gen-1-a").sequence == 2
    assert _commit(engine, gen, 1, 10, "/ck/gen-1-a").verdict == "skip"
    with engine.connect() as conn:
        assert conn.execute(select(positions.c.next_offset)).scalar() == 20
        assert [tuple(r) for r in conn.execute(select(batches.c.batch_id, batches.c.source))] == [
            (0, "sink"), (1, "sink")]
        view = conn.execute(text("SELECT sink, sink_kind, target, target_database, sequence, generation, batch_id, "
                                 "row_count, batch_input_rows FROM v_batch_outputs ORDER BY sequence")).all()
        assert [tuple(r) for r in view] == [("orders:out", "postgres", "out", "ledger", 1, 1, 0, 10, 10),
                                            ("orders:out", "postgres", "out", "ledger", 2, 1, 1, 10, 10)]
        out = sink_outputs.batch_outputs(conn, "orders", batch_ids=[1])
        assert [(o["sequence"], o["generation"], o["row_count"]) for o in out] == [(2, 1, 10)]
        (s,) = sink_outputs.pipeline_sinks(conn, "orders")
        assert (s["last_sequence"], s["generation_id"], s["batch_id"]) == (2, gen, 1)


def test_a_new_generation_fences_the_old_one_and_continues_the_sequence(engine) -> None:  # type: ignore[no-untyped-def]
    old = _generation(engine, "/ck/gen-1-a")
    assert _commit(engine, old, 0, 10, "/ck/gen-1-a").sequence == 1
    new = _generation(engine, "/ck/gen-2-b")
    assert _commit(engine, old, 1, 10, "/ck/gen-1-a").verdict == "fenced"
    assert _commit(engine, new, 0, 10, "/ck/gen-2-b").sequence == 2  # batch id 0 again, sequence 2


def test_a_sink_name_is_bound_to_its_target(engine) -> None:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        sink_store.lock_sink(conn, SPEC, T0)
    with engine.begin() as conn, pytest.raises(SinkTargetChanged, match="its own name"):
        sink_store.lock_sink(conn, sink_store.SinkSpec("orders:out", "orders", "orders", "postgres", "other"), T0)


def test_a_changed_target_database_is_refused_before_anything_is_written(engine) -> None:  # type: ignore[no-untyped-def]
    remote = sink_store.SinkSpec("orders:out", "orders", "orders", "postgres", "out", "db-a:5432/target")
    with engine.begin() as conn:
        sink_store.bind_target(conn, remote, None)  # a check alone binds nothing
        sink_store.bind_target(conn, replace(remote, target_database="db-b:5432/target"), None)
        sink_store.bind_target(conn, remote, T0)  # the first write binds the name
    for other in (replace(remote, target_database="db-b:5432/target"), replace(remote, target_database=None),
                  replace(remote, target="public.out")):
        with engine.begin() as conn, pytest.raises(SinkTargetChanged) as refused:
            sink_store.bind_target(conn, other, None)
        assert exit_code(refused.value) == 3
        assert refused.value.details["bound_to"] == ("postgres table out in db-a:5432/target "
                                                     "(pipeline 'orders', group 'orders')")
    with engine.begin() as conn:
        sink_store.bind_target(conn, remote, T0)
        assert [r["target_database"] for r in sink_outputs.pipeline_sinks(conn, "orders")] == ["db-a:5432/target"]


def test_a_delta_sink_is_bound_to_its_table_path_as_a_location(engine) -> None:  # type: ignore[no-untyped-def]
    delta = sink_store.SinkSpec("orders:lake", "orders", "orders", "delta", "/lake/orders")
    with engine.begin() as conn:
        sink_store.bind_target(conn, delta, T0)
        sink_store.bind_target(conn, replace(delta, target="file:///lake/orders"), T0)  # the same place
    with engine.begin() as conn, pytest.raises(SinkTargetChanged, match="Delta table /lake/orders "):
        sink_store.lock_sink(conn, replace(delta, target="/lake/orders2"), T0)
