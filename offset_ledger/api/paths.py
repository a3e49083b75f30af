"""Request paths: the legacy slash variants, and names that contain ``/`` as one path segment.

Kafka and Spark accept names with ``/`` (a pipeline is named after a query, which may be
``orders/eu``). A client sends such a name percent-encoded (``orders%2Feu``), but the server
decodes the path before routing, and ``/api/v1/pipelines/orders/eu/offsets`` no longer matches
``{pipeline}``. So for ``/api/v1/`` paths the router sees each raw segment decoded except for
``%2F`` and ``%25`` (kept encoded), and the ``name`` convertor decodes those in the parameter.
"""

from __future__ import annotations

import json
import re
from urllib.parse import unquote, unquote_to_bytes

from starlette.convertors import Convertor, register_url_convertor
from starlette.types import ASGIApp, Receive, Scope, Send

_SLASHES = re.compile(r"/{2,}")
_RAW_SLASHES = re.compile(rb"/{2,}")
API_PREFIX = "/api/v1/"


class NameConvertor(Convertor[str]):
    """One path segment holding a name; ``%2F`` / ``%25`` inside it are ``/`` / ``%``."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return unquote(value, errors="strict")

    def to_string(self, value: str) -> str:
        return value.replace("%", "%25").replace("/", "%2F")


register_url_convertor("name", NameConvertor())


def _clean(path: str) -> str:
    path = _SLASHES.sub("/", path)
    return (path.rstrip("/") or "/") if len(path) > 1 else path


def segment_path(raw_path: bytes) -> str | None:
    """A raw request path -> the routing path with ``/`` and ``%`` inside segments kept encoded.

    None when a segment is not UTF-8 (or holds a lone surrogate): such a name cannot be stored.
    """
    raw = raw_path.split(b"?", 1)[0]
    out = []
    for segment in _RAW_SLASHES.sub(b"/", raw).split(b"/"):
        try:
            text = unquote_to_bytes(segment).decode("utf-8")
        except UnicodeDecodeError:
            return None
        out.append(text.replace("%", "%25").replace("/", "%2F"))
    return _clean("/".join(out))


class PathNormalizer:
    """``//v1/x/`` -> ``/v1/x`` (legacy scripts send both); ``/api/v1/`` paths keep encoded slashes in names."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = _clean(scope["path"])
            if path.startswith(API_PREFIX) and scope.get("raw_path"):
                routed = segment_path(scope["raw_path"])
                if routed is None:
                    raw = json.dumps({"error": "InvalidPath",
                                      "message": "the path is not valid percent-encoded UTF-8"}).encode()
                    await send({"type": "http.response.start", "status": 400,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(raw)).encode())]})
                    await send({"type": "http.response.body", "body": raw})
                    return
                path = routed
            if path != scope["path"]:
                scope = dict(scope, path=path, raw_path=path.encode())
        await self.app(scope, receive, send)
