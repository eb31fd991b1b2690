"""The dashboard's pages (``/dashboard``): endpoints by oldest pending age,
one endpoint's recent deliveries, one delivery with its attempts, an
endpoint's attempts over a time window, the event types that reached
nobody (unrouted, refused), and the buttons that repair them.

Server-rendered HTML (Jinja2, every value escaped) and one small script
that refreshes the live part of a page; without JavaScript a meta refresh
does. The admin token is the credential (:mod:`.auth`): a person types it
into the login form once and it rides in an HttpOnly, SameSite=Strict
cookie from then on. Every change is a form POST answered by a redirect
(303) back to the page, with what happened in a one-shot cookie, so that
reloading the page never repeats it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import asyncpg
from aiohttp import web

from hooklane import charts, store
from hooklane.api import actions, browser, inputs, pages
from hooklane.api.auth import (
    LOGIN_PATH,
    SESSION_COOKIE,
    Audience,
    audience,
    connection,
    expect_continue,
    same_origin,
)
from hooklane.api.context import ADMIN_TOKENS, scope
from hooklane.api.errors import Problem, answers_in
from hooklane.errors import InvalidInput, shown
from hooklane.health import EndpointHealth
from hooklane.times import rfc3339

HOME = "/dashboard"
# What happened, for the page the POST redirects to; read once, then dropped.
FLASH_COOKIE = "hooklane_flash"
# Enough for the recent past at a glance; older ones are a click ("older") away.
DELIVERIES_PER_PAGE = 50
ATTEMPTS_PER_PAGE = 50
# The event types page: the types most unrouted or refused over the last
# day, this many a page, and no further than this page (types past it are
# a long tail of ones and twos).
TYPES_PER_PAGE = 50
MAX_TYPE_PAGE = 200
RECENT = timedelta(hours=24)

_SECURITY_HEADERS = pages.security_headers()


def add_routes(app: web.Application) -> None:
    """Add the dashboard's pages to ``app``."""
    browser.add_routes(app, FACE, Audience.DASHBOARD)
    router = app.router
    router.add_get(LOGIN_PATH, login_page)
    router.add_get(f"{HOME}/endpoints/{{namespace}}/{{name}}", endpoint_page)
    router.add_get(f"{HOME}/event-types", event_types_page)
    router.add_get(f"{HOME}/endpoints/{{namespace}}/{{name}}/attempts", attempts_page)
    router.add_get(f"{HOME}/static/{{file}}", pages.static)
    for path, handler in (
        (LOGIN_PATH, log_in),
        (f"{HOME}/logout", log_out),
        (f"{HOME}/endpoints/{{namespace}}/{{name}}/reactivate", reactivate),
    ):
        router.add_post(path, handler, expect_handler=expect_continue)


# Pure helpers.


# The sentence for what the dashboard's buttons did (:func:`.pages.flash_value`);
# None for any other cookie value, so that one set elsewhere shows nothing.
flash_message = pages.Flashes(
    {
        "reactivated": "Endpoint reactivated: its pending deliveries go out again.",
        "not-deactivated": "The endpoint is not deactivated: nothing to reactivate, its circuit is left as it is.",
        "logged-out": "Logged out.",
    }
).message


def _chosen(query: Mapping[str, str], key: str) -> str | None:
    # A filter form sends what is left empty as "": all.
    return query.get(key) or None


@dataclass(frozen=True)
class DeliveryFilter:
    """Which deliveries the endpoint page lists, as its form wrote them:
    their state, their last attempt's status (``503``, ``5xx``) or failure
    class; None: any."""

    state: str | None = None
    status: str | None = None
    failure: str | None = None

    def query(self) -> list[tuple[str, str]]:
        """The query string of the form that chose these, without what is
        left empty: for the links and forms that keep the filter."""
        return [
            (k, v)
            for k, v in (("state", self.state), ("status", self.status), ("failure", self.failure))
            if v
        ]


def delivery_filter(query: Mapping[str, str]) -> DeliveryFilter:
    status = _chosen(query, "status")
    store.check_status_filter(status)
    return DeliveryFilter(
        pages.state_filter(query.get("state")), status, store.check_failure(_chosen(query, "failure"))
    )


@dataclass(frozen=True)
class AttemptFilter:
    """Which attempts the attempts page lists: recorded in [since, until),
    of a status (``503``, ``5xx``), failure class and outcome (None: any)."""

    since: datetime
    until: datetime
    status: str | None = None
    failure: str | None = None
    outcome: str | None = None

    def query(self) -> list[tuple[str, str]]:
        values = [
            ("since", rfc3339(self.since)),
            ("until", rfc3339(self.until)),
            ("status", self.status),
            ("failure", self.failure),
            ("outcome", self.outcome),
        ]
        return [(k, v) for k, v in values if v]


def attempt_filter(query: Mapping[str, str], now: datetime) -> AttemptFilter:
    """The attempts page's filter; its window, when left out, the hour up to
    ``now`` (the database's time: the one attempts are recorded in)."""
    since, until = inputs.time_range({k: v for k, v in query.items() if v}, now=now)
    status = _chosen(query, "status")
    store.check_status_filter(status)
    outcome = _chosen(query, "outcome")
    store.check_outcomes(None if outcome is None else [outcome])
    return AttemptFilter(since, until, status, store.check_failure(_chosen(query, "failure")), outcome)


def type_page(query: Mapping[str, str]) -> int:
    """The event types page's number (1: the first), as its links write it."""
    text = _chosen(query, "page")
    if text is None:
        return 1
    if not text.isascii() or not text.isdigit() or len(text) > 4 or not 1 <= int(text) <= MAX_TYPE_PAGE:
        raise InvalidInput("page", f"must be a page number from 1 to {MAX_TYPE_PAGE}, not {shown(text)}")
    return int(text)


# Rendering.

_TEMPLATES = pages.environment(
    HOME,
    refresh_seconds=pages.REFRESH_SECONDS,
    failures=store.FAILURES,
    outcomes=store.OUTCOMES,
)


def render(
    template: str, status: int = 200, headers: dict[str, str] | None = None, **values: Any
) -> web.Response:
    return pages.render(_TEMPLATES, template, status, {**_SECURITY_HEADERS, **(headers or {})}, **values)


_TITLES = {408: "Too slow", 422: "Not understood", 503: "Database unavailable"}


def problem_page(request: web.Request, found: Problem) -> web.Response:
    """A problem (:mod:`.errors`) as a page: the database away is a page
    that retries by itself (a page that was read; a form post is not
    repeated behind the person's back), a bad input a page saying so."""
    detail = pages.refusal_text(found.field, found.detail)
    if found.retry_after is None:
        return render("problem.html", found.status, title=_TITLES.get(found.status, "Refused"), detail=detail)
    retry = {"retry_seconds": pages.REFRESH_SECONDS} if request.method in ("GET", "HEAD") else {}
    return render(
        "problem.html",
        found.status,
        headers={"Retry-After": str(pages.REFRESH_SECONDS)},
        title=_TITLES.get(found.status, "Unavailable"),
        detail=detail + (". Retrying by itself." if retry else "."),
        **retry,
    )


# A page answers its problems in HTML, through the API's one mapping of
# errors (:func:`.errors.classify`); its database calls are bounded by the
# request's deadline, in the root middleware, so a page never hangs.
browser_page = answers_in(problem_page)


# Pages.


@audience(Audience.OPEN)
async def login_page(request: web.Request) -> web.Response:
    if not request.app[ADMIN_TOKENS].configured:
        raise web.HTTPNotFound()
    return FACE.shown_once(request, "login.html", refused=False)


@audience(Audience.OPEN)
async def log_in(request: web.Request) -> web.Response:
    tokens = request.app[ADMIN_TOKENS]
    if not tokens.configured:
        raise web.HTTPNotFound()
    if not same_origin(request):
        # Another site's form could otherwise log a browser in with a token
        # of the attacker's choosing.
        return render("problem.html", 403, title="Refused", detail="Log in from the dashboard's own page.")
    form = await request.post()
    token = form.get("token")
    if not isinstance(token, str) or tokens.current().check(token.strip()) is None:
        return render("login.html", 401, refused=True, flash=None)
    response = FACE.redirect(request, HOME)
    response.set_cookie(
        SESSION_COOKIE,
        token.strip(),
        path=HOME,
        httponly=True,
        samesite="Strict",
        secure=pages.is_https(request.scheme, request.headers.get("X-Forwarded-Proto")),
    )
    return response


@audience(Audience.DASHBOARD)
async def log_out(request: web.Request) -> web.Response:
    response = FACE.redirect(request, LOGIN_PATH, pages.flash_value("logged-out"))
    response.del_cookie(SESSION_COOKIE, path=HOME)
    return response


@audience(Audience.DASHBOARD)
@browser_page
async def endpoint_page(request: web.Request) -> web.Response:
    async def read(conn: asyncpg.Connection, h: EndpointHealth) -> dict[str, Any] | None:
        chosen = delivery_filter(request.query)
        span = charts.check_span(request.query.get("span"))
        page = await store.endpoint_deliveries(
            conn,
            h.namespace,
            h.name,
            states=None if chosen.state is None else [chosen.state],
            status=store.check_status_filter(chosen.status),
            failure=chosen.failure,
            cursor=inputs.delivery_cursor(request.query, "before"),
            limit=DELIVERIES_PER_PAGE,
        )
        found = await store.endpoint_chart(conn, h.namespace, h.name, span)
        ordering = await store.endpoint_ordering(conn, h.namespace, h.name)
        held = await store.held_keys(conn, h.namespace, h.name, limit=store.HELD_KEYS_SHOWN)
        if page is None or found is None or ordering is None or held is None:
            return None
        links = _endpoint_links(h.namespace, h.name, chosen.query())
        return {
            "page": page,
            "ordering": ordering,
            "held": held,
            "charts": charts.endpoint_charts(span, h.observed_at, found),
            "span_links": pages.span_links(links["path"], chosen.query(), span),
            **links,
        }

    return await _filtered(request, "endpoint.html", read)


@audience(Audience.DASHBOARD)
@browser_page
async def attempts_page(request: web.Request) -> web.Response:
    async def read(conn: asyncpg.Connection, h: EndpointHealth) -> dict[str, Any] | None:
        chosen = attempt_filter(request.query, h.observed_at)
        page = await store.endpoint_attempts(
            conn,
            h.namespace,
            h.name,
            since=chosen.since,
            until=chosen.until,
            outcomes=None if chosen.outcome is None else [chosen.outcome],
            status=store.check_status_filter(chosen.status),
            failure=chosen.failure,
            cursor=inputs.attempt_cursor(request.query, "after"),
            limit=ATTEMPTS_PER_PAGE,
        )
        if page is None:
            return None
        links = _endpoint_links(h.namespace, h.name, [])
        older = None if page.cursor is None else [*chosen.query(), ("after", page.cursor)]
        return {
            "page": page,
            "chosen": chosen,
            "window_given": bool(_chosen(request.query, "since") or _chosen(request.query, "until")),
            "next_url": None if older is None else f"{links['path']}/attempts?{urlencode(older)}",
            **links,
        }

    return await _filtered(request, "attempts.html", read)


@audience(Audience.DASHBOARD)
@browser_page
async def event_types_page(request: web.Request) -> web.Response:
    """Per event type, what reached no receiver: events kept unrouted and
    publishes the catalogue refused. Not a live page: at millions of events
    its counts cost a read of every unrouted event and of the day's
    refusals (docs/operations.md), which a refresh every few seconds would
    repeat for nobody."""
    number = type_page(request.query)
    async with connection(request) as conn:
        found = await store.event_type_counts(
            conn,
            datetime.now(UTC) - RECENT,
            limit=TYPES_PER_PAGE,
            offset=(number - 1) * TYPES_PER_PAGE,
        )
    last = min(-(-found.types // TYPES_PER_PAGE), MAX_TYPE_PAGE)
    return FACE.shown_once(
        request,
        "event_types.html",
        found=found,
        number=number,
        first=(number - 1) * TYPES_PER_PAGE + 1,
        previous_url=None if number == 1 else f"{HOME}/event-types?page={number - 1}",
        next_url=None if number >= last else f"{HOME}/event-types?page={number + 1}",
        recent_hours=int(RECENT.total_seconds() // 3600),
    )


Read = Callable[[asyncpg.Connection, EndpointHealth], Awaitable[dict[str, Any] | None]]


async def _filtered(request: web.Request, template: str, read: Read) -> web.Response:
    """An endpoint's page of what its filter chose: ``read`` checks the
    filter and reads the list, giving the page's values (None: the
    endpoint went meanwhile). A filter refused is said on the page."""
    namespace, name = inputs.endpoint_key(request)
    async with connection(request) as conn:
        health = await actions.endpoint(conn, scope(request), namespace, name)
        if health is None:
            return FACE.no_endpoint(request, namespace, name)
        try:
            values = await read(conn, health)
        except InvalidInput as refused:
            return _refused(request, template, refused, health)
    if values is None:
        return FACE.no_endpoint(request, namespace, name)
    return FACE.shown_once(request, template, health=health, query=request.query, **values)


def _refused(
    request: web.Request, template: str, refused: InvalidInput, health: EndpointHealth
) -> web.Response:
    """The page with the filter's form as it was sent and what is wrong
    with it, in place of the list; it does not refresh itself (there is
    nothing to refresh until the filter is put right)."""
    return render(
        template,
        422,
        refused=pages.refusal_text(refused.field, refused.message),
        query=request.query,
        flash=None,
        chosen=None,
        health=health,
        page=None,
        charts=None,
        ordering=None,
        held=None,
        **_endpoint_links(health.namespace, health.name, []),
    )


def _endpoint_links(namespace: str, name: str, back: list[tuple[str, str]]) -> dict[str, Any]:
    """Where a page's links and forms go: the endpoint's page (``path``),
    and ``back``, the query string its buttons post with so that the
    redirect comes back to the page they were on."""
    return {"path": FACE.endpoint_path(namespace, name), "back": f"?{urlencode(back)}" if back else ""}


@audience(Audience.DASHBOARD)
@browser_page
async def reactivate(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    async with connection(request) as conn:
        done = await actions.reactivate(conn, scope(request), namespace, name)
    if done is store.Reactivation.NO_ENDPOINT:
        return FACE.no_endpoint(request, namespace, name)
    if done is store.Reactivation.NOT_DEACTIVATED:
        return FACE.redirect(request, _back(request, namespace, name), pages.flash_value("not-deactivated"))
    return FACE.redirect(request, _back(request, namespace, name), pages.flash_value("reactivated"))


def _back(request: web.Request, namespace: str, name: str) -> str:
    """The page the form was posted from: a delivery's, or the endpoint's
    with its filter; the endpoint's whole list if that is not understood."""
    path = FACE.endpoint_path(namespace, name)
    try:
        if "delivery" in request.query:
            return f"{path}/deliveries/{inputs.delivery_id(request.query['delivery'], 'delivery')}"
        query = delivery_filter(request.query).query()
    except InvalidInput:
        return path
    return f"{path}?{urlencode(query)}" if query else path


def _set_flash(_request: web.Request, response: web.Response, flash: str | None) -> None:
    if flash is None:
        response.del_cookie(FLASH_COOKIE, path=HOME)
    else:
        response.set_cookie(FLASH_COOKIE, flash, path=HOME, httponly=True, samesite="Strict")


FACE = browser.Face(
    HOME,
    FLASH_COOKIE,
    render=lambda _request, template, status=200, **values: render(template, status, **values),
    problem_page=problem_page,
    problem=lambda _request, status, title, detail: render(
        "problem.html", status, title=title, detail=detail
    ),
    headers=lambda _request: _SECURITY_HEADERS,
    set_flash=_set_flash,
    flash_message=flash_message,
    back=_back,
)
