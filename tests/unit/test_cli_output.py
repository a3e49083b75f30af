"""Tables line up under their headers; ids are not cut mid-word (issue 34 item 10)."""

from __future__ import annotations

import pytest

from offset_ledger.cli.support import emit, header, short_id


def test_rows_sit_under_their_headers(capsys: pytest.CaptureFixture[str]) -> None:
    # camelCase names grow by one underscore per word in the header: the widths follow the header.
    emit([{"consumerGroup": "g", "lastBatchTime": "t", "findings": 0, "why": "x"}],
         ["consumerGroup", "lastBatchTime", "findings", "why"], "table")
    head, row = capsys.readouterr().out.splitlines()
    assert [head.index(header(c)) for c in ("consumerGroup", "lastBatchTime", "findings", "why")] == [
        row.index(v) for v in ("g", "t", "0", "x")]


def test_run_ids_keep_their_kind() -> None:
    assert short_id("checkpoint:1a2b3c4d-0000-0000-0000-000000000000") == "checkpoint:1a2b3c4d"
    assert short_id("1a2b3c4d-0000-0000-0000-000000000000") == "1a2b3c4d"


def test_no_python_argument_in_an_error() -> None:
    from offset_ledger.errors import AdoptionRefused, AmbiguousConsumerGroup

    for exc in (AdoptionRefused("p", "g", {"topics": ["t"], "generations": 1}), AmbiguousConsumerGroup("p", ["a", "b"])):
        assert "=True" not in exc.message and "consumer_group=" not in exc.message, exc.message
