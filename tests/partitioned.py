"""Narrow ``offset_ranges`` partitions (0018, PostgreSQL) for tests: a few batch ids each, so that a test's
handful of batches spans many partitions and prune swaps whole ones out (``ledger.partitions``)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import upgrade
from offset_ledger.ledger.partitions import ensure_ahead, partitioned, partitions


def narrow_partitions(engine: Engine, width: int = 3, ahead: int = 30) -> list[str]:
    """Replace the empty partitions ahead by ``ahead`` partitions of ``width`` ids (a fresh ledger)."""
    with engine.begin() as conn:
        if not partitioned(conn):
            return []
        for p in partitions(conn):
            if p.default or p.lo is None:
                continue
            assert conn.execute(text(f"SELECT count(*) FROM {p.name}")).scalar() == 0, p
            conn.execute(text(f"ALTER TABLE offset_ranges DETACH PARTITION {p.name}"))
            conn.execute(text(f"DROP TABLE {p.name}"))
    return ensure_ahead(engine, ahead=ahead, width_ids=width)


def upgrade_narrow(engine: Engine, revision: str = "head") -> None:
    """``upgrade``, then narrow partitions on PostgreSQL."""
    upgrade(engine, revision)
    narrow_partitions(engine)
