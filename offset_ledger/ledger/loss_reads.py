"""The read-shortfall ``data_loss`` findings (``offset_ledger.rules.read_shortfall``), newest ids after a mark.

Findings are never pruned and only grow: a reader that keeps the highest id it has seen asks only
for what came after it (``operate.loss_status``), so a scrape reads the new ones, not the history.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import findings
from offset_ledger.rules.read_shortfall import READ_SHORTFALL


def shortfall_findings(conn: Connection, after_id: int = 0) -> list[tuple[int, str, str, str, int, dict[str, Any]]]:
    """(id, pipeline, consumer group, query id, batch id, details) of read-shortfall findings with id > ``after_id``."""
    f = findings
    rows = conn.execute(select(f.c.id, f.c.pipeline, f.c.consumer_group, f.c.query_id, f.c.batch_id, f.c.details)
                        .where(f.c.kind == "data_loss", f.c.id > after_id).order_by(f.c.id))
    return [(r.id, r.pipeline, r.consumer_group, r.query_id, r.batch_id, r.details) for r in rows
            if (r.details or {}).get("kind") == READ_SHORTFALL and r.query_id is not None]
