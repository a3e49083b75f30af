"""A pipeline's stored restart policies in the resource API: show, change (audited), history.

``GET /api/v1/pipelines/{pipeline}/policies``, ``PUT`` the same path (a change: the named policies set,
``null`` removes one, the others stay; needs an ``operate`` token like resets; audited with the
token's name; ``dryRun`` checks it and answers the policies after it without writing),
``GET .../policies/history``. The same checks as ``offset-ledger policy set``: bad
input is a 400 naming the field, and nothing is written. The names are the API's camelCase spelling
of ``offset_ledger.rules.policies.POLICY_KEYS``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Optional

from fastapi import APIRouter, Body, Header, Path, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.api import paths as _paths  # noqa: F401 - registers the {name:name} path convertor
from offset_ledger.api.tokens import PRINCIPAL
from offset_ledger.errors import InvalidInput
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.policy_store import current_policies, policy_history, set_policies
from offset_ledger.operate.inputs import NAME_PATTERN, audit_actor, check_name
from offset_ledger.operate.known import require_pipeline
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.policy_view import API_NAMES, change_dict, policies_document, to_api
from offset_ledger.rules.policies import check_policies, merged

router = APIRouter(prefix="/api/v1", tags=["policies"])

_FROM_API = {v: k for k, v in API_NAMES.items()}


class PolicyChangeBody(BaseModel):
    """``PUT /api/v1/pipelines/{pipeline}/policies``: the policies to change, and why."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [
            {"policies": {"onDataLoss": "earliest", "window": "10 minutes", "watermarkDelay": "2 minutes"},
             "reason": "windowed since v2"},
            {"policies": {"firstRun": "latest", "window": None}, "reason": "no backfill; not windowed any more"},
        ]},
    )

    policies: dict[str, Any] = Field(
        description="policies to set (camelCase: " + ", ".join(API_NAMES.values())
                    + "); null removes one (back to its default); policies not named keep their value")
    reason: Optional[StrictStr] = Field(default=None, max_length=10_000,
                                        description="why (required unless dryRun, kept in the history)")
    actor: Optional[StrictStr] = Field(default=None, min_length=1, max_length=255,
                                       description="who, as detail beside the token's name")
    dryRun: StrictBool = Field(default=False, description="check the change and answer the policies after it; "
                                                          "nothing is written")
    newPipeline: StrictBool = Field(default=False, description="the pipeline has not run yet: store its policies "
                                                               "before its first run (else an unknown pipeline "
                                                               "is a 404)")


def changes_from_api(given: Mapping[str, Any]) -> dict[str, Any]:
    """The body's camelCase policies -> checked snake_case changes (None removes); 400 naming the field."""
    if not given:
        raise InvalidInput("nothing to set: name at least one policy in \"policies\" (null removes one)")
    unknown = sorted(k for k in given if k not in _FROM_API)
    if unknown:
        raise InvalidInput(f"policies: unknown polic{'ies' if len(unknown) > 1 else 'y'} "
                           f"{', '.join(repr(k[:60]) for k in unknown)}; known: {', '.join(API_NAMES.values())}",
                           option=unknown[0][:60])
    changes = {_FROM_API[k]: v for k, v in given.items()}
    for key, value in changes.items():
        _check_text(value, f"policies.{API_NAMES[key]}")
        if key in _DURATIONS and value is not None and not isinstance(value, str):
            raise InvalidInput(f"policies.{API_NAMES[key]} must be a duration string like '10 minutes', not {value!r}",
                               option=API_NAMES[key])
        try:
            check_policies({key: value})
        except InvalidInput as exc:
            raise InvalidInput(f"policies.{API_NAMES[key]}: {exc.message}", option=API_NAMES[key]) from exc
    return changes


_DURATIONS = ("window", "slide", "watermark_delay")
# Control characters and lone surrogates (valid JSON) cannot be stored; NUL breaks PostgreSQL's jsonb.
_UNSTORABLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def _check_text(value: Any, where: str) -> None:
    """400 when a string anywhere in ``value`` holds a character the ledger cannot store."""
    if isinstance(value, str):
        if _UNSTORABLE.search(value):
            raise InvalidInput(f"{where} contains a control character or a lone surrogate")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, where)
            _check_text(v, where)
    elif isinstance(value, list):
        for v in value:
            _check_text(v, where)


def _ops(request: Request) -> Operations:
    ops: Operations = request.app.state.operations
    return ops


def _read(ops: Operations, work: Any, doing: str) -> Any:
    try:
        with ops.engine.connect() as conn:
            return work(conn)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, doing) from exc


def _known(conn: Any, pipeline: str, read: Any) -> Any:
    """``read(conn, pipeline)`` of a pipeline the ledger knows (runs, positions or stored policies); else 404."""
    require_pipeline(conn, pipeline, with_policies=True)
    return read(conn, pipeline)


@router.get("/pipelines/{pipeline:name}/policies",
            summary="The pipeline's stored restart policies, what a restart applies, and the last change (who/when/why)")
def get_policies(request: Request, pipeline: str = Path(pattern=NAME_PATTERN)) -> Any:
    check_name("pipeline", pipeline)
    history = _read(_ops(request), lambda conn: _known(conn, pipeline, policy_history), "reading policies")
    return policies_document(pipeline, history)


@router.put("/pipelines/{pipeline:name}/policies",
            summary="Change stored restart policies (null removes one); audited with who and why")
def put_policies(request: Request, pipeline: str = Path(pattern=NAME_PATTERN), body: PolicyChangeBody = Body(...),
                 x_actor: Optional[str] = Header(default=None, pattern=NAME_PATTERN)) -> Any:
    check_name("pipeline", pipeline)
    changes = changes_from_api(body.policies)
    _check_text(body.reason, "reason")
    if not body.dryRun and not (body.reason and body.reason.strip()):
        raise InvalidInput('a policy change needs a reason ("reason"); it is kept in the history')
    token = request.scope.get(PRINCIPAL)
    actor = audit_actor(token.name if token is not None else None, body.actor or x_actor, "api")
    ops = _ops(request)
    # A set that is wrong as a whole (a slide with no window) is refused with the field named; the
    # store checks it again under the pipeline lock.
    read = current_policies if body.newPipeline else (lambda conn, name: _known(conn, name, current_policies))
    before = _read(ops, lambda conn: read(conn, pipeline), "reading policies")
    try:
        after = merged(before, changes)
    except InvalidInput as exc:
        option = exc.details.get("option")
        name = API_NAMES.get(option, option) if isinstance(option, str) else None
        raise InvalidInput(f"policies{'.' + name if name else ''}: {exc.message}", option=name) from exc
    if body.dryRun:
        history = _read(ops, lambda conn: policy_history(conn, pipeline), "reading policies")
        return {**policies_document(pipeline, history, after), "dryRun": True, "before": to_api(before)}
    try:
        with ops.engine.begin() as conn:
            set_policies(conn, pipeline, changes, actor=actor, reason=body.reason)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "storing policies") from exc
    history = _read(ops, lambda conn: policy_history(conn, pipeline), "reading policies")
    return {**policies_document(pipeline, history), "dryRun": False, "before": to_api(before)}


@router.get("/pipelines/{pipeline:name}/policies/history",
            summary="Every change of the pipeline's policies, newest first: when, who, why, and the policies after it")
def get_policy_history(request: Request, pipeline: str = Path(pattern=NAME_PATTERN)) -> Any:
    check_name("pipeline", pipeline)
    history = _read(_ops(request), lambda conn: _known(conn, pipeline, policy_history), "reading policies")
    return {"pipeline": pipeline, "changes": [change_dict(c) for c in reversed(history)]}
