"""The ledger's write side on real Postgres: the same scenarios as on SQLite, plus concurrency."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.recorder import Recorder
from tests.unit.test_recorder_sqlite import SCENARIOS, batch, position_map, rec, start


@pytest.fixture
def pg_engine(pg_dsn: str) -> Iterator[Engine]:
    engine = make_engine(pg_dsn)
    ensure_schema(engine)
    yield engine
    engine.dispose()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__.removeprefix("check_"))
def test_recorder_on_postgres(scenario, pg_engine: Engine) -> None:  # type: ignore[no-untyped-def]
    scenario(pg_engine)


def test_two_writers_of_the_same_batches_stay_idempotent(pg_engine: Engine) -> None:
    """Two listeners on one query (registered twice by mistake) write each batch once."""
    first, second = Recorder(pg_engine), Recorder(pg_engine)
    b0 = batch(0, {("t", p): (None, 10) for p in range(50)})
    b1 = batch(1, {("t", p): (10, 20) for p in range(50)})
    first.record([start(), rec(b0)])
    second.record([start(), rec(b0), rec(b1)])
    out = first.record([rec(b1)])
    assert out.batches_written == 0 and out.duplicates == 1 and out.findings == ()
    assert position_map(pg_engine) == {("t", p): 20 for p in range(50)}


def test_large_batches_take_the_copy_path_with_awkward_names(pg_engine: Engine) -> None:
    """300 partitions go through COPY + INSERT ... SELECT ON CONFLICT; CSV quoting must hold."""
    from sqlalchemy import func, select

    from offset_ledger.ledger.recorder import BatchRecord
    from offset_ledger.ledger.tables import batch_offsets, positions

    pipeline = 'orders, "eu"\nline2\\x'
    parts = range(300)
    b0 = batch(0, {("t,1", p): (None, 10 + p) for p in parts})
    b1 = batch(1, {("t,1", p): (10 + p, 20 + p) for p in parts})
    Recorder(pg_engine).record([BatchRecord(pipeline, pipeline, b0), BatchRecord(pipeline, pipeline, b1)])
    out = Recorder(pg_engine).record([BatchRecord(pipeline, pipeline, b1)])  # re-delivery
    assert (out.batches_written, out.duplicates) == (0, 1)
    with pg_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(batch_offsets)).scalar() == 600
        got = {(r.topic, r.partition): r.next_offset
               for r in conn.execute(select(positions).where(positions.c.pipeline == pipeline))}
        first = conn.execute(select(batch_offsets).where(batch_offsets.c.batch_id == 0,
                                                         batch_offsets.c.partition == 7)).one()
    assert got == {("t,1", p): 20 + p for p in parts}
    assert (first.pipeline, first.from_offset, first.until_offset) == (pipeline, None, 17)
