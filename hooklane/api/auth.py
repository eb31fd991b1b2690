"""Who may call what: each route serves one audience, and one middleware
checks the audience's credentials before the handler runs, hence before
any body is read or any database is touched (a refusal costs nothing but
the comparison)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import Enum
from typing import TypeVar

from aiohttp import web

from hooklane import metrics
from hooklane.api.context import ADMIN_TOKENS, INGEST_TOKENS, set_grant
from hooklane.api.errors import problem
from hooklane.api.tokens import TokenSource, bearer
from hooklane.errors import InvalidInput
from hooklane.settings import Settings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
H = TypeVar("H", bound=Handler)

# The dashboard keeps the admin token in this cookie (HttpOnly, SameSite=Strict).
SESSION_COOKIE = "hooklane_admin"
LOGIN_PATH = "/dashboard/login"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Audience(Enum):
    # No credentials: the OpenAPI document, the probes, the login page.
    OPEN = "open"
    # Producers, with an ingest token.
    INGEST = "ingest"
    # Programs of the platform's operators, with an admin token.
    ADMIN = "admin"
    # People, in a browser: the admin token from the login cookie.
    DASHBOARD = "dashboard"


def audience(who: Audience) -> Callable[[H], H]:
    """Mark a handler as serving ``who``. A route whose handler has no mark
    is refused, so that a forgotten mark cannot open a route."""

    def mark(handler: H) -> H:
        handler.audience = who  # type: ignore[attr-defined]
        return handler

    return mark


def audience_of(request: web.Request) -> Audience | None:
    return getattr(request.match_info.handler, "audience", None)


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    who = audience_of(request)
    if who is Audience.OPEN or request.match_info.http_exception is not None:
        # Unmatched routes fall through to aiohttp's 404 or 405.
        return await handler(request)
    if who is None:
        raise web.HTTPNotFound()
    if who is Audience.INGEST:
        return await _with_token(request, handler, request.app[INGEST_TOKENS], "an ingest token")
    tokens = request.app[ADMIN_TOKENS]
    if not tokens.configured:
        # Without an admin token the admin routes and the dashboard are off.
        raise web.HTTPNotFound()
    if who is Audience.ADMIN or "Authorization" in request.headers:
        return await _with_token(request, handler, tokens, "an admin token")
    found = tokens.current().check(request.cookies.get(SESSION_COOKIE, ""))
    if found is None:
        if request.method in _SAFE_METHODS:
            raise web.HTTPSeeOther(LOGIN_PATH)
        return _unauthorized(request, "an admin token")
    if request.method not in _SAFE_METHODS and not same_origin(request):
        # A cookie rides along with any site's form post; the browser's own
        # headers tell whether one of the dashboard's pages sent this one.
        return problem(403, "cross_origin", "a change must come from the dashboard's own pages")
    set_grant(request, found)
    return await handler(request)


async def _with_token(
    request: web.Request, handler: Handler, tokens: TokenSource, wanted: str
) -> web.StreamResponse:
    found = tokens.current().check(bearer(request.headers.get("Authorization")) or "")
    if found is None:
        return _unauthorized(request, wanted)
    set_grant(request, found)
    return await handler(request)


def same_origin(request: web.Request) -> bool:
    if request.headers.get("Sec-Fetch-Site") == "same-origin":
        return True
    return request.headers.get("Origin") == f"{request.scheme}://{request.host}"


def _unauthorized(request: web.Request, wanted: str) -> web.Response:
    if audience_of(request) is Audience.INGEST:
        # Counted here: the handler, which counts the other refusals, never ran.
        metrics.API_EVENTS_REFUSED.labels("unauthorized").inc()
    return problem(
        401,
        "unauthorized",
        f"this call needs {wanted} in an `Authorization: Bearer` header",
        headers={"WWW-Authenticate": 'Bearer realm="hooklane"'},
    )


def token_sources(settings: Settings) -> tuple[TokenSource, TokenSource]:
    """The ingest and admin token sources; ``InvalidInput`` when no ingest
    token is configured at all, or a token file cannot be read."""
    ingest_tokens = TokenSource(settings.api_tokens, settings.api_tokens_file, "HOOKLANE_API_TOKENS_FILE")
    if not ingest_tokens.configured:
        raise InvalidInput(
            "HOOKLANE_API_TOKENS",
            "is not set: the API needs at least one ingest token (or HOOKLANE_API_TOKENS_FILE)",
        )
    admin_tokens = TokenSource(
        settings.admin_tokens, settings.admin_tokens_file, "HOOKLANE_ADMIN_TOKENS_FILE"
    )
    return ingest_tokens, admin_tokens
