"""Cross-site and DNS-rebinding protection, as a pure rule and the middleware that applies it.

A web page the operator happens to open can make the browser send requests to the API on
loopback: an ``<img>`` sends a GET (the legacy reset endpoints change state on GET), an HTML form
sends a POST with a form or ``text/plain`` body, and a DNS name rebound to 127.0.0.1 lets a page
read answers too. Browsers say where a request comes from (``Sec-Fetch-Site``, ``Origin``,
``Referer``) and always send the name they connected to (``Host``); curl and scripts send none
of the first three. So:

- every request but ``/healthz`` must name an allowed host (loopback names, the bound address,
  ``OFFSET_LEDGER_ALLOWED_HOSTS``): a rebound name is refused before anything is read;
- a state-changing request (the legacy resets on any method, every POST/PUT/PATCH/DELETE) that a
  browser marks as coming from another site, or whose ``Origin``/``Referer`` is another origin, is
  refused;
- a state-changing POST with a body must be ``application/json``: forms cannot send that cross-site.

A legacy GET with a JSON body and no browser headers (the documented curl lines) passes unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
LEGACY_RESET_PATHS = frozenset({
    "/v1/resetOffsetOfAllPartitionsToEarliest", "/v1/resetOffsetOfAllPartitionsToLatest",
    "/v1/resetOffsetOfPartitions",
})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# "none": the operator typed the URL or used a bookmark; "same-origin": the console itself.
_TRUSTED_FETCH_SITES = frozenset({"same-origin", "none"})


def changes_state(method: str, path: str) -> bool:
    """Whether a request may write: the legacy resets on any method, every unsafe method."""
    return path in LEGACY_RESET_PATHS or method.upper() not in _SAFE_METHODS


def host_name(host: str) -> str:
    """``Host`` header value -> the lower-case name without port or brackets (``[::1]:9090`` -> ``::1``)."""
    text = host.strip().lower()
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    if text.count(":") == 1:
        text = text.split(":", 1)[0]
    return text.rstrip(".")


def allowed_hosts(extra: Iterable[str] = ()) -> frozenset[str]:
    """Loopback names plus ``extra`` (names or addresses; ``*`` allows any host)."""
    return LOOPBACK_HOSTS | {host_name(h) if h.strip() != "*" else "*" for h in extra if h.strip()}


def _origin(value: str) -> tuple[str, int] | None:
    """``scheme://host[:port]`` -> (host, port with the scheme's default spelled out); None if unparsable."""
    try:
        parts = urlsplit(value.strip())
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or parts.scheme not in ("http", "https"):
        return None
    return host, port or (443 if parts.scheme == "https" else 80)


def same_origin(value: str, host: str) -> bool:
    """Whether an ``Origin``/``Referer`` names the server the request reached (its ``Host`` header).

    A ``Host`` without a port (as a TLS proxy forwards it) matches the name on any port: the
    browser's origin then carries the proxy's scheme and port, which the server cannot know.
    """
    origin = _origin(value)
    if origin is None:
        return False
    name = host_name(host)
    text = host.strip().lower()
    port_text = text.rsplit("]", 1)[-1] if text.startswith("[") else (text if text.count(":") == 1 else "")
    port = port_text.rsplit(":", 1)[1] if ":" in port_text else ""
    if origin[0].strip("[]") != name:
        return False
    return not port or (port.isdigit() and int(port) == origin[1])


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: HTTP status, error name and a message that says what to change."""

    status: int
    error: str
    message: str


#: Probes (kubelet, load balancers) use the pod address and carry no token.
PROBE_PATHS = frozenset({"/healthz", "/livez"})


def check_request(method: str, path: str, headers: Mapping[str, str], hosts: frozenset[str]) -> Refusal | None:
    """The guard's rule over one request's method, clean path and (lower-case) headers; None: let it pass."""
    host = headers.get("host")
    if path not in PROBE_PATHS and host is not None and "*" not in hosts and host_name(host) not in hosts:
        return Refusal(400, "InvalidHost",
                       f"host {host_name(host)[:100]!r} is not served here; add it to OFFSET_LEDGER_ALLOWED_HOSTS")
    if not changes_state(method, path):
        return None
    site = headers.get("sec-fetch-site")
    if site is not None and site.strip().lower() not in _TRUSTED_FETCH_SITES:
        return Refusal(403, "CrossSiteRequest",
                       f"refused: the browser marked this request as {site[:20]!r} (not from this server's pages)")
    for header in ("origin", "referer"):
        value = headers.get(header)
        if value is None:
            continue
        if host is None or not same_origin(value, host):
            return Refusal(403, "CrossSiteRequest",
                           f"refused: {header} {value[:100]!r} is not this server's origin")
    if method.upper() not in _SAFE_METHODS:
        ctype = headers.get("content-type")
        if ctype is None:
            empty = headers.get("content-length", "0").strip() == "0" and "transfer-encoding" not in headers
            if not empty:
                return Refusal(415, "UnsupportedMediaType", "a request body must be sent as application/json")
        else:
            media = ctype.split(";", 1)[0].strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                return Refusal(415, "UnsupportedMediaType",
                               f"a {method.upper()} body must be application/json, not {media[:60]!r}")
    return None


class SiteGuard:
    """ASGI middleware applying :func:`check_request` (installed inside the path normalizer)."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str]) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers: dict[str, str] = {}
            for name, value in scope.get("headers", []):
                # Repeated headers: the first wins; latin-1 never fails on bytes.
                headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
            refusal = check_request(scope["method"], scope["path"], headers, self.hosts)
            if refusal is not None:
                raw = json.dumps({"error": refusal.error, "message": refusal.message}).encode()
                await send({"type": "http.response.start", "status": refusal.status,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(raw)).encode())]})
                await send({"type": "http.response.body", "body": raw})
                return
        await self.app(scope, receive, send)
