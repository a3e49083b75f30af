"""``GET /api/v1/pipelines/{pipeline}/verify``: has this pipeline read every record exactly once?

The same verb as ``offset-ledger verify`` (``offset_ledger.operate.verifying``), behind the same bearer-token
check as every other read. 200 with ``"ok": false`` and the unexplained stretches when the history
is not accounted for (the check itself succeeded); 404 for an unknown pipeline, 400/422 for bad input.
"""

from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse

from offset_ledger.api import paths as _paths  # noqa: F401 - registers the {name:name} path convertor
from offset_ledger.operate.action_answers import verify_answer
from offset_ledger.operate.inputs import NAME_PATTERN, TOPIC_PATTERN
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.verifying import verify_pipeline

router = APIRouter(prefix="/api/v1", tags=["resources"])


@router.get("/pipelines/{pipeline:name}/verify",
            summary="Exactly once, ever? Gaps and overlaps in the recorded history, each explained or not")
def verify_pipeline_route(
    request: Request, pipeline: str = Path(pattern=NAME_PATTERN),
    consumerGroup: Optional[str] = Query(None, pattern=NAME_PATTERN),
    topic: Optional[str] = Query(None, pattern=TOPIC_PATTERN),
    unexplainedOnly: bool = Query(False, description="list only the stretches nothing explains"),
) -> Any:
    ops: Operations = request.app.state.operations
    doc = verify_answer(verify_pipeline(ops, pipeline, consumerGroup, topic=topic))
    if unexplainedOnly:
        doc["stretches"] = [s for s in doc["stretches"] if not s["explained"]]
    return JSONResponse(doc)
