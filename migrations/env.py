"""Alembic environment: runs against the engine/connection offset_ledger hands it.

Every upgrade and downgrade, whoever runs it (``db upgrade``, the automatic upgrade a writer runs at
start, a test), goes through here: the team walls (``row_security.migrating``) are applied again in
the migrations' own transaction, so no path commits a revision without them.
"""

from __future__ import annotations

from alembic import context

from offset_ledger.ledger.row_security import migrating
from offset_ledger.ledger.tables import metadata

config = context.config
target_metadata = metadata


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction(), migrating(connection):
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = config.attributes["engine"]
    with engine.begin() as conn:
        _run(conn)


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run `offset-ledger db upgrade`")
run_migrations_online()
