"""``ledger.position_check.positions_moved`` on real PostgreSQL against the Python comparison (the oracle)."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import insert, update
from sqlalchemy.engine import Engine

from offset_ledger.ledger.position_check import positions_moved
from offset_ledger.ledger.queries import current_positions
from offset_ledger.ledger.tables import positions
from offset_ledger.rules.model import Position

T0 = datetime(2026, 11, 25, tzinfo=timezone.utc)
TOPICS = ["orders", 'we"ird,{topic}\\x', "other"]


def _oracle(conn, seen: list[Position], topics: list[str]) -> int:  # type: ignore[no-untyped-def]
    wanted = set(topics)
    theirs = current_positions(conn, "p", "p", topics)
    return len(set(theirs) ^ {s for s in seen if s.topic in wanted})


def test_positions_moved_counts_what_a_reread_would_find(ledger: Engine) -> None:
    with ledger.begin() as conn:
        conn.execute(insert(positions), [
            {"pipeline": "p", "consumer_group": "p", "topic": t, "partition": n, "next_offset": 10 * n,
             "updated_at": T0} for t in TOPICS for n in range(50)])
        # Another pipeline's rows on the same topics are never counted.
        conn.execute(insert(positions), [{"pipeline": "q", "consumer_group": "q", "topic": "orders", "partition": 0,
                                          "next_offset": 1, "updated_at": T0}])
    wanted = TOPICS[:2]
    with ledger.connect() as conn:
        seen = current_positions(conn, "p", "p", TOPICS)
        assert positions_moved(conn, "p", "p", wanted, seen) == 0 == _oracle(conn, seen, wanted)
    with ledger.begin() as conn:
        conn.execute(update(positions).where(positions.c.topic == TOPICS[1], positions.c.partition == 7)
                     .values(next_offset=71))
        conn.execute(update(positions).where(positions.c.topic == "other")
                     .values(next_offset=positions.c.next_offset + 1))  # not wanted
        conn.execute(insert(positions), [{"pipeline": "p", "consumer_group": "p", "topic": "orders",
                                          "partition": 50, "next_offset": 0, "updated_at": T0}])
    with ledger.connect() as conn:
        # One moved row counts twice (old and new value), the new partition once.
        assert positions_moved(conn, "p", "p", wanted, seen) == 3 == _oracle(conn, seen, wanted)
        assert positions_moved(conn, "p", "p", ["other"], seen) == 100 == _oracle(conn, seen, ["other"])  # 50 moved, each twice
        # Rows seen that are gone now (a dropped partition) count once each.
        assert positions_moved(conn, "p", "p", wanted, [*seen, Position("orders", 99, 5)]) == 4
        assert positions_moved(conn, "p", "p", wanted, []) == 101 == _oracle(conn, [], wanted)


def test_pipeline_footprint_topics_by_index_skip_equal_a_distinct(ledger: Engine) -> None:
    """The (group, topic) pairs the restart reads by skipping through the primary key, against a DISTINCT."""
    from sqlalchemy import select

    from offset_ledger.ledger.queries import pipeline_footprint

    rows = [{"pipeline": pipe, "consumer_group": group, "topic": topic, "partition": n, "next_offset": n,
             "updated_at": T0}
            for pipe in ("p", "p2", "o")
            for group in ("g", "G", "g-2", "ä")
            for topic in (*TOPICS, "a", "Z", "z_")
            for n in range(3 if pipe == "p" else 1)]
    with ledger.begin() as conn:
        conn.execute(insert(positions), rows)
    with ledger.connect() as conn:
        for pipe in ("p", "p2", "none"):
            got = {g: f["topics"] for g, f in pipeline_footprint(conn, pipe).items()}
            expected: dict[str, list[str]] = {}
            for g, t in conn.execute(select(positions.c.consumer_group, positions.c.topic).distinct()
                                     .where(positions.c.pipeline == pipe)
                                     .order_by(positions.c.consumer_group, positions.c.topic)):
                expected.setdefault(g, []).append(t)
            assert got == expected
            assert list(got) == list(expected)  # the same order
        assert len(pipeline_footprint(conn, "p")) == 4 and len(pipeline_footprint(conn, "p")["g"]["topics"]) == 6
