"""positions_and_window (one statement) answers exactly what all_positions + window_facts answer."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert

from offset_ledger.lag_insight import positions_and_window, window_facts
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.queries import all_positions
from offset_ledger.ledger.tables import batch_offsets, positions


@pytest.mark.parametrize("seed", range(6))
def test_one_statement_equals_the_three_it_replaces(tmp_path, seed: int) -> None:
    rng = random.Random(seed)
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    now = datetime.now(timezone.utc)
    since = now - timedelta(minutes=5)
    pos_rows, batch_rows = [], []
    for pipeline in ("a", "b", "c"):
        for topic in ("t1", "t2"):
            for part in range(rng.randint(0, 4)):
                offset, batch_id = 0, 0
                for _ in range(rng.randint(0, 6)):
                    step = rng.randint(0, 30)
                    at = now - timedelta(minutes=rng.choice([1, 2, 4, 20, 60]))  # inside and outside the window
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
        expected_positions = all_positions(conn)
        keys = {(p, g, x.topic, x.partition) for (p, g), xs in expected_positions.items() for x in xs}
        expected_facts = {k: v for k, v in window_facts(conn, since).items() if k in keys}
        got_positions, got_facts = positions_and_window(conn, since)
    engine.dispose()
    assert got_positions == expected_positions
    assert got_facts == expected_facts
    # the comparison is not vacuous: every position with a batch in the window has facts
    in_window = {(b["pipeline"], b["consumer_group"], b["topic"], b["partition"]) for b in batch_rows
                 if b["batch_time"] >= since}
    assert keys & in_window <= set(got_facts)
    assert got_facts or not keys & in_window
