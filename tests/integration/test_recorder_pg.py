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
