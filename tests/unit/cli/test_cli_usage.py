"""Usage mistakes print one line and exit 2, like every other user error of the CLI."""

from __future__ import annotations

import re

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


def test_a_missing_argument_is_named_as_the_usage_line_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    """No Python parameter name (``'pipeline'``) in a usage error: the same word as ``Usage: ... PIPELINE``."""
    from typer.main import get_command

    from offset_ledger.cli.main import app

    def leaves(command, prefix):  # type: ignore[no-untyped-def]
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from leaves(sub, [*prefix, name])
        else:
            yield prefix, command

    checked = 0
    for words, command in leaves(get_command(app), []):
        required = [p for p in command.params if p.param_type_name == "argument" and p.required]
        if not required:
            continue
        with pytest.raises(SystemExit) as info:
            main(words)
        err = capsys.readouterr().err
        named = re.search(r"Missing argument '([^']+)'", err)
        assert info.value.code == 2 and named is not None, (words, err)
        assert named.group(1).isupper() and named.group(1) in command.get_usage(command.make_context(
            words[-1], [], resilient_parsing=True)), (words, err)
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("argv", [["history", "orders", "--limit", "0"], ["findings", "orders", "--limit", "1001"],
                                  ["resets", "orders", "--limit", "0"]])
def test_every_limit_is_refused_under_its_option_name_before_the_ledger_is_opened(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--dsn", "sqlite:////nonexistent/ledger.db"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("offset-ledger: error: --limit must be between 1 and 1000, not "), err


def test_a_start_builds_only_the_command_it_runs() -> None:
    """Typer builds every registered command on each call; a start builds the one it runs (issue 34:
    start time), and help, completion or an unknown word get the whole app."""
    from offset_ledger.cli.main import _app_for, app

    only = _app_for(["-q", "offsets", "orders", "--dsn", "x"])
    assert [c.name for c in only.registered_commands] == ["offsets"] and only.registered_groups == []
    assert [g.name for g in _app_for(["policy", "show", "orders"]).registered_groups] == ["policy"]
    assert len(app.registered_commands) > 10  # the app itself is untouched
    for argv in ([], ["--help"], ["nosuch"], ["--version"]):
        assert _app_for(argv) is app
