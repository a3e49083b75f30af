"""Positions per topic (0024) on the listener's hot path, real PostgreSQL: a batch over every partition of a
topic moves its row in the one statement; a partition added mid-run goes the general path once, appears,
and the next batch is one statement again; partitions a batch does not report keep their position."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from offset_ledger.ledger.fast_batch import FastBatchPath
from offset_ledger.ledger.queries import current_positions
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress
from tests.unit.ledger.test_recorder_sqlite import T0


def _batch(n: int, ends: dict[tuple[str, int], int], moves: dict[tuple[str, int], int]) -> BatchRecord:
    by_topic: dict[str, list[PartitionRange]] = {}
    for (t, p), step in sorted(moves.items()):
        start = ends.get((t, p), 0)
        by_topic.setdefault(t, []).append(PartitionRange(t, p, start, start + step))
        ends[(t, p)] = start + step
    sources = tuple(SourceProgress(i, f"KafkaV2[Subscribe[{t}]]", tuple(r),
                                   sum(x.until_offset - (x.from_offset or 0) for x in r))
                    for i, (t, r) in enumerate(sorted(by_topic.items())))
    return BatchRecord("hot", "hot", BatchOffsets("q", "r", "hot", n, T0 + timedelta(seconds=n),
                                                  sum(s.input_rows for s in sources), sources))


def test_a_batch_moves_each_topic_row_once_and_added_partitions_appear(ledger: Engine,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fast: list[bool] = []
    record_fast = FastBatchPath.record

    def counting(self, conn, recs, txn):  # type: ignore[no-untyped-def]
        out = record_fast(self, conn, recs, txn)
        fast.append(out is not None)
        return out

    monkeypatch.setattr(FastBatchPath, "record", counting)
    rec = Recorder(ledger)
    ends: dict[tuple[str, int], int] = {}
    every = {(t, p): 5 for t in ("a", "b") for p in range(4)}
    try:
        rec.record([RunStart("hot", "hot", "q", "r", "hot", T0)])
        for n in range(3):
            assert not rec.record([_batch(n, ends, every)]).findings
        # partition 4 of topic a appears mid-run: its row grows (the general path, once)
        every[("a", 4)] = 2
        assert not rec.record([_batch(3, ends, every)]).findings
        assert not rec.record([_batch(4, ends, every)]).findings
        # a batch that reports topic b only: topic a keeps its positions
        only_b = {k: v for k, v in every.items() if k[0] == "b"}
        assert not rec.record([_batch(5, ends, only_b)]).findings
    finally:
        rec.close()
    # batch 0 is the general path's (nothing known of the query yet: not offered), 1-2 one statement,
    # 3 a new partition (offered, aborted: the row's partitions differ), 4-5 one statement
    assert fast == [True, True, False, True, True]
    with ledger.connect() as conn:
        assert {(p.topic, p.partition): p.next_offset for p in current_positions(conn, "hot")} == ends
        rows = conn.execute(text("SELECT topic, partitions, stamps, moved_batch_ids FROM topic_positions "
                                 "ORDER BY topic")).all()
        assert [tuple(r) for r in rows] == [("a", [0, 1, 2, 3, 4], None, [4]), ("b", [0, 1, 2, 3], None, [5])]
        assert conn.execute(text("SELECT count(*) FROM positions")).scalar() == 0  # nothing per partition
