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


def test_quiet_keeps_the_answer_and_the_error_only(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from offset_ledger.cli.main import main
    from offset_ledger.ledger.engine import make_engine, upgrade
    from tests.ops_seed import seed_pipeline

    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(dsn)
    upgrade(engine)
    seed_pipeline(engine, "orders", {"orders": {0: 30}})
    engine.dispose()

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            main([*argv])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = run("history", "orders", "--limit", "1", "-f", "csv", "--dsn", dsn)
    assert code == 0 and err.startswith("more: --cursor")
    code, quiet_out, err = run("-q", "history", "orders", "--limit", "1", "-f", "csv", "--dsn", dsn)
    assert code == 0 and quiet_out == out and err == ""
    code, _, err = run("-q", "offsets", "ordrs", "--dsn", dsn)
    assert code == 2 and err.startswith("offset-ledger: error: unknown pipeline 'ordrs'")
    code, _, err = run("-q", "-v", "offsets", "orders", "--dsn", dsn)
    assert code == 2 and "--quiet and --verbose" in err
