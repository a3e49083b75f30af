"""Issue 47's two-writer property on real Postgres (tests/unit/ledger/test_two_writers_property.py):
the listener's recorder tries the one-statement path (``ledger.fast_batch``) where it can, the sink
records in its own transactions; the findings are exactly the true history's read shortfalls."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.fast_batch import FastBatchPath
from tests.unit.ledger.test_two_writers_property import History, cases, check_history


@pytest.fixture(scope="module")
def shared_engine(stack) -> Iterator[Engine]:  # type: ignore[no-untyped-def]
    from tests.integration.conftest import fresh_database

    with fresh_database(stack, "two_writers_property_pg") as dsn:
        eng = make_engine(dsn)
        ensure_schema(eng)
        yield eng
        eng.dispose()


def test_two_writers_in_any_order_find_exactly_the_true_losses_on_postgres(
        shared_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    wrote = {"fast": 0, "refused": 0}
    real = FastBatchPath.record

    def spy(self, conn, recs, txn):  # type: ignore[no-untyped-def]
        out = real(self, conn, recs, txn)
        wrote["fast" if out is not None else "refused"] += 1
        return out

    monkeypatch.setattr(FastBatchPath, "record", spy)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases())
    def check(case: tuple[History, list[tuple[str, list[int]]]]) -> None:
        check_history(shared_engine, *case)

    check()
    # Both ways the one-statement path goes were exercised, not just the general path.
    assert wrote["fast"] > 0 and wrote["refused"] > 0, wrote
