"""Server-rendered pages' shared parts: the Jinja2 templates, versioned static URLs, and no-store rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

REPO_ROOT = Path(__file__).resolve().parents[2]  # the supported install is the repo itself (editable)
TEMPLATES_DIR = REPO_ROOT / "templates"
STATIC_DIR = REPO_ROOT / "static"
NO_STORE = {"Cache-Control": "no-store"}


def static_url(name: str) -> str:
    """/static/<name>?v=<mtime>: a new URL whenever the file changes, so browsers never run stale scripts."""
    try:
        version = int((STATIC_DIR / name).stat().st_mtime)
    except OSError:
        version = 0
    return f"/static/{name}?v={version}"


templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
templates.env.globals["static_url"] = static_url


def render(
    request: Request,
    name: str,
    context: dict[str, Any],
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> Response:
    """A template as a no-store response."""
    headers = {**NO_STORE, **(headers or {})}
    return templates.TemplateResponse(request, name, context, status_code=status_code, headers=headers)
