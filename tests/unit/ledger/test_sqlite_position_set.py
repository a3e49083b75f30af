"""``offset_ledger_position_set``, SQLite's function behind ``v_positions``' triggers: its 15 SQL arguments
arrive as ``sqlite_set(*columns)`` and are read as a ``PositionSet``. The view's writes through it are
tested with the whole ledger in test_topic_positions_property.py; here, the arity and one call."""

from __future__ import annotations

import json
import sqlite3

import pytest

from offset_ledger.ledger.sqlite_positions import ARITY, PositionSet, sqlite_set


def test_the_sql_function_keeps_its_fifteen_arguments_and_sets_one_partition() -> None:
    assert ARITY == 15  # what ledger.engine registers and migration 0024's triggers pass
    db = sqlite3.connect(":memory:")
    db.create_function("offset_ledger_position_set", ARITY, sqlite_set, deterministic=True)
    row = ("[0,1]", None, "[5,7]", '["t0"]', "[1]", "[null]", "[null]", '["q"]')
    (out,) = db.execute("SELECT offset_ledger_position_set(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (*row, 1, 9, "t1", 2, None, None, "q")).fetchone()
    assert json.loads(out) == {"partitions": [0, 1], "stamps": [1, 2], "next_offsets": [5, 9],
                               "moved_at": ["t0", "t1"], "moved_batch_ids": [1, 2], "moved_reset_ids": [None, None],
                               "moved_generation_ids": [None, None], "moved_query_ids": ["q", "q"]}
    (dropped,) = db.execute("SELECT offset_ledger_position_set(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (*row, 0, None, None, None, None, None, None)).fetchone()
    assert json.loads(dropped)["partitions"] == [1] and json.loads(dropped)["stamps"] is None


def test_a_call_of_another_arity_is_refused() -> None:
    with pytest.raises(TypeError):
        PositionSet(*range(14))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sqlite_set(*range(16))
