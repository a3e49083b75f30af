"""Every time in an answer carries its UTC offset, whichever ledger it came from (SQLite hands back naive times)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from offset_ledger.ledger.activity import RunActivity
from offset_ledger.operate.answers import run_answer


@pytest.mark.parametrize("last_seen", [datetime(2026, 11, 29, 13, 0, 5),  # as SQLite returns it
                                       datetime(2026, 11, 29, 13, 0, 5, tzinfo=timezone.utc)])
def test_a_runs_last_seen_is_utc_with_its_offset(last_seen: datetime) -> None:
    answer = run_answer(RunActivity("r1", "q1", "live", last_seen, timedelta(seconds=90), "batches arrive"))
    assert answer["lastSeen"] == "2026-11-29T13:00:05+00:00"
    assert datetime.fromisoformat(answer["lastSeen"]).utcoffset() == timedelta(0)
