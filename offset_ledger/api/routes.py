"""Routes: the five legacy ``/v1`` endpoints, the resource API under ``/api/v1``, and service paths."""

from __future__ import annotations

import json
from typing import Any, Optional

from fastapi import APIRouter, Body, Header, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from offset_ledger.api import paths as _paths  # noqa: F401 - registers the {name:name} path convertor
from offset_ledger.api.metrics import render_metrics
from offset_ledger.api.schemas import ResetBody
from offset_ledger.api.tokens import PRINCIPAL
from offset_ledger.errors import InvalidInput
from offset_ledger.operate.action_answers import replay_answer
from offset_ledger.operate.answers import position_answer
from offset_ledger.operate.gc_pause import gc_paused
from offset_ledger.operate.inputs import MAX_BIGINT, MAX_LIMIT, NAME_PATTERN, TOPIC_PATTERN, audit_actor
from offset_ledger.operate import operations_metrics, reads, reset_operations
from offset_ledger.operate.inputs import parse_timestamp, request_from_legacy_body
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.replay import replay
from offset_ledger.rules.resets import ResetRequest

legacy = APIRouter(tags=["legacy"])
resource = APIRouter(prefix="/api/v1", tags=["resources"])
service = APIRouter(tags=["service"])

_OFFSETS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {"type": "object", "additionalProperties": {"type": "integer", "minimum": -2}},
    "example": {"orders": {"0": 873340, "1": 873120}},
}
_OFFSETS_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "positions per topic and partition (next offset to read)",
          "content": {"application/json": {"schema": _OFFSETS_SCHEMA}}},
}


def _ops(request: Request) -> Operations:
    ops: Operations = request.app.state.operations
    return ops


def _actor(request: Request, claimed: str | None, default: str) -> str:
    """The audit actor: the authenticated token's name; what the caller says only adds detail."""
    token = request.scope.get(PRINCIPAL)
    return audit_actor(token.name if token is not None else None, claimed, default)


# -- legacy ---------------------------------------------------------------------------------


@legacy.get("/v1/getCurrentOffsets", summary="Current positions of a pipeline (legacy)",
            responses=_OFFSETS_RESPONSE)
def get_current_offsets(request: Request, pipelineName: str = Query(pattern=NAME_PATTERN)) -> Any:
    return reads.current_offsets(_ops(request), pipelineName)


@legacy.get("/v1/getTopicDetails", summary="Log-start (firstOffset) and log-end (lastOffset) per partition (legacy)")
def get_topic_details(request: Request, topicName: str = Query(pattern=TOPIC_PATTERN)) -> Any:
    return reads.legacy_topic_details(_ops(request), topicName)


def _legacy_reset(request: Request, pipeline: str, reset: ResetRequest, x_actor: str | None, label: str) -> Any:
    outcome = reset_operations.reset(_ops(request), pipeline, reset, actor=_actor(request, x_actor, "legacy-api"),
                                  reason=f"legacy {label}", dry_run=False)
    return outcome.plan.new_positions()


def reset_to_earliest(request: Request, pipelineName: str = Query(pattern=NAME_PATTERN),
                      x_actor: Optional[str] = Header(default=None, pattern=NAME_PATTERN)) -> Any:
    return _legacy_reset(request, pipelineName, ResetRequest(mode="earliest"), x_actor,
                         "resetOffsetOfAllPartitionsToEarliest")


def reset_to_latest(request: Request, pipelineName: str = Query(pattern=NAME_PATTERN),
                    x_actor: Optional[str] = Header(default=None, pattern=NAME_PATTERN)) -> Any:
    return _legacy_reset(request, pipelineName, ResetRequest(mode="latest"), x_actor,
                         "resetOffsetOfAllPartitionsToLatest")


async def reset_partitions(request: Request, pipelineName: str = Query(pattern=NAME_PATTERN),
                           x_actor: Optional[str] = Header(default=None, pattern=NAME_PATTERN)) -> Any:
    # Read the body ourselves: curl -d sends form content types and GET carries a body here.
    raw = await request.body()
    if not raw.strip():
        raise InvalidInput('a JSON body like {"topic": {"0": 1200, "1": 1300}} is required')
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"malformed JSON body: {str(exc)[:200]}") from exc
    reset = request_from_legacy_body(body)
    return await run_in_threadpool(_legacy_reset, request, pipelineName, reset, x_actor, "resetOffsetOfPartitions")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid offset")


_BODY_SCHEMA = {
    **_OFFSETS_SCHEMA, "minProperties": 1, "propertyNames": {"pattern": TOPIC_PATTERN},
    "additionalProperties": {**_OFFSETS_SCHEMA["additionalProperties"], "minProperties": 1,
                             "propertyNames": {"pattern": "^(0|[1-9][0-9]{0,9})$"}},
}
_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": _BODY_SCHEMA}}}}
for _method in ("GET", "POST"):
    # One route per method so each has its own OpenAPI operation id.
    legacy.add_api_route("/v1/resetOffsetOfAllPartitionsToEarliest", reset_to_earliest, methods=[_method],
                         operation_id=f"resetOffsetOfAllPartitionsToEarliest_{_method.lower()}",
                         summary="Reset every partition to its log-start offset (legacy; executes)",
                         responses=_OFFSETS_RESPONSE)
    legacy.add_api_route("/v1/resetOffsetOfAllPartitionsToLatest", reset_to_latest, methods=[_method],
                         operation_id=f"resetOffsetOfAllPartitionsToLatest_{_method.lower()}",
                         summary="Reset every partition to its log-end offset (legacy; executes)",
                         responses=_OFFSETS_RESPONSE)
    legacy.add_api_route("/v1/resetOffsetOfPartitions", reset_partitions, methods=[_method],
                         operation_id=f"resetOffsetOfPartitions_{_method.lower()}",
                         summary="Reset partitions to explicit offsets; the body names every partition "
                                 "of the topic (legacy; executes)",
                         responses=_OFFSETS_RESPONSE, openapi_extra=_BODY)


# -- resources ------------------------------------------------------------------------------


@resource.get("/pipelines", summary="Every pipeline with state, last batch time, lag and findings")
def list_pipelines(request: Request, lag: bool = Query(True, description="ask Kafka for lag")) -> Any:
    rows = reads.pipeline_answers(_ops(request), with_lag=lag)
    # Already JSON-ready: returned as a response, FastAPI skips jsonable_encoder (17x json.dumps here).
    return JSONResponse({"pipelines": rows})


@resource.get("/pipelines/{pipeline:name}/offsets", summary="Current positions with what placed them")
def pipeline_offsets(request: Request, pipeline: str = Path(pattern=NAME_PATTERN),
                     consumerGroup: Optional[str] = Query(None, pattern=NAME_PATTERN)) -> Any:
    group, rows = reads.positions(_ops(request), pipeline, consumerGroup)
    return {
        "pipeline": pipeline, "consumerGroup": group,
        "positions": [position_answer(r) for r in rows],
    }


@resource.get("/pipelines/{pipeline:name}/history", summary="Committed batches, newest first, paged")
def pipeline_history(
    request: Request, pipeline: str = Path(pattern=NAME_PATTERN),
    topic: Optional[str] = Query(None, pattern=TOPIC_PATTERN),
    since: Optional[str] = Query(None, description="inclusive; ISO 8601 or epoch ms"),
    until: Optional[str] = Query(None, description="exclusive; ISO 8601 or epoch ms"),
    limit: int = Query(100, ge=1, le=MAX_LIMIT),
    cursor: Optional[str] = Query(None, max_length=512, description="nextCursor of the previous page"),
    consumerGroup: Optional[str] = Query(None, pattern=NAME_PATTERN),
) -> Any:
    page = reads.history(
        _ops(request),        pipeline, consumerGroup, topic=topic,
        # "is not None": ?since= (empty) is refused by name, never read as "no bound".
        since=parse_timestamp(since) if since is not None else None,
        until=parse_timestamp(until) if until is not None else None,
        limit=limit, cursor=cursor,
    )
    return {"pipeline": pipeline, "batches": list(page.items), "nextCursor": page.next_cursor}


@resource.get("/pipelines/{pipeline:name}/lag", summary="Lag per partition: log-end minus next offset")
def pipeline_lag(request: Request, pipeline: str = Path(pattern=NAME_PATTERN), consumerGroup: Optional[str] = Query(None, pattern=NAME_PATTERN)) -> Any:
    group, rows = reads.lag(_ops(request), pipeline, consumerGroup)
    known = [r.lag for r in rows if r.lag is not None]
    return {"pipeline": pipeline, "consumerGroup": group, "totalLag": sum(known) if known else None,
            "partitions": [r.to_dict() for r in rows]}


@resource.get("/topics/{topic:name}", summary="Partitions with logStartOffset and logEndOffset (the next offset "
                                            "to be written)")
def topic_details(request: Request, topic: str = Path(pattern=TOPIC_PATTERN)) -> Any:
    return reads.topic_details(_ops(request), topic)


@resource.post("/pipelines/{pipeline:name}/resets", summary="Plan (dryRun, the default) or execute a reset; audited")
def create_reset(request: Request, pipeline: str = Path(pattern=NAME_PATTERN), body: ResetBody = Body(...),
                 x_actor: Optional[str] = Header(default=None, pattern=NAME_PATTERN)) -> Any:
    reset = body.to_request()
    actor = _actor(request, body.actor or x_actor, "api")
    outcome = reset_operations.reset(_ops(request), pipeline, reset, actor=actor, reason=body.reason, dry_run=body.dryRun,
                                  force=body.force, consumer_group=body.consumerGroup)
    return outcome.to_dict()


@resource.get("/pipelines/{pipeline:name}/resets",
              summary="The audit list of resets, dry runs included (each marked dryRun: true, status dry_run)")
def list_resets(request: Request, pipeline: str = Path(pattern=NAME_PATTERN),
                limit: int = Query(50, ge=1, le=MAX_LIMIT), consumerGroup: Optional[str] = Query(None, pattern=NAME_PATTERN),
                dryRuns: bool = Query(True, description="false: executed resets only")) -> Any:
    group, rows = reset_operations.resets(_ops(request), pipeline, consumerGroup, limit=limit, dry_runs=dryRuns)
    return {"pipeline": pipeline, "consumerGroup": group, "resets": rows}


@resource.get("/pipelines/{pipeline:name}/batches/{batch}/range",
              summary="The Kafka range a batch read: startingOffsets, endingOffsets and assign for a replay")
def batch_range(request: Request, pipeline: str = Path(pattern=NAME_PATTERN), batch: int = Path(ge=0, le=MAX_BIGINT),
                queryId: Optional[str] = Query(None, min_length=1, max_length=64,
                                               description="default: the current generation's query"),
                generation: Optional[int] = Query(None, ge=1, le=MAX_BIGINT),
                consumerGroup: Optional[str] = Query(None, pattern=NAME_PATTERN)) -> Any:
    result = replay(_ops(request), pipeline, batch=batch, query_id=queryId, generation=generation,
                    consumer_group=consumerGroup)
    return {"pipeline": pipeline, "batchId": batch, **replay_answer(result)}


# -- service --------------------------------------------------------------------------------


@service.get("/healthz", summary="Readiness: 200 with the schema revision when the ledger answers and holds "
                                  "the schema; 503 LedgerUnavailable / LedgerWithoutSchema otherwise")
def healthz(request: Request) -> Any:
    revision = reads.schema_revision(_ops(request))
    return {"status": "ok", "ledger": {"reachable": True, "schema": revision}}


@service.get("/livez", summary="Liveness: 200 while the process serves requests (asks nothing of the ledger)")
def livez() -> Any:
    return {"status": "alive"}


@service.get("/metrics", summary="Prometheus text format", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
    # A sync route: Starlette runs it on its thread pool, so a scrape never holds the event loop
    # (other requests are served meanwhile, sharing the GIL with it).
    with gc_paused():
        text = render_metrics(operations_metrics.metrics(_ops(request)))
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")
