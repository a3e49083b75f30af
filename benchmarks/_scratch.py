"""A throwaway Postgres database for one benchmark run (created on start, dropped at the end)."""

from __future__ import annotations

import uuid

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


class ScratchDatabase:
    """A fresh database on the server ``admin_dsn`` points at; ``drop()`` removes it."""

    def __init__(self, admin_dsn: str, prefix: str, template: str | None = None) -> None:
        self.admin_url = make_url(admin_dsn)
        self.name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self._admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.name}"' + (f' TEMPLATE "{template}"' if template else "")))
        self.dsn = self.admin_url.set(database=self.name).render_as_string(hide_password=False)

    def drop(self) -> None:
        with self._admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self._admin.dispose()


def baseline_copy(scratch: ScratchDatabase, tree: str) -> ScratchDatabase:
    """A copy of ``scratch`` at the schema revision the checkout ``tree`` knows as its head.

    For ``--baseline-tree`` rounds: the baseline's code refuses (or tries to upgrade) a database
    carrying a revision it has never heard of, and a round compares code and schema together.
    """
    import os
    import subprocess
    import sys

    from offset_ledger.ledger.engine import downgrade, make_engine

    root = os.path.abspath(tree)
    head = subprocess.run(
        [sys.executable, "-c", "from offset_ledger.ledger.engine import head_revision; print(head_revision())"],
        cwd=root, env={**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")},
        check=True, capture_output=True, text=True).stdout.strip()
    scratch._admin.dispose()  # no session may stay open on a template
    copy = ScratchDatabase(scratch.admin_url.render_as_string(hide_password=False), scratch.name[:40] + "_base",
                           template=scratch.name)
    engine = make_engine(copy.dsn)
    try:
        downgrade(engine, head)
    finally:
        engine.dispose()
    return copy
