"""kafka-consumer-groups' CSV and durations: what --from-file reads and --export writes."""

from __future__ import annotations


import pytest
from hypothesis import given
from hypothesis import strategies as st

from offset_ledger.errors import InvalidInput, InvalidOffset
from offset_ledger.operate.kcg import export_csv, parse_offsets_csv
from offset_ledger.rules.model import TopicPartition
from offset_ledger.rules.resets import PartitionReset


def test_kcg_exports_are_read_quoted_or_not_with_an_optional_header() -> None:
    kcg = '"orders_v2",1,7\n"orders_v2",0,7\n\n'  # as KCG 4.x writes names with underscores
    assert parse_offsets_csv(kcg, source="f") == {TopicPartition("orders_v2", 0): 7,
                                                  TopicPartition("orders_v2", 1): 7}
    assert parse_offsets_csv("topic,partition,offset\norders,0,-2\n", source="f") == {
        TopicPartition("orders", 0): -2}


@pytest.mark.parametrize("text, error", [
    ("", "no offsets"), ("orders,0\n", "2 fields"), ("orders,0,x\n", "not an integer"),
    ("orders,a,1\n", "invalid partition"), ("bad topic!,0,1\n", "invalid topic"),
    ("orders,0,1\norders,0,2\n", "twice"),
])
def test_bad_rows_say_which_row(text: str, error: str) -> None:
    with pytest.raises(InvalidInput, match=error):
        parse_offsets_csv(text, source="f")
    with pytest.raises(InvalidOffset):
        parse_offsets_csv("orders,0,-7\n", source="f")


@given(st.dictionaries(st.tuples(st.sampled_from(["a", "b.c", "d_e-f"]), st.integers(0, 999)),
                       st.integers(0, 2**63 - 1), min_size=1, max_size=20))
def test_export_reads_back_exactly(targets: dict[tuple[str, int], int]) -> None:
    plan = [PartitionReset(t, p, None, o, o, 0, o) for (t, p), o in targets.items()]
    assert parse_offsets_csv(export_csv(plan), source="f") == {TopicPartition(t, p): o for (t, p), o in targets.items()}


