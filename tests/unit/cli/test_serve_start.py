"""``serve`` says where it listens and whether it wants a token, and refuses a busy port with one line
and exit 2 before anything starts (issue 50, item 4). Real processes, a real socket, a SQLite ledger."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from offset_ledger.ledger.engine import make_engine, upgrade

CLI = [sys.executable, "-c", "from offset_ledger.cli.main import main; main()"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(dsn)
    upgrade(engine)
    engine.dispose()
    out = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    out["OFFSET_LEDGER_DSN"] = dsn
    return out


def test_a_busy_port_is_one_line_and_exit_2(env: dict[str, str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([*CLI, "serve", "--port", str(port)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"offset-ledger: error: port {port} on 127.0.0.1 is already in use (another offset-ledger " \
                       "serve?); stop that process or pass --port\n"


@pytest.mark.parametrize("token", [None, "a-long-enough-token-for-tests"])
def test_the_start_names_the_console_url_and_the_auth(env: dict[str, str], token: str | None) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if token:
        env = {**env, "OFFSET_LEDGER_API_TOKEN": token}
    proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--log-level", "warning"], env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith(f"offset-ledger serve: console http://127.0.0.1:{port}/ "), first
        assert ("tokens required" in first) == bool(token) and ("no token required" in first) == (not token)
        deadline = time.monotonic() + 30
        while True:  # the URL printed is the one that answers
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                    assert answer.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(15)
