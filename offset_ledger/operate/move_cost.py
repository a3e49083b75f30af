"""The cost of a move, read from the cluster: record timestamps at both ends of each moved range and
the partitions' log sizes, handed to the pure ``offset_ledger.rules.move_cost``.

Best effort by design: the figures inform a decision, they never block one. A broker that refuses
DescribeLogDirs (no DESCRIBE on the cluster) leaves the bytes unknown, a record that does not
arrive in time leaves its timestamp unknown; the answer says so (``complete: false``) instead of
failing the dry run or the restart.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from offset_ledger.errors import KafkaError
from offset_ledger.rules.model import Position, TopicPartition, Watermarks
from offset_ledger.rules.move_cost import Move, MoveCost, move_cost, moved_range, wanted_timestamps
from offset_ledger.rules.resets import ResetPlan

log = logging.getLogger(__name__)


def cost_of_moves(kafka: Any, moves: Iterable[Move], marks: Mapping[TopicPartition, Watermarks],
                  *, timeout_ms: int = 3000) -> MoveCost:
    """``move_cost`` with the cluster's log sizes and record timestamps for the partitions that move."""
    moves = list(moves)
    moving = [m for m in moves if _passes_records(m, marks)]
    sizes: dict[TopicPartition, int] = {}
    times: dict[tuple[TopicPartition, int], int] = {}
    # Adapters without these calls (a test's in-memory cluster) leave the figures unknown.
    if moving and hasattr(kafka, "log_sizes"):
        try:
            sizes = kafka.log_sizes(sorted({m.tp.topic for m in moving}))
        except KafkaError as exc:
            log.info("the cost of a move: log sizes unavailable (%s); bytes left unknown", exc)
    if moving and hasattr(kafka, "record_timestamps"):
        try:
            times = kafka.record_timestamps(wanted_timestamps(moving, marks), timeout_ms=timeout_ms)
        except KafkaError as exc:
            log.info("the cost of a move: record timestamps unavailable (%s); time span left unknown", exc)
    return move_cost(moves, marks, sizes, times)


def reset_cost(kafka: Any, plan: ResetPlan) -> MoveCost:
    """What a reset plan re-reads and skips, against the watermarks it was planned on; a refused
    partition moves nothing and is not counted."""
    moving = [p for p in plan.partitions if not p.refused]
    marks = {p.tp: Watermarks(p.log_start_offset, p.log_end_offset) for p in moving}
    moves = [Move(p.tp, p.log_start_offset if p.before_next_offset is None else p.before_next_offset,
                  p.target_next_offset) for p in moving]
    return cost_of_moves(kafka, moves, marks)


def plan_cost(kafka: Any, starting_offsets: Mapping[str, Mapping[str, int]], positions: Iterable[Position],
              marks: Mapping[TopicPartition, Watermarks]) -> MoveCost:
    """What starting at ``starting_offsets`` re-reads or skips against the ledger's ``positions``.

    Only partitions with a position count: a new partition's first read is no move. Partitions that
    start where they stand are left out of ``partitions`` (they re-read and skip nothing): a restart
    usually moves none of its partitions, so they are compared on plain keys first, before any cost
    row is built (docs/benchmarks.md).
    """
    before = {(p.topic, p.partition): p.next_offset for p in positions}
    after: dict[TopicPartition, int] = {}
    starts: dict[TopicPartition, int] = {}
    for t, parts in starting_offsets.items():
        for part, o in parts.items():
            key = (t, int(part))
            start = before.get(key)
            if start is None or (o == start and o >= 0):  # no position, or no move (sentinels are < 0)
                continue
            tp = TopicPartition(*key)
            after[tp] = int(o)
            starts[tp] = start
    return cost_of_moves(kafka, moves_between(starts, after, marks), marks)


def moves_between(before: Mapping[TopicPartition, int | None], after: Mapping[TopicPartition, int],
                  marks: Mapping[TopicPartition, Watermarks]) -> list[Move]:
    """Moves from ``before`` (None: no position yet, counted from the log-start like the resolver's
    new-partition rule) to ``after``; the sentinels -2 (earliest) and -1 (latest) resolved on ``marks``."""
    out = []
    for tp, target in after.items():
        m = marks.get(tp)
        if m is None:
            continue
        to_next = m.log_start_offset if target == -2 else m.log_end_offset if target == -1 else target
        start = before.get(tp)
        out.append(Move(tp, m.log_start_offset if start is None else start, to_next))
    return out


def _passes_records(move: Move, marks: Mapping[TopicPartition, Watermarks]) -> bool:
    _direction, first, end = moved_range(move, marks.get(move.tp))
    return end > first
