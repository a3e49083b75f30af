"""A throwaway Postgres database for one benchmark run (created on start, dropped at the end)."""

from __future__ import annotations

import uuid

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


class ScratchDatabase:
    """A fresh database on the server ``admin_dsn`` points at; ``drop()`` removes it."""

    def __init__(self, admin_dsn: str, prefix: str) -> None:
        self.admin_url = make_url(admin_dsn)
        self.name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self._admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.name}"'))
        self.dsn = self.admin_url.set(database=self.name).render_as_string(hide_password=False)

    def drop(self) -> None:
        with self._admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self._admin.dispose()
