"""Issue 47, case 5 on real Postgres: a duplicate is a duplicate whichever writer lands first, a late
batch is late, not a regression (the scenarios of tests/unit/ledger/test_late_batches_sqlite.py).

Here the listener's recorder tries the one-statement path (``ledger.fast_batch``) first: its
statement must abort on a batch another writer recorded, or on a position it would not move, and the
general path then judge it, never write a finding the general path would not.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy.engine import Engine

from offset_ledger.ledger import fast_batch
from offset_ledger.ledger.recorder import Recorder
from tests.unit.ledger.test_late_batches_sqlite import (
    SCENARIOS,
    history,
    kinds,
    sink_record,
    ends_of,
)
from tests.unit.ledger.test_recorder_sqlite import position_map, rec, start


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__[len("check_"):])
def test_late_batches_on_postgres(scenario: Callable[[Engine], None], ledger: Engine) -> None:
    scenario(ledger)


def test_the_one_statement_path_gives_a_listener_copy_after_the_sinks_next_batch_to_the_general_path(
        ledger: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener's batch 1 is fast-path material (newer than its own last, no gap): its statement
    runs, finds the sink's row and aborts; the general path calls it a duplicate, nothing more."""
    tried: list[object] = []
    real = fast_batch.FastBatchPath.record

    def spy(self, conn, recs, txn):  # type: ignore[no-untyped-def]
        out = real(self, conn, recs, txn)
        tried.append((tuple(r.batch.batch_id for r in recs), out is not None))
        return out

    monkeypatch.setattr(fast_batch.FastBatchPath, "record", spy)
    b = history(4)
    listener = Recorder(ledger)
    assert listener._fast is not None
    listener.record([start(), rec(b[0])])
    sink_record(ledger, b[1], b[2])
    out = listener.record([rec(b[1]), rec(b[2])])
    assert (out.batches_written, out.duplicates, out.findings) == (0, 2, ())
    out = listener.record([rec(b[3])])
    assert (out.batches_written, out.findings) == (1, ())
    assert tried == [((1, 2), False)]  # batch 3 comes after duplicates: the general path's, by design
    assert kinds(ledger) == []
    assert position_map(ledger) == ends_of(b[3])
    listener.close()
