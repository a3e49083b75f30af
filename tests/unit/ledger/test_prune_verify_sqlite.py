"""Prune, then verify, over a real (SQLite) ledger: pruned history reads as pruned, a hole stays a hole.

Before this, every routine prune turned into an unexplained gap in verify ("batches 2-6 ... are not
in the ledger (pruned, or never recorded)"), so exit 6 after a prune meant nothing. The Postgres
path runs in tests/integration/test_prune.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import delete, insert, select, tuple_, update
from sqlalchemy.engine import Engine

from offset_ledger.ledger.prune import prune
from offset_ledger.ledger.tables import batch_offsets, findings, pruned_ranges
from offset_ledger.rules.pruned import DeletedRange, islands
from tests.unit.ledger.test_recorder_sqlite import T0
from tests.unit.operate.test_verify_sqlite import _tiling, _verify, engine  # noqa: F401  (the fixture)


def _stretches(engine: Engine) -> list[tuple]:
    return [(s.partition, s.from_offset, s.until_offset, s.kind, s.explained, sorted({r.kind for r in s.reasons}))
            for s in _verify(engine).stretches]


def history_with_a_hole(engine: Engine) -> None:
    """Ten batches of 10 records on two partitions; batch 5 of partition 0 never recorded; batch 1 kept by a finding."""
    _tiling(engine, n=10)
    with engine.begin() as conn:
        conn.execute(delete(batch_offsets).where(batch_offsets.c.batch_id == 5, batch_offsets.c.partition == 0))
        conn.execute(insert(findings).values(pipeline="orders", consumer_group="orders", kind="regression",
                                             query_id="q1", batch_id=1, message="kept by prune",
                                             created_at=T0))


def test_verify_after_prune_gives_the_same_answer_and_still_reports_the_hole(engine: Engine) -> None:
    history_with_a_hole(engine)
    assert _stretches(engine) == [(0, 50, 60, "gap", False, [])]
    report = prune(engine, timedelta(seconds=1), now=T0 + timedelta(seconds=8), execute=True)  # cutoff: batch 7
    assert report.batch_offsets.deleted == 11 and report.islands == 5  # p0: [0,10) [20,50) [60,70); p1: [0,10) [20,70)
    with engine.connect() as conn:
        kept = sorted(set(conn.execute(select(batch_offsets.c.batch_id)).scalars()))
    assert kept == [1, 7, 8, 9]
    # The pruned islands are swept as the reads they were: the same answer as before the prune.
    assert _stretches(engine) == [(0, 50, 60, "gap", False, [])]
    with engine.connect() as conn:
        islands = sorted(tuple(r) for r in conn.execute(select(
            pruned_ranges.c.partition, pruned_ranges.c.from_offset, pruned_ranges.c.until_offset,
            pruned_ranges.c.from_batch_id, pruned_ranges.c.until_batch_id, pruned_ranges.c.counts_reads)))
    assert islands == [(0, 0, 10, 0, 0, True), (0, 20, 50, 2, 4, True), (0, 60, 70, 6, 6, True),
                       (1, 0, 10, 0, 0, True), (1, 20, 70, 2, 6, True)]
    # A second prune over the same cutoff deletes and records nothing more.
    again = prune(engine, timedelta(seconds=1), now=T0 + timedelta(seconds=8), execute=True)
    assert (again.batch_offsets.deleted, again.islands) == (0, 0)
    # Without the record the pruned stretches are unexplained again: the record is what explains them.
    with engine.begin() as conn:
        conn.execute(delete(pruned_ranges))
    assert [s[:5] for s in _stretches(engine)] == [(0, 20, 70, "gap", False), (1, 20, 70, "gap", False)]
    # An island 0009 recorded (not converted by 0014) still explains the gap it covers, by name.
    with engine.begin() as conn:
        conn.execute(insert(pruned_ranges).values(
            pipeline="orders", consumer_group="orders", query_id="q1", topic="t", partition=1, from_batch_id=2,
            until_batch_id=6, from_offset=20, until_offset=70, batches=5, first_batch_time=T0, cutoff=T0,
            pruned_at=T0, counts_reads=False))
    assert [s[:6] for s in _stretches(engine)][1] == (1, 20, 70, "gap", True, ["pruned"])
    label = next(s for s in _verify(engine).stretches if s.partition == 1).reasons[0].label()
    assert "batches 2-6 of query q1, pruned " in label


def recorded_equals_the_rule(engine: Engine, cutoff_now, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Oracle: the islands prune writes (SQL) are ``rules.pruned.islands`` over the rows it deletes."""
    import random

    rnd = random.Random(seed)
    for q in range(3):  # three queries, holes and overlaps punched at random, a start sometimes unreported
        _tiling(engine, query=f"q{q}", run=f"r{q}", first=q * 100, n=12, at=timedelta(seconds=q * 20))
    bo = batch_offsets
    key = (bo.c.query_id, bo.c.batch_id, bo.c.source_index, bo.c.topic, bo.c.partition)  # a range's identity
    with engine.begin() as conn:
        for row in conn.execute(select(*key, bo.c.from_offset)).all():
            this = tuple_(*key) == tuple(row[:5])
            roll = rnd.random()
            if roll < 0.1:
                conn.execute(delete(bo).where(this))
            elif roll < 0.2:
                conn.execute(update(bo).where(this).values(from_offset=row.from_offset + rnd.choice([-3, 2])))
            elif roll < 0.25:
                conn.execute(update(bo).where(this).values(from_offset=None))
        before = {tuple(r[:5]): r for r in conn.execute(select(*key, *(c for c in bo.c if c not in key))).all()}
    report = prune(engine, timedelta(seconds=1), now=cutoff_now, execute=True)
    with engine.connect() as conn:
        left = {tuple(r) for r in conn.execute(select(*key))}
        got = sorted(tuple(r) for r in conn.execute(select(
            pruned_ranges.c.query_id, pruned_ranges.c.topic, pruned_ranges.c.partition, pruned_ranges.c.from_batch_id,
            pruned_ranges.c.until_batch_id, pruned_ranges.c.from_offset, pruned_ranges.c.until_offset,
            pruned_ranges.c.batches)))
    doomed = sorted((r for i, r in before.items() if i not in left),
                    key=lambda r: (r.pipeline, r.consumer_group, r.query_id, r.topic, r.partition, r.batch_id,
                                   r.source_index))
    want = sorted((i.query_id, i.topic, i.partition, i.from_batch_id, i.until_batch_id, i.from_offset, i.until_offset,
                   i.batches) for i in islands(DeletedRange(r.pipeline, r.consumer_group, r.query_id, r.topic,
                                                            r.partition, r.batch_id, r.from_offset, r.until_offset,
                                                            r.batch_time, r.source_index) for r in doomed))
    assert report.islands == len(want) and got == want and len(doomed) > 0


@pytest.mark.parametrize("seed", range(4))
def test_the_recorded_islands_are_the_rule_over_the_deleted_rows(engine: Engine, seed: int) -> None:
    recorded_equals_the_rule(engine, T0 + timedelta(seconds=40), seed)


def test_a_dry_run_records_nothing(engine: Engine) -> None:
    history_with_a_hole(engine)
    report = prune(engine, timedelta(seconds=1), now=T0 + timedelta(seconds=8))
    assert report.batch_offsets.deleted == 11 and report.islands == 0
    with engine.connect() as conn:
        assert conn.execute(select(pruned_ranges)).all() == []
