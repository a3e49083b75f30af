"""The driver heartbeat on a real PostgreSQL ledger (the cases: tests/heartbeat_cases.py)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.engine import Engine

from tests.heartbeat_cases import parametrize


@parametrize
def test_heartbeat_on_postgres(case: Callable[[Engine], None], ledger: Engine) -> None:
    case(ledger)


def test_the_verdict_follows_the_true_history_on_postgres(ledger: Engine) -> None:
    from hypothesis import HealthCheck, example, given, settings
    from hypothesis import strategies as st

    from tests.heartbeat_property import SUPERSEDED_CRASH, check_history, histories

    @settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(histories, st.lists(st.integers(1, 200), max_size=20))
    @example(SUPERSEDED_CRASH, [])
    def prop(history, skipped):  # type: ignore[no-untyped-def]
        check_history(ledger, history, skipped)

    prop()
