"""Driver errors become our own, and a missing schema says what to run."""

from __future__ import annotations

from pathlib import Path

import pytest

from offset_ledger.operate import reads
from offset_ledger.errors import LedgerError, LedgerUnavailable
from offset_ledger.ledger.engine import make_engine
from offset_ledger.operate.operations import Operations


def test_a_ledger_without_schema_says_to_run_db_upgrade(tmp_path: Path) -> None:
    ops = Operations(make_engine(f"sqlite:///{tmp_path / 'empty.db'}"))
    try:
        with pytest.raises(LedgerError, match="run 'offset-ledger db upgrade'") as info:
            reads.list_pipelines(ops, with_lag=False)
        assert not isinstance(info.value, LedgerUnavailable)  # not retriable: retrying will not help
    finally:
        ops.close()
