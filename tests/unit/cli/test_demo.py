"""The demo's pure parts: options and the interrupt handling that keeps children from leaking."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from offset_ledger.cli.demo import Signals, parse_args


def test_defaults_and_options() -> None:
    options = parse_args([])
    assert (options.keep_serving, options.postgres, options.workdir) == (False, False, None)
    options = parse_args(["--keep-serving", "--postgres", "--seconds", "5", "--workdir", "/tmp/x"])
    assert (options.keep_serving, options.postgres, options.v1_seconds, options.workdir) == (
        True, True, 5.0, Path("/tmp/x"))


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
