"""Who may call what: each route serves one audience, and one middleware
checks the audience's credentials before the handler runs, hence before
any body is read or any database is touched (a refusal costs nothing but
the comparison)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from enum import Enum
from typing import TypeVar

from aiohttp import HttpVersion11, web

from hooklane import metrics
from hooklane.api.actions import Scope
from hooklane.api.context import ADMIN_TOKENS, INGEST_TOKENS, SETTINGS, SHARES, set_grant, set_scope
from hooklane.api.errors import Problem, Refused, problem, renderer
from hooklane.api.inputs import ADMIN_MAX_BODY_BYTES, check_length
from hooklane.api.shares import Share
from hooklane.api.tokens import TokenSource, bearer
from hooklane.errors import InvalidInput, printable
from hooklane.settings import Settings
from hooklane.store import grants
from hooklane.store.connection import StoreConnection
from hooklane.store.grants import Access
from hooklane.tokens import Grant

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
H = TypeVar("H", bound=Handler)

# The dashboard keeps the admin token in this cookie (HttpOnly, SameSite=Strict).
SESSION_COOKIE = "hooklane_admin"
LOGIN_PATH = "/dashboard/login"
# The portal keeps its session token in this cookie (HttpOnly).
PORTAL_COOKIE = "hooklane_portal"
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
    # Programs acting for one tenant, with a tenant token (hooklane/store/grants.py).
    TENANT = "tenant"
    # One tenant's people, in a browser: a session from a signed link.
    PORTAL = "portal"


_TENANT_AUDIENCES = (Audience.TENANT, Audience.PORTAL)


def audience(*who: Audience, access: Access = Access.READ) -> Callable[[H], H]:
    """Mark a handler as serving ``who``; a tenant's route also says what
    its grant must allow. A route whose handler has no mark is refused, so
    that a forgotten mark cannot open a route. A handler of one audience is
    its route; one of several is added once for each (:func:`route`)."""

    def mark(handler: H) -> H:
        handler.audiences = who  # type: ignore[attr-defined]
        handler.access = access  # type: ignore[attr-defined]
        if len(who) == 1:
            handler.audience = who[0]  # type: ignore[attr-defined]
        return handler

    return mark


def route(who: Audience, handler: Handler) -> Handler:
    """The route of ``handler`` for one of the audiences it serves."""
    assert who in getattr(handler, "audiences", ()), f"{handler.__name__} does not serve {who}"

    @functools.wraps(handler)
    async def routed(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    routed.audience = who  # type: ignore[attr-defined]
    return routed


def audience_of(request: web.Request) -> Audience | None:
    return getattr(request.match_info.handler, "audience", None)


# The pool's share each audience takes its connections in; the open
# routes that reach the database are the portal's link pages: the tenants'.
_SHARES: dict[Audience | None, Share] = {
    Audience.INGEST: Share.INGEST,
    Audience.ADMIN: Share.ADMIN,
    Audience.DASHBOARD: Share.ADMIN,
}


def connection(request: web.Request) -> AbstractAsyncContextManager[StoreConnection]:
    """A connection of the API's pool, in the share of the request's
    audience (:mod:`.shares`)."""
    return request.app[SHARES].acquire(_SHARES.get(audience_of(request), Share.TENANT))


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    found = credentials(request)
    if isinstance(found, web.StreamResponse):
        return found
    who = audience_of(request)
    if found is not None:
        set_grant(request, found)
        if who in _ACTORS:
            set_scope(request, Scope(_ACTORS[who]))
    elif who in _TENANT_AUDIENCES:
        refused = await _tenant_session(request)
        if refused is not None:
            return refused
    return await handler(request)


# Who acts, as the audit log and a discarded delivery name the face.
_ACTORS: dict[Audience | None, str] = {
    Audience.ADMIN: "the admin API",
    Audience.DASHBOARD: "the dashboard",
    Audience.TENANT: "the tenant API",
    Audience.PORTAL: "the portal",
}


def credentials(request: web.Request) -> Grant | web.Response | None:
    """The grant of the request's credentials, the refusal of its route's
    audience, or None for a route that needs none here. A tenant's route
    is only checked for the shape of its credentials here (no database):
    None, and the middleware looks its session up."""
    who = audience_of(request)
    if who is Audience.OPEN or request.match_info.http_exception is not None:
        # Unmatched routes fall through to aiohttp's 404 or 405.
        return None
    if who is None:
        raise web.HTTPNotFound()
    if who is Audience.INGEST:
        return _token(request, request.app[INGEST_TOKENS], "an ingest token")
    if who in _TENANT_AUDIENCES:
        return _tenant_credentials(request, who)
    tokens = request.app[ADMIN_TOKENS]
    if not tokens.configured:
        # Without an admin token the admin routes and the dashboard are off.
        raise web.HTTPNotFound()
    if who is Audience.ADMIN or "Authorization" in request.headers:
        return _token(request, tokens, "an admin token")
    found = tokens.current().check(request.cookies.get(SESSION_COOKIE, ""))
    if found is None:
        if request.method in _SAFE_METHODS:
            raise web.HTTPSeeOther(LOGIN_PATH)
        return _unauthorized(request, "an admin token")
    return _same_origin_change(request) or found


def _same_origin_change(request: web.Request) -> web.Response | None:
    if request.method not in _SAFE_METHODS and not same_origin(request):
        # A cookie rides along with any site's form post; the browser's own
        # headers tell whether one of our own pages sent this one.
        return _refusal(request, 403, "cross_origin", "a change must come from the page's own forms")
    return None


def _refusal(request: web.Request, status: int, code: str, detail: str) -> web.Response:
    """A refusal before the handler runs: the portal's pages answer it in
    HTML, as they answer their own problems (their renderer); everything
    else in JSON."""
    if audience_of(request) is Audience.PORTAL:
        return renderer(request)(request, Problem(status, code, detail))
    return problem(status, code, detail)


def tenant_token(request: web.Request) -> str | None:
    """The session token of a tenant's request: its bearer token on the
    tenant API, its cookie in the portal."""
    if audience_of(request) is Audience.TENANT:
        return bearer(request.headers.get("Authorization"))
    return request.cookies.get(PORTAL_COOKIE) or None


def _tenant_credentials(request: web.Request, who: Audience) -> web.Response | None:
    if tenant_token(request) is None:
        if who is Audience.PORTAL:
            return _refusal(
                request, 401, "no_session", "open the portal through the link your platform gives you"
            )
        return _unauthorized(request, "a tenant token")
    if who is Audience.PORTAL:
        return _same_origin_change(request)
    return None


async def _tenant_session(request: web.Request) -> web.Response | None:
    """Look the tenant's session up and keep it on the request; the
    refusal when it is unknown or expired, or allows less than the route."""
    token = tenant_token(request)
    assert token is not None, "credentials() checked it is there"
    async with connection(request) as conn:
        found = await grants.session_grant(conn, token)
    if found is None:
        if audience_of(request) is Audience.PORTAL:
            return _refusal(
                request, 401, "no_session", "this session has ended: open the portal from your platform again"
            )
        return _unauthorized(request, "a live tenant token")
    wanted: Access = getattr(request.match_info.handler, "access", Access.READ)
    if not found.allows(wanted):
        return _refusal(
            request, 403, "forbidden", f"this session may {found.access} only; this needs {wanted}"
        )
    set_scope(request, Scope(_ACTORS[audience_of(request)], found))
    return None


def _token(request: web.Request, tokens: TokenSource, wanted: str) -> Grant | web.Response:
    found = tokens.current().check(bearer(request.headers.get("Authorization")) or "")
    return _unauthorized(request, wanted) if found is None else found


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """The expect handler of every POST route: ``Expect: 100-continue`` is
    answered 100 only once the credentials and the announced
    ``Content-Length`` pass the checks the request will meet, so that a
    client without a token, or with too large a body, never sends it.
    aiohttp runs this before the middlewares: a refusal is counted here."""
    try:
        found = credentials(request)
        if not isinstance(found, web.StreamResponse):
            limit = (
                ADMIN_MAX_BODY_BYTES
                if audience_of(request) is Audience.ADMIN
                else request.config_dict[SETTINGS].api_max_body_bytes
            )
            check_length(request.content_length, limit)
    except Refused as exc:
        found = problem(exc.status, exc.code, exc.detail, exc.field)
    except web.HTTPException as exc:
        found = problem(exc.status, "not_found" if exc.status == 404 else "refused", exc.reason)
    if isinstance(found, web.StreamResponse):
        # The client may be about to send the body regardless: the
        # connection is not kept for a next request behind it.
        found.force_close()
        count(request, found.status)
        return found
    if request.version == HttpVersion11:
        expect = request.headers.get("Expect", "")
        if expect.lower() != "100-continue":
            response = problem(417, "expectation_failed", f"unknown Expect: {printable(expect)}")
            count(request, response.status)
            return response
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        # The answer's own size counts from here.
        request.writer.output_size = 0
    return None


def count(request: web.Request, status: int) -> None:
    """Count an answered request (``hooklane_api_requests_total``)."""
    resource = request.match_info.route.resource
    if resource is None:
        metrics.API_REQUESTS.labels("unmatched", "-", str(status)).inc()
    else:
        metrics.API_REQUESTS.labels(resource.canonical, request.method, str(status)).inc()


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
