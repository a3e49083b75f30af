"""The verdict and the reset guard equal the true history's, on an embedded SQLite ledger
(the property: tests/heartbeat_property.py)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from offset_ledger.ledger.engine import ensure_schema, make_engine
from tests.heartbeat_property import SUPERSEDED_CRASH, check_history, histories


def test_the_verdict_follows_the_true_history_on_sqlite(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)

    @settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(histories, st.lists(st.integers(1, 200), max_size=20))
    @example(SUPERSEDED_CRASH, [])
    def prop(history, skipped):  # type: ignore[no-untyped-def]
        check_history(engine, history, skipped)

    try:
        prop()
    finally:
        engine.dispose()
