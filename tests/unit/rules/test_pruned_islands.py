"""Prune's record of what it deleted (``rules.pruned``) against verify's sweep, with hypothesis.

A partition's history is batches of a few queries that tile, with holes (batches never recorded)
punched at random. Prune then deletes a random set of the batches. Property: verify over the kept rows plus the
reads of the deleted ones' islands (``island_reads``) reports exactly the stretches it reported
over the whole history, before the first kept range too. A hole among deleted batches is never
hidden. (0009's islands, which only explained gaps, answered differently: the last test.)
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offset_ledger.rules.pruned import DeletedRange, island_reads, islands
from offset_ledger.rules.verify import (
    Explanation,
    RangeRow,
    Reason,
    sort_key,
    verify_ranges,
)

T = datetime(2026, 11, 25, tzinfo=timezone.utc)


@st.composite
def history(draw):  # type: ignore[no-untyped-def]
    """(rows, holes, deleted, positions): two partitions, offsets never recorded, rows pruned, where each stands."""
    rows: list[RangeRow] = []
    positions: dict[tuple[str, int, int], int] = {}
    holes: set[tuple[int, int]] = set()
    for partition in (0, 1):
        offset, batch_id, query = 0, 0, 0
        for _ in range(draw(st.integers(1, 25))):
            if draw(st.integers(0, 9)) == 0:  # a restart: a new query starts where the old one ended
                query, batch_id = query + 1, 0
            size = draw(st.integers(0, 4))
            row = RangeRow("t", partition, offset, offset + size, f"q{query}", batch_id)
            if draw(st.integers(0, 7)) == 0 and size:
                holes.update((partition, o) for o in range(offset, offset + size))  # never recorded
            else:
                rows.append(row)
            offset, batch_id = offset + size, batch_id + 1
        positions[("t", partition, 0)] = offset  # the ledger's position: prune never touches it
    deleted = [r for r in rows if draw(st.booleans())]
    return rows, holes, deleted, positions


def _explanations(deleted: list[RangeRow]) -> list[Explanation]:
    ordered = sorted(deleted, key=lambda r: (r.query_id, r.topic, r.partition, r.batch_id))
    found = islands(DeletedRange("p", "g", r.query_id, r.topic, r.partition, r.batch_id, r.from_offset,
                                 r.until_offset, T) for r in ordered)
    return [Explanation(i.topic, i.partition, i.from_offset, i.until_offset, "skip", Reason("pruned", n))
            for n, i in enumerate(found)]


def _gaps(rows: list[RangeRow], explanations: list[Explanation],
          positions: dict[tuple[str, int, int], int] | None = None) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    """Per partition: offsets in unexplained gaps, offsets in gaps explained as pruned."""
    unexplained: dict[int, set[int]] = {0: set(), 1: set()}
    pruned: dict[int, set[int]] = {0: set(), 1: set()}
    for result in verify_ranges(sorted(rows, key=sort_key), explanations, positions):
        for s in result.stretches:
            assert s.kind == "gap", s
            into = pruned if s.explained else unexplained
            if s.explained:
                assert {r.kind for r in s.reasons} == {"pruned"}
            into[s.partition].update(range(s.from_offset, s.until_offset))
    return unexplained, pruned


def _reads(deleted: list[RangeRow]) -> list[RangeRow]:
    ordered = sorted(deleted, key=lambda r: (r.query_id, r.topic, r.partition, r.batch_id))
    found = islands(DeletedRange("p", "g", r.query_id, r.topic, r.partition, r.batch_id, r.from_offset,
                                 r.until_offset, T) for r in ordered)
    return [x for i in found for x in island_reads(i.topic, i.partition, i.query_id, i.from_batch_id,
                                                   i.until_batch_id, i.from_offset, i.first_until_offset,
                                                   i.until_offset)]


@settings(max_examples=200, deadline=None)
@given(history())
def test_after_a_prune_verify_reports_the_same_holes(h) -> None:  # type: ignore[no-untyped-def]
    rows, holes, deleted, positions = h
    before, _ = _gaps(rows, [], positions)
    kept = [r for r in rows if r not in deleted]
    after, pruned = _gaps(kept + _reads(deleted), [], positions)
    assert after == before and pruned == {0: set(), 1: set()}


def test_without_the_record_the_pruned_stretch_is_an_unexplained_gap() -> None:
    rows = [RangeRow("t", 0, b * 10, b * 10 + 10, "q0", b) for b in range(5)]
    kept = [rows[0], rows[4]]
    after, _ = _gaps(kept, [])
    assert after[0] == set(range(10, 40))
    after, pruned = _gaps(kept + _reads(rows[1:4]), [])
    assert after[0] == set() and pruned[0] == set()
    # 0009's record explained the gap by name instead.
    after, pruned = _gaps(kept, _explanations(rows[1:4]))
    assert after[0] == set() and pruned[0] == set(range(10, 40))


def test_an_unknown_start_keeps_its_own_row_and_a_second_source_is_a_read() -> None:
    deleted = [DeletedRange("p", "g", "q1", "t", 0, 0, None, 15, T), DeletedRange("p", "g", "q1", "t", 0, 1, 15, 20, T),
               DeletedRange("p", "g", "q1", "t", 0, 1, 15, 20, T, 1), DeletedRange("p", "g", "q1", "t", 0, 2, 20, 30, T)]
    found = [(i.from_offset, i.first_until_offset, i.until_offset, i.from_batch_id, i.until_batch_id)
             for i in islands(deleted)]
    assert found == [(None, 15, 20, 0, 1), (15, 20, 30, 1, 2)]
    reads = [x for i in islands(deleted) for x in island_reads(i.topic, i.partition, i.query_id, i.from_batch_id,
                                                               i.until_batch_id, i.from_offset, i.first_until_offset,
                                                               i.until_offset)]
    assert [(r.from_offset, r.until_offset, r.batch_id) for r in reads] == [(None, 15, 0), (15, 20, 1), (15, 30, 2)]


def test_a_hole_between_deleted_batches_splits_the_island() -> None:
    deleted = [RangeRow("t", 0, 0, 10, "q0", 0), RangeRow("t", 0, 15, 20, "q0", 2)]  # batch 1 [10, 15) missing
    found = list(islands(DeletedRange("p", "g", r.query_id, r.topic, r.partition, r.batch_id, r.from_offset,
                                      r.until_offset, T) for r in deleted))
    assert [(i.from_offset, i.until_offset, i.from_batch_id, i.until_batch_id) for i in found] == [(0, 10, 0, 0),
                                                                                                   (15, 20, 2, 2)]


def test_out_of_order_rows_are_refused() -> None:
    rows = [DeletedRange("p", "g", "q0", "t", 0, 2, 20, 30, T), DeletedRange("p", "g", "q0", "t", 0, 1, 10, 20, T)]
    with pytest.raises(ValueError, match="out of order"):
        list(islands(rows))
