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


def test_a_late_commit_of_an_older_generation_fences_the_current_one() -> None:
    from offset_ledger.rules.sink_ahead import late_commit

    assert late_commit([]) is None and late_commit([_r(0, 0, 10, 10)]) is None  # behind the positions: history
    why = late_commit([_r(1, 20, 25, 20, sequence=5, batch=4), _r(0, 20, 25, 20, sequence=5, batch=4)])
    assert why is not None and "sequence 5 (table version 2, batch 4 of generation 1)" in why
    assert "t[0] up to 25 after this generation opened at 20" in why and "sinks=[sink]" in why


def test_the_ledger_names_older_generations_commits_past_the_positions_since_the_last_deliberate_start(
        tmp_path: object) -> None:
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import insert

    from offset_ledger.ledger.engine import make_engine, upgrade
    from offset_ledger.ledger.sink_store import older_commits_ahead
    from offset_ledger.ledger.tables import batch_offsets, checkpoint_generations, positions, sink_batches

    engine = make_engine(f"sqlite:///{tmp_path}/ledger.db")
    upgrade(engine)
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)

    def generation(n: int, reason: str) -> None:
        with engine.begin() as conn:
            conn.execute(insert(checkpoint_generations).values(
                id=n, pipeline="p", consumer_group="p", generation=n, checkpoint_root="/ck", location=f"/ck/{n}",
                reason=reason, created_at=t0 + timedelta(hours=n)))

    generation(1, "first")
    generation(2, "app_version")
    with engine.begin() as conn:
        for seq, (frm, until) in enumerate([(0, 10), (10, 20), (20, 30)], 1):  # gen 1's batches 0-2
            conn.execute(insert(sink_batches).values(
                sink="s", pipeline="p", consumer_group="p", sequence=seq, generation_id=1, query_id="q1",
                batch_id=seq - 1, target="/t", row_count=10, table_version=seq - 1, committed_at=t0,
                recorded_at=t0 + timedelta(hours=3)))
            conn.execute(insert(batch_offsets).values(
                pipeline="p", consumer_group="p", query_id="q1", batch_id=seq - 1, source_index=0, topic="t",
                partition=0, from_offset=frm, until_offset=until, batch_time=t0))
        conn.execute(insert(positions).values(pipeline="p", consumer_group="p", topic="t", partition=0,
                                              next_offset=20, updated_at=t0))
    with engine.connect() as conn:
        ranges, unranged = older_commits_ahead(conn, "p", "p")
    assert [(r.sequence, r.generation, r.from_offset, r.until_offset, r.position) for r in ranges] == [(3, 1, 20, 30, 20)]
    assert unranged == []
    assert sink_ahead(ranges, pipeline="p").ends == {("t", 0): 30}
    generation(3, "reset")  # the operator chose where to read: older commits are history
    with engine.connect() as conn:
        assert older_commits_ahead(conn, "p", "p") == ([], [])
    engine.dispose()
