"""The driver heartbeat on a real PostgreSQL ledger (the cases: tests/heartbeat_cases.py)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.engine import Engine

from tests.heartbeat_cases import parametrize


@parametrize
def test_heartbeat_on_postgres(case: Callable[[Engine], None], ledger: Engine) -> None:
    case(ledger)
