"""GET /api/search: the caller's chats whose messages match what they typed, best first, with snippets."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.chat.routes import _api
from app.db import MATCH_END, MATCH_START, SearchHit, SearchUnsupported
from app.db.search import MAX_SEARCH_LIMIT, MAX_SEARCH_OFFSET
from app.db.search_query import MAX_SEARCH_CHARS
from app.http.errors import APIError, bad_request
from app.http.params import query_int
from app.http.services import Services

DEFAULT_LIMIT = 20


def hit_json(hit: SearchHit) -> dict[str, object]:
    """One matching chat as the API shows it."""
    return {
        "session_id": hit.session_id,
        "title": hit.title,
        "updated_at": hit.updated_at.isoformat(),
        "message_id": hit.message_id,
        "position": hit.position,
        "role": hit.role,
        "snippet": hit.snippet,
        "num_matches": hit.num_matches,
    }


@_api
async def search_chats(request: Request, svc: Services, owner: str) -> Response:
    """GET /api/search?q=...&limit=&offset=: words, "phrases", and the last word as a prefix while typing."""
    q = request.query_params.get("q", "")
    if not q.strip():
        raise bad_request("q is empty: give the words to search for, e.g. /api/search?q=kv+cache", "q")
    if len(q) > MAX_SEARCH_CHARS:
        raise bad_request(f"q is {len(q)} characters long, over the limit of {MAX_SEARCH_CHARS}", "q")
    limit = query_int(request.query_params, "limit", DEFAULT_LIMIT, 1, MAX_SEARCH_LIMIT)
    offset = query_int(request.query_params, "offset", 0, 0, MAX_SEARCH_OFFSET)
    try:
        page = await svc.store.chats.search_messages(owner, q, limit=limit, offset=offset)
    except ValueError as exc:  # no word in it, too many terms
        raise bad_request(f"q: {exc}", "q") from None
    except SearchUnsupported as exc:
        raise APIError(501, str(exc), code="search_unsupported") from None
    return JSONResponse(
        {
            "query": q,
            "results": [hit_json(hit) for hit in page.hits],
            "next_offset": page.next_offset,
            "markers": {"start": MATCH_START, "end": MATCH_END},
        }
    )


routes = [Route("/api/search", search_chats, methods=["GET"])]
