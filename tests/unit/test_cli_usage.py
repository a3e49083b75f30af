"""Usage mistakes print one line and exit 2, like every other user error of the CLI."""

from __future__ import annotations

import pytest

from offset_ledger.cli.main import main


@pytest.mark.parametrize("argv, fragment", [
    (["bogus"], "No such command 'bogus'"),
    (["reset", "orders", "--shift-by", "abc"], "--shift-by"),
    (["offsets"], "Missing argument"),
    (["history", "orders", "--limit", "x"], "--limit"),
])
def test_usage_errors_are_one_line_and_exit_2(argv: list[str], fragment: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("offset-ledger: error: ")
    assert fragment in err
    assert "Traceback" not in err


def test_help_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    assert "reset" in capsys.readouterr().out
