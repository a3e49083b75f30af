"""``ledger.queries.positions_and_window_pg`` (a row per topic, unrolled in Python) against the
per-partition statement over ``v_positions`` it replaced on PostgreSQL (``ledger.lag_window``'s, the oracle)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import text
from sqlalchemy.engine import Engine

from offset_ledger.ledger import position_store
from offset_ledger.ledger.queries import positions_and_window_pg
from offset_ledger.ledger.position_store import Placed
from offset_ledger.ledger.lag_window import _positions_and_window_stmt
from offset_ledger.operate.lag_insight import positions_and_window

NOW = datetime.now(timezone.utc)
SINCE = NOW - timedelta(minutes=5)
OLD = NOW - timedelta(hours=1)


def _seed(conn) -> None:  # type: ignore[no-untyped-def]
    # p: two topics; "orders" with three movers (a batch in the window, a batch before it, a reset in the
    # window without a query: not "moved" by a batch), "payments" one mover; q: another pipeline, same topic.
    position_store.write(conn, "p", "p", {
        **{("orders", n): Placed(100 + n, NOW, "q1", 7) for n in (0, 2, 5)},
        **{("orders", n): Placed(50 + n, OLD, "q1", 3) for n in (1, 3)},
        ("orders", 4): Placed(40, NOW, None, None, 9),
        **{("payments", n): Placed(10 * n, OLD, "q1", 3) for n in range(3)},
    }, current={})
    position_store.write(conn, "q", "qg", {("orders", n): Placed(7, NOW, "qq", 1) for n in range(2)}, current={})
    for pipe, group, query, batch, at, topic, parts, frm, until in [
        ("p", "p", "q1", 6, NOW - timedelta(minutes=1), "orders", [0, 2, 5], [90, 92, 95], [99, 101, 104]),
        ("p", "p", "q1", 7, NOW, "orders", [0, 2, 5, 6], [99, 101, 104, None], [100, 102, 105, 3]),
        ("p", "p", "q1", 2, OLD, "payments", [0, 1, 2], [0, 5, 15], [0, 10, 20]),
        ("q", "qg", "qq", 1, NOW, "orders", [1], [3], [9]),
    ]:
        pk = conn.execute(text(
            "INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at,"
            " input_rows) VALUES (:p, :g, :q, 'r', :b, :t, :t, 1) RETURNING id"),
            {"p": pipe, "g": group, "q": query, "b": batch, "t": at}).scalar_one()
        conn.execute(text(
            "INSERT INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)"
            " VALUES (:pk, 0, :t, :parts, :f, :u)"), {"pk": pk, "t": topic, "parts": parts, "f": frm, "u": until})


def test_rows_per_topic_unrolled_equal_the_per_partition_statement(ledger: Engine) -> None:
    with ledger.begin() as conn:
        _seed(conn)
    with ledger.connect() as conn:
        oracle = [tuple(r) for r in conn.execute(_positions_and_window_stmt(False, True), {"since": SINCE}).all()]
        assert list(positions_and_window_pg(conn, SINCE)) == oracle
        assert len(oracle) == 11 and any(r[5] for r in oracle) and any(r[7] is not None for r in oracle)
        one = [tuple(r) for r in conn.execute(_positions_and_window_stmt(True, True),
                                              {"since": SINCE, "pipeline": "q", "consumer_group": "qg"}).all()]
        assert list(positions_and_window_pg(conn, SINCE, "q", "qg")) == one and len(one) == 2
        # The public read over it: positions sorted per pipeline and group, facts per partition.
        positions, facts = positions_and_window(conn, SINCE)
        assert [p.partition for p in positions[("p", "p")] if p.topic == "orders"] == [0, 1, 2, 3, 4, 5]
        assert facts[("p", "p", "orders", 0)].moved and not facts.get(("p", "p", "orders", 1))
