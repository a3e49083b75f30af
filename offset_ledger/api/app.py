"""The FastAPI application: middleware (paths, auth, body size), error mapping and the routers.

Error mapping (every error body is JSON ``{"error": <type>, "message": ..., ...details}``, the details
camelCase like every answer: ``operate.answers.error_answer``, the CLI's ``-f json`` error too):
UnknownPipeline / UnknownTopic / UnknownBatch -> 404, other InvalidInput -> 400, ActiveRunConflict -> 409,
LedgerUnavailable / KafkaUnavailable / other ledger, Kafka or configuration failures -> 503,
request validation -> 400 on the legacy ``/v1`` endpoints and for malformed JSON, 422 otherwise;
bodies over the limit -> 413; a missing or wrong bearer token -> 401.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from offset_ledger import __version__
from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.api import console_routes, policy_routes, routes, verify_routes
from offset_ledger.api.guard import PROBE_PATHS, SiteGuard, allowed_hosts, changes_state
from offset_ledger.api.paths import PathNormalizer
from offset_ledger.api.tokens import PRINCIPAL, ApiToken, authenticate, load_tokens
from offset_ledger.config import Settings
from offset_ledger.config import settings as read_settings
from offset_ledger.console import pages as console_pages
from offset_ledger.errors import (
    ActiveRunConflict,
    ConfigError,
    DataLossError,
    InvalidInput,
    KafkaError,
    LedgerError,
    OffsetLedgerError,
    UnknownBatch,
    UnknownConsumerGroup,
    UnknownPipeline,
    UnknownTopic,
)
from offset_ledger.operate import reads
from offset_ledger.operate.answers import error_answer
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.visibility import bound, current_scope

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1 << 20


def status_for(exc: OffsetLedgerError) -> int:
    """The HTTP status of one of our errors."""
    if isinstance(exc, (UnknownPipeline, UnknownConsumerGroup, UnknownTopic, UnknownBatch)):
        return 404
    if isinstance(exc, InvalidInput):
        return 400
    if isinstance(exc, (ActiveRunConflict, DataLossError)):
        return 409
    if isinstance(exc, (LedgerError, KafkaError, ConfigError)):
        return 503
    return 500


def safe_json(value: Any) -> Any:
    """``value`` with every string encodable as UTF-8: errors echo input, and a lone surrogate
    (``"\\ud800"`` is valid JSON) would make encoding the answer fail with a 500."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8") if _has_surrogate(value) else value
    if isinstance(value, dict):
        return {safe_json(k): safe_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [safe_json(v) for v in value]
    return value


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _json_error(status: int, error: str, message: str, headers: Mapping[str, str] | None = None,
                **details: Any) -> JSONResponse:
    return JSONResponse(safe_json({"error": error, "message": message, **details}), status_code=status,
                        headers=dict(headers or {}))


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> None:
    raw = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": raw})


class BearerAuth:
    """With tokens configured, every path but /healthz and ``public`` ones needs ``Authorization: Bearer <secret>``.

    The matching token's name and role go into the scope (``PRINCIPAL``); a ``read`` token on a
    state-changing route is a 403. The token's pipeline scope is bound for the request
    (``operate.visibility``), where every read applies it. ``public`` admits the console's HTML shells and static files,
    which carry no ledger data.
    """

    def __init__(self, app: ASGIApp, tokens: Sequence[ApiToken], public: Callable[[str], bool] | None = None) -> None:
        self.app = app
        self.tokens = tuple(tokens)
        self.public = public or (lambda _path: False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or not self.tokens or scope["path"] in PROBE_PATHS
                or self.public(scope["path"])):
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                given = value
                break
        scheme, _, credential = given.partition(b" ")
        token = authenticate(self.tokens, credential.strip()) if scheme.lower() == b"bearer" else None
        if token is None:
            await _send_json(send, 401, {"error": "Unauthorized",
                                         "message": "missing or invalid bearer token"},
                             {"WWW-Authenticate": "Bearer"})
            return
        if not token.may_operate and changes_state(scope["method"], scope["path"]):
            await _send_json(send, 403, {"error": "Forbidden",
                                         "message": f"token {token.name!r} has role {token.role!r}; "
                                                    "resets and policy changes need an operate token"})
            return
        # The token's pipeline scope holds for everything this request reads (operate.visibility).
        with bound(token.scope):
            await self.app(dict(scope, **{PRINCIPAL: token}), receive, send)


class BodyLimit:
    """Reads the whole request body up front and answers 413 when it exceeds the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = {"error": "PayloadTooLarge", "message": f"request body exceeds {self.max_bytes} bytes",
                   "maxBytes": self.max_bytes}
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _send_json(send, 400, {"error": "BadRequest", "message": "invalid Content-Length"})
                    return
                if declared > self.max_bytes:
                    await _send_json(send, 413, too_big)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_json(send, 413, too_big)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def scope_gate(request: Request) -> None:
    """Every API route: a pipeline the caller's scope hides, named in the path (``{pipeline}``) or the
    legacy ``pipelineName``, is an unknown pipeline before the route runs. The reads apply the scope
    too (``operate.known``); this gate also holds for a route that would write a pipeline the ledger
    does not know yet (``newPipeline`` policies). The console's HTML shells are left alone: they hold
    no ledger data, and an unknown name gets the same shell."""
    scope = current_scope()
    route = request.scope.get("route")
    if scope.unrestricted or not getattr(route, "include_in_schema", False):
        return
    for name in (request.path_params.get("pipeline"), request.query_params.get("pipelineName")):
        if isinstance(name, str) and not scope.allows(name):
            reads.require_visible(request.app.state.operations, name)


def create_app(
    settings: Settings | None = None, *, dsn: str | None = None, bootstrap_servers: str | None = None,
    kafka_options: Mapping[str, Any] | None = None, api_token: str | None = None,
    operations: Operations | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    kafka_timeout_ms: int = 10_000, tokens: Sequence[ApiToken] | None = None,
    hosts: Sequence[str] = (),
) -> FastAPI:
    """The API over one ledger and one Kafka cluster; arguments win over ``OFFSET_LEDGER_*`` settings.

    ``tokens`` replaces every configured token; ``hosts`` adds to the allowed ``Host`` names.
    """
    s = settings or read_settings()
    accepted = list(tokens) if tokens is not None else load_tokens(s, api_token)
    served = allowed_hosts([*hosts, *(s.allowed_hosts or "").split(",")])
    if operations is None:
        # The server's addresses, resolved once (the arguments, else the settings); never a new ledger:
        # a mistyped SQLite path is an error (serve checks the schema at start).
        ledger = LedgerAddress.resolve(s.resolved_dsn(dsn), create=False)  # ``settings`` given: its home
        kafka = KafkaAddress.resolve(bootstrap_servers or s.bootstrap_servers, kafka_options,
                                     timeout_ms=kafka_timeout_ms)
        operations = Operations.open(ledger, kafka)
    ops = operations

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        ops.close()

    app = FastAPI(
        lifespan=lifespan,
        title="offset-ledger",
        version=__version__,
        description="Kafka offsets of PySpark Structured Streaming pipelines: positions, history, lag, "
                    "topic details and audited resets. The five /v1 endpoints keep the legacy tool's "
                    "paths and shapes.",
        redirect_slashes=False,
        dependencies=[Depends(scope_gate)],
        # Swagger UI and ReDoc load from a CDN the console's CSP refuses, and a browser cannot send
        # the bearer token on a navigation: the console's own /docs page renders /openapi.json.
        docs_url=None, redoc_url=None,
    )
    app.state.operations = operations
    app.state.auth_enabled = bool(accepted)

    @app.exception_handler(OffsetLedgerError)
    async def _ours(_request: Request, exc: OffsetLedgerError) -> JSONResponse:
        status = status_for(exc)
        headers = {"Retry-After": "5"} if status == 503 else None
        if status >= 500:
            log.warning("%s: %s", type(exc).__name__, exc.message)
        return JSONResponse(safe_json(_jsonable(error_answer(exc))), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")),
                   "type": str(e.get("type", ""))} for e in exc.errors()]
        malformed = any(e["type"] == "json_invalid" for e in errors)
        status = 400 if malformed or request.url.path.startswith("/v1/") else 422
        message = "malformed JSON body" if malformed else "; ".join(
            f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors)[:2000]
        return _json_error(status, "MalformedJSON" if malformed else "RequestValidationError", message,
                           errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        names = {404: "NotFound", 405: "MethodNotAllowed"}
        return _json_error(exc.status_code, names.get(exc.status_code, "HTTPError"), str(exc.detail),
                           headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return _json_error(500, "InternalError", "internal error; see the server log")

    # Every status the middleware and handlers can answer is in the schema (schemathesis checks it).
    app.include_router(routes.legacy, responses=error_responses(400, 401, 403, 404, 409, 413, 415, 503))
    app.include_router(routes.resource, responses=error_responses(400, 401, 403, 404, 409, 413, 415, 422, 503))
    app.include_router(policy_routes.router, responses=error_responses(400, 401, 403, 404, 413, 415, 422, 503))
    app.include_router(verify_routes.router, responses=error_responses(400, 401, 404, 422, 503))
    app.include_router(routes.service, responses=error_responses(400, 401, 503))
    app.include_router(console_routes.router, responses=error_responses(400, 401, 404, 422, 503))
    console_pages.mount(app)

    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(BearerAuth, tokens=accepted, public=console_pages.is_public)
    # Cross-site refusals come before authentication: they hold whatever token a request carries.
    app.add_middleware(SiteGuard, hosts=served)
    app.add_middleware(PathNormalizer)  # added last = outermost: guard, auth and routing see clean paths

    return app


_ERROR_SCHEMA = {"type": "object", "required": ["error", "message"],
                 "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
                 "additionalProperties": True}
_STATUS_TEXT = {
    400: "bad input (malformed JSON, bad names, offsets, cursors or hosts); nothing written",
    401: "missing or invalid bearer token", 403: "a read token on a reset, or a cross-site request",
    404: "unknown pipeline, topic, batch or path", 409: "the pipeline has an active run (force to override)",
    413: "request body too large", 415: "a request body that is not application/json",
    422: "the request does not match the schema", 503: "Kafka or the ledger database cannot be reached",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error statuses, all with the one error body."""
    return {s: {"description": _STATUS_TEXT[s], "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
            for s in statuses}


def _jsonable(value: Any) -> Any:
    from fastapi.encoders import jsonable_encoder

    return jsonable_encoder(value)

