"""The pure rule: is the checkpoint at a generation's location still the query that ran on it?"""

from __future__ import annotations

import pytest

from offset_ledger.rules.authority import GenerationRef, claimed_by_other, match_generation
from offset_ledger.rules.incarnation import checkpoint_incarnation, incarnation_finding
from offset_ledger.rules.resolver import new_generation_reason


@pytest.mark.parametrize(("ran", "exists", "claimed", "found", "expected"), [
    (True, True, "q1", "q1", "same"),
    (False, False, None, None, "same"),      # handed out, never started: no batch id used yet
    (True, False, "q1", None, "lost"),
    (True, True, "q1", None, "emptied"),
    (True, True, "q1", "q2", "recreated"),
    (True, True, None, "q2", "same"),        # nobody claimed it: q2 is its first query
])
def test_checkpoint_incarnation(ran: bool, exists: bool, claimed: str | None, found: str | None,
                                expected: str) -> None:
    assert checkpoint_incarnation(ran=ran, exists=exists, claimed_query_id=claimed, found_query_id=found) == expected


def test_the_finding_names_the_generation_and_both_queries() -> None:
    f = incarnation_finding("recreated", generation=1, location="/ck/gen-1-a", claimed_query_id="q1",
                            found_query_id="q2")
    assert f is not None and f.kind == "checkpoint_recreated"
    assert f.message.startswith("checkpoint of generation 1 at /ck/gen-1-a was re-created by query q2 (query q1 ran")
    assert incarnation_finding("same", generation=1, location="/x", claimed_query_id=None, found_query_id=None) is None


def test_a_lost_checkpoint_needs_a_fresh_generation_even_with_the_same_version() -> None:
    base = {"current_app_version": "1", "current_checkpoint_root": "/ck", "has_current": True, "app_version": "1",
            "checkpoint_root": "/ck", "pending_resets": False, "requested": False}
    assert new_generation_reason(**base) is None  # type: ignore[arg-type]
    assert new_generation_reason(**base, checkpoint_incarnation="lost") == "checkpoint_lost"  # type: ignore[arg-type]
    assert new_generation_reason(**base, checkpoint_incarnation="emptied") == "checkpoint_lost"  # type: ignore[arg-type]
    assert new_generation_reason(**base, checkpoint_incarnation="recreated") == "checkpoint_recreated"  # type: ignore[arg-type]


def test_generations_at_one_location_are_told_apart_by_their_query() -> None:
    old, new = GenerationRef(1, "/ck/gen-1-a", "q1"), GenerationRef(2, "/ck/gen-1-a", "q2")
    at = {"checkpoint_location": "/ck/gen-1-a", "query_seen_before": True}
    assert match_generation([old, new], query_id="q1", **at) == old  # type: ignore[arg-type]
    assert match_generation([old, new], query_id="q2", **at) == new  # type: ignore[arg-type]
    third = match_generation([old, new], query_id="q3", **at)  # type: ignore[arg-type]
    assert third == new and claimed_by_other(third, "q3")
    assert not claimed_by_other(GenerationRef(3, "/ck/gen-3-b", None), "q3")
