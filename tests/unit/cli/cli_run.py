"""Run the CLI in process: (exit code, stdout, stderr), as the first-hour tests read it."""

from __future__ import annotations

import pytest

from offset_ledger.cli.main import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
