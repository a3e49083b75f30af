"""The local stack's PostgreSQL: initdb and pg_ctl from the installed server binaries, as the postgres user when run as root."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

from offset_ledger.devstack.processes import StackError, free_port


def _pg_bindir() -> Path:
    for candidate in (shutil.which("pg_config"),):
        if candidate:
            out = subprocess.run([candidate, "--bindir"], capture_output=True, text=True)
            path = Path(out.stdout.strip())
            if (path / "initdb").exists():
                return path
    for path in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (path / "initdb").exists():
            return path
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise StackError("PostgreSQL server binaries (initdb, pg_ctl) not found; install postgresql")


def _as_pg_user(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; the server package ships an unprivileged user.
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


class Postgres:
    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def datadir(self) -> Path:
        return self.root / "pgdata"

    def start(self, port: int | None = None) -> tuple[str, int]:
        """Start (initdb on first use) on ``port``, default a free one; returns (dsn, pid)."""
        bindir = _pg_bindir()
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            # The postgres user must be able to reach the data directory through its parents.
            for parent in self.root.parents:
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    os.chmod(parent, mode | 0o001)
        if not (self.datadir / "PG_VERSION").exists():
            proc = subprocess.run(
                _as_pg_user([str(bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                             "-A", "trust", "-E", "UTF8", "--no-sync"]),
                capture_output=True, text=True,
            )
            if proc.returncode != 0:
                raise StackError(f"initdb failed: {proc.stderr.strip()[-2000:]}")
        port = port or free_port()
        opts = (f"-p {port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        # -W: we wait ourselves, for a real connection; pg_ctl's own wait reads the pid file and
        # was seen to time out on a busy machine although the server was accepting connections.
        proc = subprocess.run(
            _as_pg_user([str(bindir / "pg_ctl"), "-D", str(self.datadir), "-o", opts,
                         "-l", str(self.root / "postgres.log"), "-W", "start"]),
            capture_output=True, text=True,
        )
        if proc.returncode != 0 or not self._wait_ready(port, timeout=120):
            log = (self.root / "postgres.log")
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise StackError(f"PostgreSQL did not start: {proc.stderr.strip()} {tail}")
        pid = int((self.datadir / "postmaster.pid").read_text().split()[0])
        return f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres", pid

    @staticmethod
    def _wait_ready(port: int, timeout: float) -> bool:
        import psycopg2

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                                 connect_timeout=2).close()
                return True
            except psycopg2.OperationalError:
                time.sleep(0.2)
        return False

    def stop(self) -> None:
        if not (self.datadir / "postmaster.pid").exists():
            return
        subprocess.run(
            _as_pg_user([str(_pg_bindir() / "pg_ctl"), "-D", str(self.datadir), "-m", "fast",
                         "-w", "-t", "60", "stop"]),
            capture_output=True, text=True,
        )
