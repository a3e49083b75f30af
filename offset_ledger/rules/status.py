"""Pure: a pipeline's status per partition and overall, like Burrow's consumer evaluation.

Evaluated over a window (``OFFSET_LEDGER_STATUS_WINDOW``, default 5m) of what the ledger already
has — the batches that moved each partition's position, the position now, the current log-end —
plus any earlier lag observations the evaluator kept (the API keeps those of recent scrapes).
Per partition, the first rule that applies wins:

1. lag unknown (Kafka not asked or no position) -> ``None``
2. ``STOPPED``  no active run and lag > 0: nothing will catch up.
3. ``REWOUND``  the position is below the highest end a batch recorded within the window: a reset
   or a restart moved it back and it is re-reading (until it passes that point or the window slides).
4. ``OK``       lag is 0.
5. ``STALLED``  a run is active, lag > 0, and no batch moved the position within the window.
6. ``LAGGING``  the position moves but lag grows: above the first lag observed in the window (with
   no 0 in between), or, without earlier observations, above what the pipeline consumed in the
   whole window (it would not catch up within one window at that pace).
7. ``OK``       moving and keeping up.

Overall: the most severe partition, STOPPED > STALLED > REWOUND > LAGGING > OK; and ``ERR`` above
them all when the pipeline's history has records it never read (a batch read fewer rows than its
range spans and neither compaction nor transaction markers explain it: ``rules.read_shortfall``,
``operate.verify_loss``). ERR stays: those records are gone, as ``verify`` (exit 6) keeps saying.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

State = Literal["OK", "LAGGING", "STALLED", "STOPPED", "REWOUND", "ERR"]
STATES: tuple[State, ...] = ("OK", "LAGGING", "STALLED", "STOPPED", "REWOUND", "ERR")
_SEVERITY = {"OK": 0, "LAGGING": 1, "REWOUND": 2, "STALLED": 3, "STOPPED": 4, "ERR": 5}


@dataclass(frozen=True)
class PartitionWindow:
    """What the rule looks at for one partition."""

    next_offset: int | None
    log_end_offset: int | None
    run_active: bool
    moved_in_window: bool           # a batch moved the position within the window
    consumed_in_window: int = 0     # records the batches of the window read on this partition
    highest_recent_end: int | None = None  # highest until_offset a batch recorded within the window
    lag_samples: Sequence[int] = ()  # earlier lag observations within the window, oldest first

    @property
    def lag(self) -> int | None:
        if self.next_offset is None or self.log_end_offset is None:
            return None
        return max(0, self.log_end_offset - self.next_offset)


def partition_status(w: PartitionWindow) -> State | None:
    """The status of one partition (module docstring: the rule)."""
    return status_of(w.next_offset, w.log_end_offset, w.run_active, w.moved_in_window, w.consumed_in_window,
                     w.highest_recent_end, w.lag_samples)


def status_of(next_offset: int | None, log_end_offset: int | None, run_active: bool, moved_in_window: bool,
              consumed_in_window: int = 0, highest_recent_end: int | None = None,
              lag_samples: Sequence[int] = ()) -> State | None:
    """``partition_status`` over the fields of a ``PartitionWindow``, without building one: /metrics
    evaluates every partition of every pipeline on each scrape."""
    if next_offset is None or log_end_offset is None:
        return None
    lag = max(0, log_end_offset - next_offset)
    if not run_active and lag > 0:
        return "STOPPED"
    if highest_recent_end is not None and next_offset < highest_recent_end:
        return "REWOUND"
    if lag == 0:
        return "OK"
    if not moved_in_window:
        return "STALLED"
    if lag_samples:
        growing = lag > lag_samples[0] and all(s > 0 for s in lag_samples)
    else:
        growing = lag > consumed_in_window
    return "LAGGING" if growing else "OK"


def overall_status(states: Iterable[State | None]) -> State | None:
    """The most severe known partition status; None when none is known."""
    worst: State | None = None
    for s in states:
        if s is not None and (worst is None or _SEVERITY[s] > _SEVERITY[worst]):
            worst = s
    return worst


def with_lost_records(status: str | None, records_lost: int) -> str | None:
    """``ERR`` when the pipeline lost records (unexplained), else its status as it was."""
    return "ERR" if records_lost > 0 else status
