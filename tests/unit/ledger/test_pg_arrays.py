"""The array literals the one-round-trip statements send: what Postgres' array input reads back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from offset_ledger.ledger.records import pg_int_array


@given(st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.booleans())))
def test_an_int_array_literal_is_its_elements_in_order(values: list) -> None:  # type: ignore[type-arg]
    literal = pg_int_array(values)
    assert literal[0] == "{" and literal[-1] == "}"
    inner = literal[1:-1]
    read = [] if not inner else [None if x == "NULL" else int(x) for x in inner.split(",")]
    assert read == [None if v is None else int(v) for v in values]
    assert pg_int_array(tuple(values)) == literal
