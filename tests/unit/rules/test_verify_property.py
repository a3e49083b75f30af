"""The exactly-once sweep (``offset_ledger.rules.verify``) against an offset-by-offset oracle, with hypothesis.

Histories are generated the way a pipeline makes them: batches that tile, restarts (new query, same
offset), resets forward and back (each an explanation), zombies re-reading old stretches (rows that
carry their finding), a pending reset at the end, and a re-created topic (a second incarnation).
Such a history is always fully explained; punching a gap or an overlap into a clean stretch must
be reported as exactly that stretch, and any mutation at all must match the oracle exactly.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offset_ledger.rules.verify import (
    BatchRef,
    Explanation,
    RangeRow,
    Reason,
    move_explanation,
    reset_explanations,
    sort_key,
    summarize,
    verify_ranges,
)

TOPIC = "orders"


@dataclass
class History:
    rows: list[RangeRow]
    explanations: list[Explanation]
    positions: dict[tuple[str, int, int], int]


@st.composite
def partition_history(draw, partition: int, incarnation: int, ids: Counter) -> tuple[list[RangeRow], list[Explanation], int]:  # type: ignore[no-untyped-def]
    pos = draw(st.integers(0, 40))
    rows: list[RangeRow] = []
    exps: list[Explanation] = []
    query, batch = 0, 0
    for _ in range(draw(st.integers(1, 30))):
        action = draw(st.sampled_from(["batch"] * 8 + ["restart", "reset", "zombie", "empty"]))
        if action == "batch":
            n = draw(st.integers(1, 12))
            rows.append(RangeRow(TOPIC, partition, pos, pos + n, f"q{incarnation}-{query}", batch, incarnation))
            pos += n
            batch += 1
        elif action == "empty":
            rows.append(RangeRow(TOPIC, partition, pos, pos, f"q{incarnation}-{query}", batch, incarnation))
            batch += 1
        elif action == "restart":
            query, batch = query + 1, 0
        elif action == "reset":
            ids["reset"] += 1
            new = draw(st.integers(max(0, pos - 30), pos + 30))
            exps.extend(reset_explanations(ids["reset"], "alice", "test", "offsets",
                                           [(TOPIC, partition, pos, new)], {(TOPIC, partition): incarnation}))
            pos = new
            query, batch = query + 1, 0
        elif action == "zombie" and any(r.until_offset > r.from_offset for r in rows):
            # A stale instance re-reads part of what a batch read before.
            ids["finding"] += 1
            old = draw(st.sampled_from([r for r in rows if r.until_offset > r.from_offset]))
            a = draw(st.integers(old.from_offset, old.until_offset - 1))
            b = draw(st.integers(a + 1, old.until_offset))
            rows.append(RangeRow(TOPIC, partition, a, b, f"zombie-{ids['finding']}", 7, incarnation,
                                 Reason("foreign_run", ids["finding"], "old checkpoint")))
    return rows, exps, pos


@st.composite
def histories(draw) -> History:  # type: ignore[no-untyped-def]
    ids: Counter = Counter()
    rows: list[RangeRow] = []
    exps: list[Explanation] = []
    positions: dict[tuple[str, int, int], int] = {}
    for partition in range(draw(st.integers(1, 2))):
        incarnations = draw(st.integers(1, 2))
        for inc in range(incarnations):
            r, e, pos = draw(partition_history(partition, inc, ids))
            rows += r
            exps += e
            positions[(TOPIC, partition, inc)] = pos
    rows.sort(key=sort_key)
    return History(rows, exps, positions)


def oracle(h: History) -> list[tuple]:
    """Offset by offset: read count vs expected, explained by covering explanations and flagged rows."""
    out: list[tuple] = []
    keys = sorted({(r.topic, r.partition, r.incarnation) for r in h.rows})
    for topic, partition, inc in keys:
        rows = [r for r in h.rows if (r.topic, r.partition, r.incarnation) == (topic, partition, inc)]
        exps = [e for e in h.explanations if (e.topic, e.partition, e.incarnation) == (topic, partition, inc)]
        position = h.positions.get((topic, partition, inc))
        first = min(r.from_offset for r in rows)
        end = max(r.until_offset for r in rows)
        if position is not None:
            end = max(end, position)
        pieces: list[list] = []
        for x in range(first, end):
            covering = [r for r in rows if r.from_offset <= x < r.until_offset]
            expected = 1 if position is None or x < position else 0
            extra = len(covering) - expected
            here = [e for e in exps if e.from_offset <= x < e.until_offset]
            if extra == 0:
                continue
            if extra < 0:
                reasons = {e.reason for e in here if e.effect == "skip"}
                explained = bool(reasons)
                kind = "gap"
            else:
                own = [r.extra_read for r in covering if r.extra_read is not None]
                rereads = [e.reason for e in here if e.effect == "reread"]
                reasons = set(own) | set(rereads)
                explained = len(own) + len(rereads) >= extra
                kind = "overlap"
            sig = (kind, abs(extra), explained, tuple(sorted(reasons, key=Reason.key)),
                   kind == "overlap" and position is not None and x >= position)
            if pieces and pieces[-1][1] == x and pieces[-1][2] == sig:
                pieces[-1][1] = x + 1
            else:
                pieces.append([x, x + 1, sig])
        out += [(topic, partition, inc, a, b, *sig) for a, b, sig in pieces]
    return out


def swept(h: History) -> list[tuple]:
    return [(s.topic, s.partition, s.incarnation, s.from_offset, s.until_offset, s.kind, s.times, s.explained,
             s.reasons, s.beyond_position)
            for result in verify_ranges(h.rows, h.explanations, h.positions) for s in result.stretches]


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(histories())
def test_a_history_made_of_batches_restarts_resets_and_zombies_is_fully_explained(h: History) -> None:
    found = swept(h)
    assert found == oracle(h)
    assert [s for s in found if not s[7]] == []


@FAST
@given(histories(), st.data())
def test_any_mutation_of_the_rows_is_reported_exactly_as_the_oracle_says(h: History, data) -> None:  # type: ignore[no-untyped-def]
    rows = list(h.rows)
    for _ in range(data.draw(st.integers(1, 4))):
        if not rows:
            break
        i = data.draw(st.integers(0, len(rows) - 1))
        r = rows[i]
        what = data.draw(st.sampled_from(["shift_from", "shift_until", "drop", "duplicate"]))
        if what == "shift_from":
            new = data.draw(st.integers(max(0, r.from_offset - 10), r.until_offset))
            rows[i] = r._replace(from_offset=new)
        elif what == "shift_until":
            rows[i] = r._replace(until_offset=data.draw(st.integers(r.from_offset, r.until_offset + 10)))
        elif what == "drop":
            rows.pop(i)
        else:
            rows.append(r._replace(batch_id=r.batch_id + 1000, extra_read=None))
    rows.sort(key=sort_key)
    mutated = History(rows, h.explanations, h.positions)
    assert swept(mutated) == oracle(mutated)


def _clean_offsets(h: History, partition: int, inc: int) -> set[int]:
    """Offsets read exactly once, below the position, that no explanation covers."""
    rows = [r for r in h.rows if (r.partition, r.incarnation) == (partition, inc)]
    position = h.positions.get((TOPIC, partition, inc))
    counts: Counter = Counter()
    for r in rows:
        counts.update(range(r.from_offset, r.until_offset))
    covered = {x for e in h.explanations if (e.partition, e.incarnation) == (partition, inc)
               for x in range(e.from_offset, e.until_offset)}
    return {x for x, n in counts.items() if n == 1 and x not in covered and (position is None or x < position)}


@FAST
@given(histories(), st.data())
def test_a_gap_and_an_overlap_punched_into_clean_history_are_exactly_what_is_reported(h: History, data) -> None:  # type: ignore[no-untyped-def]
    # Candidates: an unflagged row whose whole range is clean, and (for the overlap) the row that
    # ends where it starts, clean as well.
    clean = {(p, i): _clean_offsets(h, p, i) for p, i in {(r.partition, r.incarnation) for r in h.rows}}
    candidates = [k for k, r in enumerate(h.rows) if r.extra_read is None and r.until_offset - r.from_offset >= 2
                  and set(range(r.from_offset, r.until_offset)) <= clean[(r.partition, r.incarnation)]]
    if not candidates:
        return
    k = data.draw(st.sampled_from(candidates))
    r = h.rows[k]
    rows = list(h.rows)
    expected: list[tuple] = []
    cut = data.draw(st.integers(1, r.until_offset - r.from_offset - 1))
    starts_later = any(o.from_offset < r.from_offset for o in h.rows
                       if (o.partition, o.incarnation) == (r.partition, r.incarnation))
    if starts_later and data.draw(st.booleans()):  # (cutting the very first start only moves the start)
        rows[k] = r._replace(from_offset=r.from_offset + cut)  # a gap [from, from + cut)
        expected.append((r.partition, r.incarnation, r.from_offset, r.from_offset + cut, "gap"))
    else:
        ok = clean[(r.partition, r.incarnation)]
        back = 0
        while back < cut and (r.from_offset - back - 1) in ok:
            back += 1
        if back == 0:
            return
        rows[k] = r._replace(from_offset=r.from_offset - back)  # an overlap [from - back, from)
        expected.append((r.partition, r.incarnation, r.from_offset - back, r.from_offset, "overlap"))
    rows.sort(key=sort_key)
    found = [(s.partition, s.incarnation, s.from_offset, s.until_offset, s.kind)
             for res in verify_ranges(rows, h.explanations, h.positions) for s in res.stretches if not s.explained]
    assert found == expected


def test_a_reset_backwards_explains_the_reread_and_names_itself() -> None:
    rows = [RangeRow(TOPIC, 0, 0, 10, "q1", 0), RangeRow(TOPIC, 0, 10, 20, "q1", 1),
            RangeRow(TOPIC, 0, 15, 25, "q2", 0), RangeRow(TOPIC, 0, 25, 30, "q2", 1)]
    exps = reset_explanations(7, "alice", "replay", "shift", [(TOPIC, 0, 20, 15)])
    (result,) = verify_ranges(sorted(rows, key=sort_key), exps, {(TOPIC, 0, 0): 30})
    (stretch,) = result.stretches
    assert (stretch.from_offset, stretch.until_offset, stretch.kind, stretch.explained) == (15, 20, "overlap", True)
    assert stretch.reasons == (Reason("reset", 7, "shift by alice: replay"),)
    assert {b.query_id for b in stretch.batches} == {"q1", "q2"}
    assert result.first_offset == 0 and result.end_offset == 30 and result.ok


def test_an_unexplained_gap_names_the_batches_around_it_and_the_tail_counts_up_to_the_position() -> None:
    rows = [RangeRow(TOPIC, 0, 0, 10, "q", 0), RangeRow(TOPIC, 0, 12, 20, "q", 1)]
    (result,) = verify_ranges(rows, (), {(TOPIC, 0, 0): 25})
    gap, tail = result.stretches
    assert (gap.from_offset, gap.until_offset, gap.kind, gap.explained) == (10, 12, "gap", False)
    assert (gap.before.batch_id, gap.after.batch_id) == (0, 1)
    # Past the last batch up to the position: nothing read, yet the position says it was.
    assert (tail.from_offset, tail.until_offset, tail.kind, tail.after) == (20, 25, "gap", None)
    assert not result.ok


def test_a_pending_reset_back_explains_what_will_be_read_again() -> None:
    rows = [RangeRow(TOPIC, 0, 0, 10, "q", 0), RangeRow(TOPIC, 0, 10, 20, "q", 1)]
    exps = reset_explanations(3, "bob", None, "earliest", [(TOPIC, 0, 20, 0)])
    (result,) = verify_ranges(rows, exps, {(TOPIC, 0, 0): 0})
    (s,) = result.stretches
    assert (s.from_offset, s.until_offset, s.kind, s.beyond_position, s.explained) == (0, 20, "overlap", True, True)


def test_a_start_that_was_never_reported_is_unknown_from_the_previous_end_never_read_once() -> None:
    # The first range's unknown start opens the history at its end (nothing claimed before it); the
    # second's leaves [20, 30) unknown: read once, skipped or read twice, nobody can say.
    rows = [RangeRow(TOPIC, 0, None, 10, "q0", 0), RangeRow(TOPIC, 0, 10, 20, "q0", 1),
            RangeRow(TOPIC, 0, None, 30, "q1", 0), RangeRow(TOPIC, 0, 30, 35, "q1", 1)]
    (result,) = verify_ranges(sorted(rows, key=sort_key), (), {(TOPIC, 0, 0): 35})
    assert result.unknown_starts == 2 and result.first_offset == 10 and not result.ok
    (s,) = result.stretches
    assert (s.from_offset, s.until_offset, s.kind, s.explained, s.reasons) == (20, 30, "unknown", False, ())
    assert s.before == BatchRef("q0", 1) and s.batches == (BatchRef("q1", 0),)
    assert summarize([result])["unknown"] == 1 and summarize([result])["unexplained"] == 1
    # An explanation does not make an unknown start known; a gap before it stays a gap of its own.
    exps = reset_explanations(3, "bob", None, "latest", [(TOPIC, 0, 20, 30)])
    (again,) = verify_ranges(sorted(rows, key=sort_key), exps, {(TOPIC, 0, 0): 35})
    assert [(x.kind, x.explained) for x in again.stretches] == [("unknown", False)]
    rows[2] = RangeRow(TOPIC, 0, 25, 30, "q1", 0)
    rows.append(RangeRow(TOPIC, 0, None, 40, "q2", 0))
    (gap,) = verify_ranges(sorted(rows, key=sort_key), (), {(TOPIC, 0, 0): 40})
    assert [(x.from_offset, x.until_offset, x.kind) for x in gap.stretches] == [(20, 25, "gap"), (35, 40, "unknown")]


def test_incarnations_are_swept_apart_and_the_position_belongs_to_the_latest() -> None:
    rows = [RangeRow(TOPIC, 0, 0, 100, "old", 0, 0), RangeRow(TOPIC, 0, 0, 5, "new", 0, 1),
            RangeRow(TOPIC, 0, 5, 9, "new", 1, 1)]
    results = list(verify_ranges(sorted(rows, key=sort_key), (), {(TOPIC, 0, 1): 9}))
    assert [(r.incarnation, r.first_offset, r.end_offset, r.position, r.stretches) for r in results] == [
        (0, 0, 100, None, []), (1, 0, 9, 9, [])]


def test_a_move_by_a_restart_finding_skips_or_rereads() -> None:
    why = Reason("data_loss", 4, "below log-start")
    assert move_explanation(TOPIC, 0, 10, 50, why) == Explanation(TOPIC, 0, 10, 50, "skip", why)
    assert move_explanation(TOPIC, 0, 50, 10, why) == Explanation(TOPIC, 0, 10, 50, "reread", why)
    assert move_explanation(TOPIC, 0, None, 10, why) is None


def test_rows_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError):
        list(verify_ranges([RangeRow(TOPIC, 0, 10, 20, "q", 1), RangeRow(TOPIC, 0, 0, 10, "q", 0)]))
    with pytest.raises(ValueError):
        list(verify_ranges([RangeRow("b", 0, 0, 1, "q", 0), RangeRow("a", 0, 0, 1, "q", 0)]))


def test_reads_whose_output_a_sink_refused_open_the_history_but_cover_nothing() -> None:
    # Generation 1's zombie read [10, 20) after the upgrade; the sink fenced it (no commit). The live job
    # was started by hand at latest (20): [10, 20) is in no output, a gap, not "read once".
    fenced = Reason("foreign_run", 7, "a run on generation 1's checkpoint", landed=False)
    rows = [RangeRow(TOPIC, 0, 0, 10, "q1", 0), RangeRow(TOPIC, 0, 10, 20, "zombie", 5, 0, fenced),
            RangeRow(TOPIC, 0, 20, 30, "q2", 0)]
    (result,) = verify_ranges(rows, (), {(TOPIC, 0, 0): 30})
    (gap,) = result.stretches
    assert (gap.from_offset, gap.until_offset, gap.kind, gap.explained) == (10, 20, "gap", False)
    assert (gap.before.query_id, gap.after.query_id) == ("q1", "q2")
    # The same batch, landed (a late commit the restart moved past): its reads count, its extra ones are explained.
    landed = [r._replace(extra_read=Reason("foreign_run", 7, "a run on generation 1's checkpoint")) for r in rows]
    assert next(iter(verify_ranges(landed, (), {(TOPIC, 0, 0): 30}))).stretches == []
    # Only refused reads: the history opens at their start, and up to the position nothing landed.
    (alone,) = verify_ranges([rows[1]], (), {(TOPIC, 0, 0): 25})
    assert [(s.from_offset, s.until_offset, s.kind) for s in alone.stretches] == [(10, 25, "gap")]
