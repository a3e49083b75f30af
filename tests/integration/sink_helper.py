"""Helpers of the sink crash tests: run the driver in its own process group, read the target back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

DRIVER = Path(__file__).with_name("sink_driver.py")


def run_driver(cfg: dict[str, Any], *, timeout: float = 240, kill_after_s: float | None = None,
               env: dict[str, str] | None = None) -> tuple[int, str]:
    """(exit status, output) of one driver run; a negative status is the signal that ended it.

    ``env``: variables set for the driver process (and so its JVM and, in local mode, its workers).
    """
    proc = subprocess.Popen([sys.executable, str(DRIVER), json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=None if env is None else {**os.environ, **env})
    try:
        out, _ = proc.communicate(timeout=kill_after_s if kill_after_s is not None else timeout)
    except subprocess.TimeoutExpired:
        # The test's own driver (its own session, so its own process group): JVM and Python die together.
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        if kill_after_s is None:
            raise AssertionError(f"the driver did not finish in {timeout} s:\n{out[-4000:]}") from None
    _reap_group(proc.pid)
    return proc.returncode, out


def _reap_group(pgid: int) -> None:
    """Make sure nothing of the killed driver's group (its JVM) outlives it before the next run starts."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return


def target_values(dsn: str, table: str) -> Counter:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return Counter(conn.execute(text(f'SELECT value FROM "{table}"')).scalars())
    finally:
        engine.dispose()


def create_target(dsn: str, table: str) -> None:
    engine = create_engine(dsn)
    try:
        with engine.begin() as conn:
            conn.execute(text(f'CREATE TABLE "{table}" (id bigserial PRIMARY KEY, value text NOT NULL, '
                              f'topic text, "partition" int, "offset" bigint)'))
    finally:
        engine.dispose()


JDBC_DRIVER = "org.postgresql:postgresql:42.7.4"


def jdbc_jar() -> str:
    """PostgreSQL's JDBC driver from Maven Central (for the sink's ``stage="jdbc"``)."""
    group, artifact, version = JDBC_DRIVER.split(":")
    jar = Path.home() / ".m2" / "repository" / group.replace(".", "/") / artifact / version / f"{artifact}-{version}.jar"
    if not jar.exists():
        subprocess.run(["mvn", "-q", "-B", "dependency:get", f"-Dartifact={JDBC_DRIVER}"], check=True,
                       capture_output=True, timeout=300)
    return str(jar)
