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


def test_which_commits_came_after_a_generation_opened_is_the_ledgers_order_never_a_clock(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A skewed clock can neither hide a zombie's late commit nor invent one (issue 33's remainder).

    The rule was ``recorded_at >= created_at - 1 hour``: a zombie's commit stamped two hours early was
    missed (its records written twice by the plan), and a pruned commit stamped a day late, which the
    ledger held before the generation opened, refused every restart. Now a commit counts when its
    ``sink_batches.id`` is above the floor the generation stored when it opened.
    """
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import insert, update

    from offset_ledger.ledger.engine import make_engine, upgrade
    from offset_ledger.ledger.generations import NewGeneration, create_generation
    from offset_ledger.ledger.sink_store import older_commits_ahead
    from offset_ledger.ledger.tables import batch_offsets, checkpoint_generations, positions, sink_batches

    engine = make_engine(f"sqlite:///{tmp_path}/ledger.db")
    upgrade(engine)
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)

    def opened(reason: str, at: datetime, position: int) -> int:
        with engine.begin() as conn:
            gen, _ = create_generation(conn, NewGeneration(
                                       pipeline="p", consumer_group="p", checkpoint_root="/ck", app_version=reason,
                                       reason=reason, starting_offsets={"t": {"0": position}},
                                       resolved_offsets={"t": {"0": position}}, now=at))
            return gen.id

    current = 0

    def committed(generation_id: int, sequence: int, recorded_at: datetime, read: tuple[int, int] | None) -> None:
        with engine.begin() as conn:
            conn.execute(insert(sink_batches).values(
                sink="s", pipeline="p", consumer_group="p", sequence=sequence, generation_id=generation_id,
                query_id="q1", batch_id=sequence, target="/t", row_count=10, committed_at=recorded_at,
                recorded_at=recorded_at))
            if read is not None:  # None: its ranges were pruned
                conn.execute(insert(batch_offsets).values(
                    pipeline="p", consumer_group="p", query_id="q1", batch_id=sequence, source_index=0, topic="t",
                    partition=0, from_offset=read[0], until_offset=read[1], batch_time=t0))
                if generation_id == current:  # only the authoritative generation's batches move positions
                    conn.execute(update(positions).where(positions.c.topic == "t").values(next_offset=read[1]))

    current = g1 = opened("first", t0, 0)
    committed(g1, 1, t0 + timedelta(days=1), None)        # the database's clock a day ahead; pruned since
    committed(g1, 2, t0 + timedelta(minutes=5), (10, 20))
    current = g2 = opened("app_version", t0 + timedelta(minutes=10), 20)
    committed(g1, 3, t0 - timedelta(hours=2), (20, 30))   # the zombie's late commit, its clock two hours behind
    with engine.connect() as conn:
        floor = conn.execute(select_floor(checkpoint_generations, g2)).scalar_one()
        ranges, unranged = older_commits_ahead(conn, "p", "p")
    assert floor == 2  # the two commits the ledger held when generation 2 opened
    assert [(r.sequence, r.generation, r.from_offset, r.until_offset, r.position) for r in ranges] == [(3, 1, 20, 30, 20)]
    assert unranged == []
    assert sink_ahead(ranges, pipeline="p").ends == {("t", 0): 30}
    # The clock rule on the same rows (a generation opened by a release before 0019 has no floor):
    # the late commit hidden, the pruned one invented.
    with engine.begin() as conn:
        conn.execute(update(checkpoint_generations).where(checkpoint_generations.c.id == g2)
                     .values(sink_batch_floor=None))
    with engine.connect() as conn:
        ranges, unranged = older_commits_ahead(conn, "p", "p")
    assert ranges == [] and unranged == ["sink 's' sequence 1 (batch 1 of generation 1)"]
    engine.dispose()


def select_floor(g, generation_id: int):  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    return select(g.c.sink_batch_floor).where(g.c.id == generation_id)


def test_migration_0019_gives_existing_generations_the_floor_the_clock_rule_gave_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import insert, select

    from offset_ledger.ledger.engine import downgrade, make_engine, upgrade
    from offset_ledger.ledger.tables import checkpoint_generations, sink_batches

    engine = make_engine(f"sqlite:///{tmp_path}/ledger.db")
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
    try:
        upgrade(engine, "0017")
        with engine.begin() as conn:
            for n, at in ((1, t0), (2, t0 + timedelta(hours=3))):
                conn.execute(insert(checkpoint_generations).values(
                    id=n, pipeline="p", consumer_group="p", generation=n, checkpoint_root="/ck", location=f"/ck/{n}",
                    reason="first" if n == 1 else "app_version", created_at=at))
            for seq, hours in ((1, 0.5), (2, 1.5), (3, 2.5)):
                conn.execute(insert(sink_batches).values(
                    id=seq, sink="s", pipeline="p", consumer_group="p", sequence=seq, generation_id=1, query_id="q",
                    batch_id=seq, target="/t", committed_at=t0, recorded_at=t0 + timedelta(hours=hours)))
        upgrade(engine)
        with engine.connect() as conn:
            floors = dict(conn.execute(select(checkpoint_generations.c.id, checkpoint_generations.c.sink_batch_floor)).all())
        # Generation 2 opened at 3 h: the clock rule counted commits recorded from 2 h on (sequence 3).
        assert floors == {1: 0, 2: 2}
        downgrade(engine, "0017")
        upgrade(engine)
    finally:
        engine.dispose()
