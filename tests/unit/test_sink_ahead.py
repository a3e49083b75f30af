"""rules.sink_ahead: a plan moves past an older generation's output the positions never counted, or refuses.

The real-stack case is ``tests/integration/test_sink_delta.py`` (the Delta collision's recovery, long).
"""

from __future__ import annotations

import re

import pytest

from offset_ledger.errors import SinkFenced
from offset_ledger.rules.resolver import new_generation_reason
from offset_ledger.rules.sink_ahead import SinkCommitRange, sink_ahead, window_start


def _r(partition: int, start: int | None, end: int, position: int | None, *, sequence: int = 3,
       batch: int = 2) -> SinkCommitRange:
    return SinkCommitRange("s", sequence, 1, batch, 2, "t", partition, start, end, position)


def test_the_plan_moves_to_the_ends_the_commits_tile_from_the_position() -> None:
    ahead = sink_ahead([_r(0, 10, 15, 10), _r(1, 10, 15, 10), _r(1, 15, 18, 10, sequence=4, batch=3),
                        _r(2, 0, 7, 9)], pipeline="p")  # partition 2: behind the position, nothing to move
    assert ahead.ends == {("t", 0): 15, ("t", 1): 18}
    (finding,) = ahead.findings
    assert finding.kind == "sink_ahead"
    assert "sink 's' sequence 3 (table version 2, batch 2 of generation 1)" in finding.message
    assert "t[0] 10->15, t[1] 10->18" in finding.message
    # a commit that starts before the position and ends past it covers it too
    assert sink_ahead([_r(0, 5, 15, 10)], pipeline="p").ends == {("t", 0): 15}
    assert sink_ahead([], pipeline="p").ends == {}


@pytest.mark.parametrize(("ranges", "why"), [
    ([_r(0, 12, 15, 10)], "offsets 10-12 are in no commit"),
    ([_r(0, None, 15, 10)], "its start on t[0] is unknown"),
    ([_r(0, 0, 15, None)], "t[0] has no ledger position"),
])
def test_what_cannot_be_placed_is_refused_naming_the_version(ranges: list[SinkCommitRange], why: str) -> None:
    with pytest.raises(SinkFenced, match=re.escape(why)) as refused:
        sink_ahead(ranges, pipeline="p")
    assert "sequence 3 (table version 2, batch 2 of generation 1)" in str(refused.value)
    assert "Nothing was planned" in str(refused.value) and "reset --to-offsets" in str(refused.value)
    assert refused.value.details["table_version"] == 2


def test_a_commit_without_ranges_learned_after_the_generation_opened_is_refused() -> None:
    with pytest.raises(SinkFenced, match="does not know which offsets it read"):
        sink_ahead([], unranged=["sink 's' sequence 3 (table version 2, batch 2 of generation 1)"], pipeline="p")


def test_the_window_starts_at_the_last_deliberate_start() -> None:
    assert window_start([(1, "first", False), (2, "app_version", False), (3, "app_version", False)], 3) == 1
    assert window_start([(1, "first", False), (2, "reset", False), (3, "app_version", False)], 3) == 2
    assert window_start([(1, "first", False), (2, "app_version", True), (3, "requested", False)], 3) == 2
    assert window_start([(1, "first", False), (2, "data_loss", False)], 2) == 2  # nothing older counts
    assert window_start([(1, "first", False), (2, "reset", False)], 1) == 1  # a newer one is not the plan's


def test_a_moved_plan_takes_a_fresh_generation() -> None:
    same = dict(current_app_version="1", current_checkpoint_root="/ck", has_current=True, app_version="1",
                checkpoint_root="/ck", pending_resets=False, requested=False)
    assert new_generation_reason(**same) is None  # type: ignore[arg-type]
    assert new_generation_reason(**same, sink_ahead=True) == "sink_ahead"  # type: ignore[arg-type]
