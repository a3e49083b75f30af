"""The driver heartbeat on an embedded SQLite ledger (the cases: tests/heartbeat_cases.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import ensure_schema, make_engine
from tests.heartbeat_cases import parametrize


@parametrize
def test_heartbeat_on_sqlite(case: Callable[[Engine], None], tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        ensure_schema(engine)
        case(engine)
    finally:
        engine.dispose()
