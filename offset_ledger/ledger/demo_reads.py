"""What the demo (``offset-ledger demo``, ``cli.demo``) reads of the ledger to tell its story.

The summary is plain SQL over the ``v_batch_history`` audit view on purpose: it is the query
docs/audit.md shows an operator, run as it is.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import batches

VERSIONS_SQL = ("SELECT r.app_version, COUNT(DISTINCT h.batch_id) AS batches, "
                "MIN(h.batch_time) AS first_batch, MAX(h.batch_time) AS last_batch "
                "FROM v_batch_history h JOIN runs r ON r.run_id = h.run_id "
                "WHERE h.pipeline = :p GROUP BY r.app_version ORDER BY r.app_version")


def batch_count(conn: Connection, pipeline: str) -> int:
    """How many batches the ledger recorded for ``pipeline``."""
    return int(conn.execute(select(func.count()).select_from(batches).where(
        batches.c.pipeline == pipeline)).scalar_one())


def batches_by_app_version(conn: Connection, pipeline: str) -> list[Any]:
    """Per app version of ``pipeline``: ``app_version``, ``batches``, ``first_batch``, ``last_batch``."""
    return list(conn.execute(text(VERSIONS_SQL), {"p": pipeline}).fetchall())
