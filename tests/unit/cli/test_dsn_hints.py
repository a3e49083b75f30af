"""The common database-URL mistakes get one line saying what to write, exit 2, and nothing created
(issue 50, item 4): ``postgres://`` (SQLAlchemy: "Can't load plugin") and ``sqlite:///tmp/x`` (three
slashes: the relative path ``tmp/x``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offset_ledger.cli.main import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", [["offsets", "orders"], ["db", "upgrade"], ["pipelines", "--no-lag"]])
def test_postgres_scheme_says_postgresql_psycopg2(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, *command, "--dsn", "postgres://etl:secret@db.example/ledger")
    assert code == 2 and err.count("\n") == 1, err
    assert "write postgresql+psycopg2://etl:***@db.example/ledger" in err and "secret" not in err


def test_the_variable_gets_the_same_hint(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OFFSET_LEDGER_DSN", "postgres://etl@db.example/ledger")
    code, err = _run(capsys, "offsets", "orders")
    assert code == 2 and "postgresql+psycopg2://" in err


@pytest.mark.parametrize("command", [["offsets", "orders"], ["db", "upgrade"]])
def test_three_slashes_to_an_absolute_path_say_four(command: list[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no ./tmp here; /tmp exists
    code, err = _run(capsys, *command, "--dsn", "sqlite:///tmp/ledger-typo/x.db")
    assert code == 2 and err.count("\n") == 1, err
    assert "an absolute path needs four slashes: sqlite:////tmp/ledger-typo/x.db" in err
    assert list(tmp_path.iterdir()) == [] and not Path("/tmp/ledger-typo").exists()  # nothing created


def test_a_relative_path_that_exists_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tmp").mkdir()
    code, err = _run(capsys, "db", "upgrade", "--dsn", "sqlite:///tmp/x.db")
    assert code == 0 and (tmp_path / "tmp" / "x.db").is_file(), err
