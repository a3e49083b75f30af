"""The pipeline status rule from literals (offset_ledger.rules.status)."""

from __future__ import annotations

from offset_ledger.rules.status import PartitionWindow, overall_status, partition_status


def w(**kw) -> PartitionWindow:  # type: ignore[no-untyped-def]
    base = dict(next_offset=100, log_end_offset=100, run_active=True, moved_in_window=True,
                consumed_in_window=50, highest_recent_end=100)
    base.update(kw)
    return PartitionWindow(**base)  # type: ignore[arg-type]


def test_caught_up_is_ok() -> None:
    assert partition_status(w()) == "OK"
    assert partition_status(w(run_active=False, moved_in_window=False)) == "OK"  # stopped but nothing to read


def test_unknown_lag_is_none() -> None:
    assert partition_status(w(log_end_offset=None)) is None
    assert partition_status(w(next_offset=None)) is None


def test_stopped_when_no_active_run_and_lag() -> None:
    assert partition_status(w(log_end_offset=130, run_active=False)) == "STOPPED"


def test_stalled_when_active_but_not_moving() -> None:
    assert partition_status(w(log_end_offset=130, moved_in_window=False, consumed_in_window=0)) == "STALLED"


def test_rewound_below_a_recent_end() -> None:
    assert partition_status(w(next_offset=40, log_end_offset=130, highest_recent_end=100)) == "REWOUND"
    # a stopped pipeline is STOPPED first: nothing is re-reading
    assert partition_status(w(next_offset=40, log_end_offset=130, highest_recent_end=100,
                              run_active=False)) == "STOPPED"


def test_lagging_without_samples_when_backlog_exceeds_window_throughput() -> None:
    assert partition_status(w(next_offset=100, log_end_offset=1000, consumed_in_window=50)) == "LAGGING"
    assert partition_status(w(next_offset=100, log_end_offset=120, consumed_in_window=50)) == "OK"


def test_lagging_with_samples_when_lag_grows() -> None:
    assert partition_status(w(log_end_offset=140, lag_samples=(10, 25))) == "LAGGING"
    assert partition_status(w(log_end_offset=105, lag_samples=(10, 25))) == "OK"  # shrinking
    assert partition_status(w(log_end_offset=140, lag_samples=(10, 0, 25))) == "OK"  # caught up in between


def test_overall_is_most_severe() -> None:
    assert overall_status(["OK", "LAGGING", None]) == "LAGGING"
    assert overall_status(["REWOUND", "LAGGING"]) == "REWOUND"
    assert overall_status(["STALLED", "REWOUND"]) == "STALLED"
    assert overall_status(["STALLED", "STOPPED", "OK"]) == "STOPPED"
    assert overall_status([None]) is None
