"""The demo's pure parts: options and the interrupt handling that keeps children from leaking."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from offset_ledger.cli.demo import Signals, parse_args


def test_defaults_and_options() -> None:
    options = parse_args([])
    assert (options.keep_serving, options.postgres, options.workdir, options.leave_up) == (False, False, None, True)
    options = parse_args(["--keep-serving", "--postgres", "--seconds", "5", "--workdir", "/tmp/x"])
    assert (options.keep_serving, options.postgres, options.v1_seconds, options.workdir) == (
        True, True, 5.0, Path("/tmp/x"))
    assert not options.leave_up  # --keep-serving serves until Ctrl-C, then cleans up, as before
    assert not parse_args(["--clean"]).leave_up and parse_args(["--down"]).down


def test_the_three_commands_name_the_ledger_the_cluster_and_the_console() -> None:
    from offset_ledger.cli.demo_stack import explore_commands

    lines = explore_commands("/repo/.venv/bin/offset-ledger", "sqlite:////repo/.demo/ledger.db", "127.0.0.1:9192",
                             "http://127.0.0.1:9090")
    assert len(lines) == 3
    assert lines[0] == ("/repo/.venv/bin/offset-ledger pipelines --dsn sqlite:////repo/.demo/ledger.db "
                        "--bootstrap-server 127.0.0.1:9192")
    assert lines[1].startswith("/repo/.venv/bin/offset-ledger verify demo_orders --dsn sqlite:////repo/.demo/")
    assert lines[2].startswith("open http://127.0.0.1:9090/pipelines/demo_orders")


def test_down_stops_what_the_demo_left_up_and_only_that(tmp_path: Path) -> None:
    """``make demo-down``: the server is stopped by the pid and command line the demo recorded (a pid
    reused by another process is left alone), the work dir deleted."""
    import json
    import subprocess
    import sys

    from offset_ledger.cli.demo_stack import STATE_FILE, down

    server = [sys.executable, "-c", "import time; time.sleep(120)"]
    proc = subprocess.Popen(server)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "other"])
    try:
        root = tmp_path / ".demo"
        root.mkdir()
        (root / "ledger.db").write_bytes(b"")
        state = {"serverPid": proc.pid, "serverCmdline": server, "stack": str(root / "stack")}
        (root / STATE_FILE).write_text(json.dumps(state))
        said = down(root)
        assert proc.wait(20) is not None and not root.exists(), said
        assert f"pid {proc.pid}" in said
        # A state file naming a pid that now runs something else: that process is not touched.
        root.mkdir()
        (root / STATE_FILE).write_text(json.dumps({**state, "serverPid": stranger.pid}))
        down(root)
        assert stranger.poll() is None and not root.exists()
        assert down(root).startswith("no demo left up in ")
    finally:
        for p in (proc, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_sigterm_unwinds_like_ctrl_c() -> None:
    signals = Signals()
    with signals.installed(), pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)  # handlers run in the main thread right away


def test_signal_during_a_launch_is_raised_after_it() -> None:
    signals = Signals()
    launched = False
    with signals.installed(), pytest.raises(KeyboardInterrupt):
        with signals.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            launched = True  # the launch completes: its process gets registered for cleanup
    assert launched


def test_signals_are_dropped_while_cleaning_up() -> None:
    signals = Signals()
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with signals.installed():
        signals.hold()
        os.kill(os.getpid(), signal.SIGINT)
        with signals.deferred():
            pass
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
