"""The mirror's commit decisions from literals (offset_ledger.kafka.mirror.plan_commits)."""

from __future__ import annotations

import json

from offset_ledger.kafka.mirror import LedgerPosition, epoch_of, metadata, plan_commits
from offset_ledger.rules.model import TopicPartition

A0, A1, A2, A3 = (TopicPartition("a", p) for p in range(4))


def ours(offset: int, epoch: int) -> tuple[int, str]:
    return offset, metadata("p", epoch, LedgerPosition(offset, "q", 1))


def test_forward_in_sync_and_never_backwards_within_an_epoch() -> None:
    ledger = {A0: LedgerPosition(10, "q", 3), A1: LedgerPosition(5, "q", 3), A2: LedgerPosition(7, "q", 3),
              A3: LedgerPosition(4, None, None, reset_pending=True)}
    committed = {A0: ours(8, 1), A1: ours(5, 1), A2: ours(9, 1)}
    commits, decisions = plan_commits("p", 1, ledger, committed)
    assert set(commits) == {A0}
    assert commits[A0][0] == 10
    assert [d.action for d in decisions] == ["commit", "in_sync", "behind_newer_commit", "reset_pending"]


def test_a_newer_epoch_moves_backwards() -> None:
    commits, _ = plan_commits("p", 2, {A0: LedgerPosition(3)}, {A0: ours(9, 1)})
    assert commits[A0][0] == 3
    assert epoch_of(commits[A0][1]) == 2


def test_foreign_commit_ahead_is_left() -> None:
    commits, decisions = plan_commits("p", 5, {A0: LedgerPosition(3)}, {A0: (9, "someone else")})
    assert commits == {} and decisions[0].action == "behind_newer_commit"


def test_first_commit_and_metadata() -> None:
    commits, _ = plan_commits("orders", 0, {A0: LedgerPosition(12, "qid", 7)}, {})
    doc = json.loads(commits[A0][1])
    assert doc == {"by": "offset-ledger", "pipeline": "orders", "epoch": 0, "batchId": 7, "queryId": "qid"}
    assert epoch_of("not json") is None
