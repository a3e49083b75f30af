"""The audit trail as the operator reads it: findings (paged by id) and their count per pipeline.

Plain reads over one ``Operations``' ledger; the CLI's ``findings``/``resets`` commands and the
``pipelines`` findings column use them. Driver errors become ``offset_ledger.errors`` here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.ledger import audit_store
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.operate.answers import details_answer, iso_utc
from offset_ledger.operate.inputs import MAX_LIMIT, check_limit
from offset_ledger.operate.operations import resolve_group
from offset_ledger.operate.visibility import current_scope

if TYPE_CHECKING:
    from offset_ledger.operate.operations import Operations

MAX_PAGE = MAX_LIMIT  # the one page-size bound (operate.inputs)


@contextmanager
def _read(ops: Operations) -> Iterator[Connection]:
    try:
        with ops.engine.connect() as conn:
            yield conn
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading the audit trail") from exc


#: Findings that say something went as designed (a pipeline's first start, a partition added and
#: read from earliest): counted, but nothing for an operator to look into.
INFORMATIONAL_FINDINGS = frozenset({"first_run", "new_partition"})


def findings_counts(ops: Operations, *, informational: bool = True) -> dict[tuple[str, str], int]:
    """Findings recorded per (pipeline, consumer group); a repeated finding counts once.
    ``informational=False``: only those that need a look (not ``INFORMATIONAL_FINDINGS``)."""
    scope = current_scope()
    with _read(ops) as conn:
        counts = audit_store.findings_counts(conn, except_kinds=() if informational else INFORMATIONAL_FINDINGS)
    return {(p, g): n for p, g, n in counts if scope.allows(p)}


def list_findings(
    ops: Operations, pipeline: str, consumer_group: str | None = None, *, kind: str | None = None,
    since: datetime | None = None, limit: int = 50, before_id: int | None = None,
) -> tuple[str, list[dict[str, Any]], int | None]:
    """(consumer group, findings newest first, the ``before_id`` of the next page or None)."""
    check_limit(limit)
    with _read(ops) as conn:
        group = resolve_group(conn, pipeline, consumer_group)
        # one more than a page: whether there is a next one
        rows = audit_store.findings_page(conn, pipeline, group, kind=kind, since=since, before_id=before_id,
                                         limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    out = [{
        "id": r["id"], "createdAt": iso_utc(r["created_at"]), "lastSeenAt": iso_utc(r["last_seen_at"]),
        "occurrences": int(r["occurrences"] or 1), "kind": r["kind"], "topic": r["topic"],
        "partition": r["partition"], "expectedOffset": r["expected_offset"], "actualOffset": r["actual_offset"],
        "queryId": r["query_id"], "batchId": r["batch_id"], "runId": r["run_id"],
        "generationId": r["generation_id"], "message": r["message"], "details": details_answer(r["details"]),
    } for r in rows]
    return group, out, (rows[-1]["id"] if more else None)
