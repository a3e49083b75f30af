"""Processes of the local stack: free ports, waiting for a port, stopping a pid, the stack's errors and log lines."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from offset_ledger.pids import pid_exists


class StackError(RuntimeError):
    """A service of the local stack could not be resolved, started or reached."""


def cache_dir() -> Path:
    return Path(os.environ.get("OFFSET_LEDGER_CACHE", Path.home() / ".cache" / "offset-ledger"))


def stack_dir() -> Path:
    return Path(os.environ.get("OFFSET_LEDGER_STACK_DIR", Path.cwd() / ".devstack")).resolve()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def say(msg: str) -> None:
    print(f"[devstack] {msg}", file=sys.stderr, flush=True)


def pid_alive(pid: int) -> bool:
    if not pid_exists(pid):
        return False
    # A zombie child still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def wait_port(port: int, timeout: float, what: str, alive: Callable[[], bool] = lambda: True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise StackError(f"{what} exited during start-up")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise StackError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f}s")


def stop_pid(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM the process we started, wait, then SIGKILL: never by name."""
    if not pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
