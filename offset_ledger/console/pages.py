"""The console's HTML pages and static files; the pages are shells, their data comes from the JSON API."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from offset_ledger import __version__

_HERE = Path(__file__).parent
STATIC_PREFIX = "/console/static"

# Scripts and styles only from this server: the pages work offline and injected markup cannot run.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

templates = Jinja2Templates(directory=str(_HERE / "templates"))
router = APIRouter(include_in_schema=False)


def is_public(path: str) -> bool:
    """Console paths that load without a token: they hold no ledger data (the API calls behind them do)."""
    return path in ("/", "/docs", "/favicon.ico") or path.startswith("/pipelines/") \
        or path.startswith(STATIC_PREFIX + "/")


def _page(request: Request, template: str, **context: object) -> HTMLResponse:
    context = {"static": STATIC_PREFIX, "version": __version__, **context}
    return templates.TemplateResponse(request, template, context, headers=_HEADERS)


@router.get("/", response_class=HTMLResponse)
def pipelines_page(request: Request) -> HTMLResponse:
    return _page(request, "pipelines.html", title="Pipelines")


@router.get("/docs", response_class=HTMLResponse)
def docs_page(request: Request) -> HTMLResponse:
    # The API reference from /openapi.json, fetched by the page with the tab's token.
    return _page(request, "docs.html", title="API docs")


@router.get("/pipelines/{pipeline:path}", response_class=HTMLResponse)
def pipeline_page(request: Request, pipeline: str,
                  group: str | None = Query(None, min_length=1, max_length=255)) -> HTMLResponse:
    # Unknown pipelines still get the shell: whether one exists is ledger data, answered by the API.
    return _page(request, "pipeline.html", title=pipeline, pipeline=pipeline, group=group or "")


@router.get("/favicon.ico")
def favicon() -> FileResponse:
    # Browsers ask for it on their own, without the tab's token: an icon, never a 401 in the log.
    return FileResponse(_HERE / "static" / "favicon.svg", media_type="image/svg+xml",
                        headers={"Cache-Control": "max-age=86400"})


def mount(app: FastAPI) -> None:
    """Add the pages and the static files to ``app``."""
    app.include_router(router)
    app.mount(STATIC_PREFIX, StaticFiles(directory=str(_HERE / "static")), name="console-static")
