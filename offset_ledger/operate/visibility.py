"""The pipeline scope of the caller being served: the one place every read asks what it may show.

The API's authentication resolves a request's token once and binds its scope here for the rest
of the request (``bound``); the reads every face shares apply it: ``known.require_pipeline`` (the
gate of every per-pipeline read, reset and policy: outside the scope a pipeline is unknown, with
the same 404 an unknown name gets), ``known.pipeline_names`` (the names an error lists),
``reads.list_pipelines``, ``operations_metrics.metrics`` and the findings counts. The CLI binds
nothing and sees everything, as a process that holds the ledger's DSN does.

A context variable rather than a parameter threaded through every verb: each route and verb that
took the scope as an argument would be one more place to forget it, and Starlette copies the
context into the thread a synchronous route runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from offset_ledger.rules.scope import EVERYTHING, PipelineScope

T = TypeVar("T")

_SCOPE: ContextVar[PipelineScope] = ContextVar("offset_ledger_pipeline_scope", default=EVERYTHING)


def current_scope() -> PipelineScope:
    """The scope bound for the caller being served (every pipeline when none is bound)."""
    return _SCOPE.get()


@contextmanager
def bound(scope: PipelineScope) -> Iterator[None]:
    """Serve the enclosed work with ``scope``."""
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def unscoped(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` seeing every pipeline: a computation shared by callers of different scopes
    (``rules.coalesce``) reads everything once, and each caller cuts the answer to its own scope."""
    with bound(EVERYTHING):
        return fn(*args)
