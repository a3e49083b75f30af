"""positions_and_window: every position, and the status window's facts about it, from one statement.

Oracle: the same facts computed in plain Python from the rows the test wrote (WindowFacts' rule:
records read = highest end - lowest known start of the window's batches; "rewound past" = a window
batch ended beyond the position; "moved" = a batch placed the position inside the window).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.tables import batch_offsets, positions
from offset_ledger.operate.lag_insight import WindowFacts, positions_and_window
from offset_ledger.rules.model import Position


def _expected(pos_rows: list[dict], batch_rows: list[dict], since: datetime):  # type: ignore[no-untyped-def]
    by_group: dict[tuple[str, str], list[Position]] = {}
    facts: dict[tuple[str, str, str, int], WindowFacts] = {}
    for p in sorted(pos_rows, key=lambda r: (r["pipeline"], r["consumer_group"], r["topic"], r["partition"])):
        key = (p["pipeline"], p["consumer_group"], p["topic"], p["partition"])
        by_group.setdefault(key[:2], []).append(Position(p["topic"], p["partition"], p["next_offset"]))
        window = [b for b in batch_rows if b["batch_time"] >= since
                  and (b["pipeline"], b["consumer_group"], b["topic"], b["partition"]) == key]
        moved = p["updated_at"] >= since and p["query_id"] is not None
        if window:
            hi = max(b["until_offset"] for b in window)
            starts = [b["from_offset"] for b in window if b["from_offset"] is not None]
            lo = min(starts) if starts else hi
            facts[key] = WindowFacts(max(0, hi - lo), hi if hi > p["next_offset"] else None, moved)
        elif moved:
            facts[key] = WindowFacts(0, None, True)
    return by_group, facts


@pytest.mark.parametrize("seed", range(6))
def test_positions_and_window_facts_match_the_rule_computed_from_the_rows(tmp_path, seed: int) -> None:
    rng = random.Random(seed)
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    now = datetime.now(timezone.utc)
    since = now - timedelta(minutes=5)
    pos_rows, batch_rows = [], []
    times: dict[tuple[str, int], datetime] = {}
    for pipeline in ("a", "b", "c"):
        for topic in ("t1", "t2"):
            for part in range(rng.randint(0, 4)):
                offset, batch_id = 0, 0
                for _ in range(rng.randint(0, 6)):
                    step = rng.randint(0, 30)
                    # inside and outside the window; one time per batch (a batch has one, its ranges share it)
                    at = times.setdefault((pipeline, batch_id), now - timedelta(minutes=rng.choice([1, 2, 4, 20, 60])))
                    batch_rows.append({"pipeline": pipeline, "consumer_group": pipeline, "query_id": f"q-{pipeline}",
                                       "batch_id": batch_id, "source_index": 0, "topic": topic,
                                       "partition": part, "from_offset": rng.choice([offset, None]),
                                       "until_offset": offset + step, "batch_time": at})
                    offset, batch_id = offset + step, batch_id + 1
                if rng.random() < 0.85:  # some partitions have batches but no position
                    pos_rows.append({"pipeline": pipeline, "consumer_group": pipeline, "topic": topic,
                                     "partition": part,
                                     "next_offset": max(0, offset - rng.choice([0, 0, 5])),  # some rewound
                                     "updated_at": now - timedelta(minutes=rng.choice([1, 30])),
                                     "query_id": rng.choice(["q", None])})
    with engine.begin() as conn:
        if pos_rows:
            conn.execute(insert(positions), pos_rows)
        if batch_rows:
            conn.execute(insert(batch_offsets), batch_rows)
    with engine.connect() as conn:
        everything = positions_and_window(conn, since)
        only_b = positions_and_window(conn, since, "b", "b")
    engine.dispose()

    expected_positions, expected_facts = _expected(pos_rows, batch_rows, since)
    assert everything == (expected_positions, expected_facts)
    assert only_b == ({k: v for k, v in expected_positions.items() if k == ("b", "b")},
                      {k: v for k, v in expected_facts.items() if k[:2] == ("b", "b")})


def test_each_kind_of_fact_by_hand(tmp_path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    now = datetime.now(timezone.utc)
    old = now - timedelta(hours=1)
    row = {"pipeline": "p", "consumer_group": "p", "topic": "t", "query_id": "q"}
    with engine.begin() as conn:
        conn.execute(insert(positions), [
            {**row, "partition": 0, "next_offset": 10, "updated_at": now},   # read 6 records in the window
            {**row, "partition": 1, "next_offset": 3, "updated_at": now},    # a batch ended past it: rewound
            {**row, "partition": 2, "next_offset": 7, "updated_at": now},    # moved, no batch in the window
            {**row, "partition": 3, "next_offset": 5, "updated_at": old},    # nothing in the window
        ])
        conn.execute(insert(batch_offsets), [
            {**row, "batch_id": 1, "source_index": 0, "partition": 0, "from_offset": 4, "until_offset": 10,
             "batch_time": now},
            {**row, "batch_id": 1, "source_index": 0, "partition": 1, "from_offset": 3, "until_offset": 9,
             "batch_time": now},
            {**row, "batch_id": 0, "source_index": 0, "partition": 3, "from_offset": 0, "until_offset": 5,
             "batch_time": old},
        ])
    with engine.connect() as conn:
        by_group, facts = positions_and_window(conn, now - timedelta(minutes=5))
    engine.dispose()
    assert by_group == {("p", "p"): [Position("t", 0, 10), Position("t", 1, 3), Position("t", 2, 7),
                                     Position("t", 3, 5)]}
    assert facts == {("p", "p", "t", 0): WindowFacts(6, None, True),
                     ("p", "p", "t", 1): WindowFacts(6, 9, True),
                     ("p", "p", "t", 2): WindowFacts(0, None, True)}
