"""JSON endpoints the web console reads beyond the resource API: enriched pipelines, runs, findings."""

from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Path, Query, Request

from offset_ledger.api import paths as _paths  # noqa: F401 - registers the {name:name} path convertor
from offset_ledger.console.reads import ConsoleReads
from offset_ledger.operate.audit import list_findings
from offset_ledger.operate.inputs import MAX_BIGINT, MAX_LIMIT, NAME_PATTERN, parse_timestamp
from offset_ledger.operate.operations import Operations

router = APIRouter(prefix="/api/v1", tags=["console"])


def _reads(request: Request) -> ConsoleReads:
    ops: Operations = request.app.state.operations
    return ConsoleReads(ops)


@router.get("/console/pipelines",
            summary="Every pipeline with state (running/stopped/stale), lag, findings, app version and generation")
def console_pipelines(request: Request) -> Any:
    return {"pipelines": _reads(request).pipelines()}


@router.get("/pipelines/{pipeline:name}/runs", summary="Runs and checkpoint generations, newest first")
def pipeline_runs(request: Request, pipeline: str = Path(pattern=NAME_PATTERN), consumerGroup: Optional[str] = Query(None, pattern=NAME_PATTERN)) -> Any:
    return _reads(request).runs(pipeline, consumerGroup)


@router.get("/pipelines/{pipeline:name}/findings", summary="Findings (gaps, stale batches, data loss, ...), newest first")
def pipeline_findings(request: Request, pipeline: str = Path(pattern=NAME_PATTERN), consumerGroup: Optional[str] = Query(None, pattern=NAME_PATTERN),
                      limit: int = Query(100, ge=1, le=MAX_LIMIT),
                      kind: Optional[str] = Query(None, pattern=NAME_PATTERN, description="only this kind (gap, data_loss, ...)"),
                      since: Optional[str] = Query(None, max_length=64, description="seen at or after (ISO 8601 or epoch ms)"),
                      before: Optional[int] = Query(None, ge=1, le=MAX_BIGINT, description="page: findings older than this id")) -> Any:
    # The same read and filters as `offset-ledger findings` (operate.audit.list_findings).
    start = parse_timestamp(since) if since is not None else None
    group, rows, next_before = list_findings(request.app.state.operations, pipeline, consumerGroup, kind=kind,
                                             since=start, limit=limit, before_id=before)
    return {"pipeline": pipeline, "consumerGroup": group, "findings": rows, "nextBefore": next_before}
