"""Run the CLI in process: (exit code, stdout, stderr), as the first-hour tests read it; and walk its commands."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from typer.main import get_command

from offset_ledger.cli.main import app, main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def click_commands() -> Iterator[tuple[str, Any]]:
    """(``"db upgrade"``, its Click command) for every command of the app, as the command line reaches them
    (Typer's own Click: its classes are not ``click``'s, so the walk goes by shape)."""

    def walk(command: Any, prefix: list[str]) -> Iterator[tuple[str, Any]]:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, [*prefix, name])
        else:
            yield " ".join(prefix), command

    yield from walk(get_command(app), [])
