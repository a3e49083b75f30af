"""``plan_cost`` skips the partitions that do not move; what it reports equals costing every partition."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from offset_ledger.operate.move_cost import cost_of_moves, moves_between, plan_cost
from offset_ledger.rules.model import Position, TopicPartition, Watermarks
from offset_ledger.operate.answers import move_cost_answer


class _Cluster:
    """Log sizes and record timestamps of an in-memory log: every record at 1 s x its offset."""

    def log_sizes(self, topics):  # type: ignore[no-untyped-def]
        return {TopicPartition(t, p): 100 * 50 for t in topics for p in range(4)}

    def record_timestamps(self, wanted, timeout_ms):  # type: ignore[no-untyped-def]
        return {(tp, o): 1_000 * o for tp, o in wanted}


@st.composite
def restart(draw):  # type: ignore[no-untyped-def]
    marks, positions, starting = {}, [], {}
    for topic in ("a", "b"):
        for part in range(draw(st.integers(0, 4))):
            start = draw(st.integers(0, 20))
            end = draw(st.integers(start, start + 30))
            marks[TopicPartition(topic, part)] = Watermarks(start, end)
            if draw(st.booleans()):
                positions.append(Position(topic, part, draw(st.integers(0, end + 5))))
            chosen = draw(st.sampled_from(["stay", "sentinel", "other"]))
            here = next((p.next_offset for p in positions if (p.topic, p.partition) == (topic, part)), 0)
            target = here if chosen == "stay" else draw(st.sampled_from([-2, -1])) if chosen == "sentinel" \
                else draw(st.integers(0, end + 5))
            starting.setdefault(topic, {})[str(part)] = target
    return starting, positions, marks


@given(restart())
def test_plan_cost_reports_what_costing_every_partition_reports(case) -> None:  # type: ignore[no-untyped-def]
    starting, positions, marks = case
    before = {TopicPartition(p.topic, p.partition): p.next_offset for p in positions}
    after = {TopicPartition(t, int(p)): o for t, parts in starting.items() for p, o in parts.items()
             if TopicPartition(t, int(p)) in before}
    every = cost_of_moves(_Cluster(), moves_between(before, after, marks), marks)
    fast = plan_cost(_Cluster(), starting, positions, marks)
    assert move_cost_answer(fast) == move_cost_answer(every)  # the answer omits partitions that stay
    assert [p for p in fast.partitions if p.direction != "none"] == \
        [p for p in every.partitions if p.direction != "none"]
    # Partitions asked to start where they stand are no rows at all.
    staying = {tp for tp, o in after.items() if o == before[tp]}
    assert not staying & {p.tp for p in fast.partitions}
