"""Tables line up under their headers; ids are not cut mid-word (issue 34 item 10)."""

from __future__ import annotations

import pytest

from offset_ledger.cli.support import emit, header, short_id


def _columns_of(head: str, names: list[str]) -> list[tuple[int, int]]:
    spans, at = [], 0
    for name in names:
        start = head.index(name, at)
        spans.append((start, start + len(name)))
        at = start + len(name)
    return spans


def test_rows_sit_under_their_headers(capsys: pytest.CaptureFixture[str]) -> None:
    # camelCase names grow by one underscore per word in the header: the widths follow the header,
    # and a column wider than its header (a long group, a large count) moves the ones after it.
    columns = ["consumerGroup", "lastBatchTime", "findings", "lag", "why"]
    emit([{"consumerGroup": "g", "lastBatchTime": "t", "findings": 0, "lag": 1_234_567, "why": "x y"},
          {"consumerGroup": "a-much-longer-group", "lastBatchTime": None, "findings": 12, "lag": None, "why": "z"}],
         columns, "table")
    head, *rows = capsys.readouterr().out.splitlines()
    assert head.split() == [header(c) for c in columns] and len(rows) == 2
    spans = _columns_of(head, [header(c) for c in columns])
    width = {c: max(len(header(c)), *(len(v) for v in vals)) for c, vals in zip(
        columns, [("g", "a-much-longer-group"), ("t", "-"), ("0", "12"), ("1234567", "-"), ("x y", "z")])}
    for row, cells in zip(rows, [("g", "t", "0", "1234567", "x y"), ("a-much-longer-group", "-", "12", "-", "z")]):
        for c, (start, end), cell in zip(columns, spans, cells):
            if c in ("findings", "lag"):  # numbers: right-aligned, the cell ends where its header ends
                assert row[end - len(cell):end] == cell and row[end - width[c]:end - len(cell)].strip() == "", (c, row)
            else:  # text: the cell starts where its header starts
                assert row[start:start + len(cell)] == cell, (c, row)
    assert "\x1b" not in head + "".join(rows)  # not a terminal: no colour codes


def test_only_prose_is_shortened_and_no_truncate_keeps_everything(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = "checkpoint:1a2b3c4d"
    message = "a gap of 12 records between batch 3 and batch 4 that nothing explains; " * 3
    row = {"id": 7, "lastSeenAt": "2024-05-01T10:00:00.000Z", "runId": run, "message": message.strip()}
    columns = list(row)
    monkeypatch.setenv("COLUMNS", "80")
    emit([row], columns, "table")
    head, line = capsys.readouterr().out.splitlines()
    assert len(line) <= 80 and line.endswith("...") and run in line and "2024-05-01T10:00:00.000Z" in line
    assert line[:-3].endswith(("explains;", "between", "gap", "of", "records", "batch", "and", "that", "nothing",
                               "12", "a", "3", "4"))  # cut after a whole word
    emit([row], columns, "table", truncate=False)
    assert capsys.readouterr().out.splitlines()[1].endswith(message.strip())
    # A terminal too narrow for even the ids: the line grows past it, an id is never cut.
    monkeypatch.setenv("COLUMNS", "20")
    emit([row], columns, "table")
    assert run in capsys.readouterr().out


def test_a_pipe_gets_a_fixed_width(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from offset_ledger.cli.table import PIPE_WIDTH

    monkeypatch.delenv("COLUMNS", raising=False)
    emit([{"id": 1, "message": "word " * 100}], ["id", "message"], "table")
    line = capsys.readouterr().out.splitlines()[1]
    assert PIPE_WIDTH - 8 <= len(line) <= PIPE_WIDTH and line.endswith("word...")


def test_markup_in_a_cell_is_data(capsys: pytest.CaptureFixture[str]) -> None:
    emit([{"why": "[bold]x[/bold] [log-start, log-end]"}], ["why"], "table")
    assert capsys.readouterr().out.splitlines()[1] == "[bold]x[/bold] [log-start, log-end]"


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


def test_findings_table_shows_the_time_and_no_truncate_the_whole_message(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from datetime import datetime, timezone

    from sqlalchemy import insert

    from offset_ledger.cli.main import main
    from offset_ledger.ledger.engine import make_engine, upgrade
    from offset_ledger.ledger.tables import findings
    from tests.ops_seed import seed_pipeline

    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(dsn)
    upgrade(engine)
    seed_pipeline(engine, "orders", {"orders": {0: 30}})
    message = "gap of 12 records [100, 112) after batch 3 of run checkpoint:1a2b3c4d-0000-0000-0000-000000000000 " * 2
    with engine.begin() as conn:
        conn.execute(insert(findings).values(pipeline="orders", consumer_group="orders", kind="gap", topic="orders",
                                             partition=0, message=message.strip(),
                                             created_at=datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)))
    engine.dispose()
    monkeypatch.setenv("COLUMNS", "120")
    for argv, whole in ((["findings", "orders"], False), (["findings", "orders", "--no-truncate"], True)):
        try:
            main([*argv, "--dsn", dsn])
        except SystemExit as exc:
            assert not exc.code
        head, row = capsys.readouterr().out.splitlines()
        assert head.split()[:2] == ["ID", "LAST_SEEN_AT"] and "2026-11-26T12:00:00" in row
        if whole:
            assert row.endswith(message.strip()) and len(row) > 120
        else:
            assert len(row) <= 120 and row.endswith("...") and "checkpoint:1a2b3c4d" not in row.split()[-1]
