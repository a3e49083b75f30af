"""Records lost per pipeline and partition, for ``/metrics`` and the pipeline status (issue 41).

Each read-shortfall finding is judged once, as ``verify`` judges it (``operate.verify_loss``: a
compacted topic, or the offsets a read_committed consumer does not get, explain missing rows), and
the answer kept by finding id: a finding never changes, so a scrape reads Kafka only for findings
new since the last one. Without Kafka configured the shortfall counts as it was recorded; when
Kafka does not answer, new findings wait for a scrape when it does (no alarm on a guess). At most
``JUDGED_PER_CALL`` findings are judged per call (oldest first; a transactional topic has one per
batch, each a range read again): a long history is caught up over successive scrapes, not in one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from offset_ledger.operate.verify_loss import loss_stretches


if TYPE_CHECKING:
    from offset_ledger.kafka.adapter import KafkaAdapter

#: findings judged per call at most (each may read its batch's range from Kafka)
JUDGED_PER_CALL = 500

#: (pipeline, consumer group, topic, partition)
LossKey = tuple[str, str, str, int]


class LossBook:
    """Unexplained lost records per (pipeline, group, topic, partition); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen = 0  # the highest finding id judged
        self._lost: dict[LossKey, int] = {}

    @property
    def seen(self) -> int:
        return self._seen

    def add(self, rows: Sequence[tuple[int, str, str, str, int, dict[str, Any]]],
            kafka: KafkaAdapter | None) -> dict[LossKey, int]:
        """Judge ``rows`` (findings after ``seen``, in id order); the totals so far."""
        with self._lock:
            rows = [r for r in rows if r[0] > self._seen][:JUDGED_PER_CALL]
            if rows:
                check = loss_stretches([(r[0], r[3], r[4], r[5]) for r in rows], kafka)
                if check.checked or kafka is None:
                    where = {r[0]: (r[1], r[2]) for r in rows}
                    for finding_id, s in check.stretches:
                        if not s.explained:
                            key = (*where[finding_id], s.topic, s.partition)
                            self._lost[key] = self._lost.get(key, 0) + s.lost
                    self._seen = rows[-1][0]
            return dict(self._lost)


def per_pipeline(lost: dict[LossKey, int]) -> dict[tuple[str, str], int]:
    """Lost records per (pipeline, consumer group)."""
    out: dict[tuple[str, str], int] = {}
    for (pipeline, group, _, _), n in lost.items():
        out[(pipeline, group)] = out.get((pipeline, group), 0) + n
    return out
