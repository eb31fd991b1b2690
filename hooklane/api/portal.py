"""The tenant portal (``/portal``): where one tenant's people see their own
endpoints, deliveries and attempts in a browser, and make the repairs and
changes their grant allows (docs/portal.md).

A person comes in by a single-use link that the platform's backend got
from the admin API (``/portal/enter/<token>``). The link's page holds only
a form that posts the token back: a link prefetcher or a mail scanner that
fetches the page leaves the link unused, a browser (portal.js, or a click)
redeems it for a session cookie of the tenant and its rights.

The pages it shares with the dashboard are one handler each
(:mod:`.browser`), the rest built of the same pieces (:mod:`.pages`,
templates/macros.html): rendered on the server with every value escaped,
its strict CSP, each change a form POST answered by a redirect (303) and a
one-shot message. What is the portal's own: entry by link, its cookies,
the platform's frame and brand (``portal_frame_ancestors``,
``portal_name``, ``portal_colour``), the replay and test event, and the
self-service form. Every read and change is in the session's tenant's
scope (:mod:`.actions`), so that another tenant's endpoint or delivery
renders exactly as one that does not exist.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, NamedTuple
from urllib.parse import urlencode

import asyncpg
from aiohttp import web

from hooklane import charts, store
from hooklane.api import actions, browser, inputs, pages, tenant
from hooklane.api.admin import PORTAL_ENTRY
from hooklane.api.auth import (
    PORTAL_COOKIE,
    Audience,
    audience,
    connection,
    expect_continue,
    same_origin,
    tenant_token,
)
from hooklane.api.catalogue import openapi_response
from hooklane.api.context import SETTINGS, WRITER, scope, tenant_grant
from hooklane.api.endpoints import replay_fields, replay_of, replayed
from hooklane.api.errors import Problem, Refused, answers_in
from hooklane.catalogue_view import (
    CatalogueEntry,
    SchemaRow,
    grouped,
    pickable,
    picked_types,
    picker_split,
    schema_rows,
)
from hooklane.errors import InvalidInput
from hooklane.selfservice import (
    EndpointForm,
    Limits,
    OverBound,
    chosen_name,
    over_bounds,
    self_service_name,
)
from hooklane.settings import Settings
from hooklane.spec import ON_DEAD_DELIVERY, ON_DEAD_DELIVERY_NAMES
from hooklane.store import grants
from hooklane.store.grants import Access, TenantGrant
from hooklane.times import rfc3339, rfc3339_seconds

logger = logging.getLogger(__name__)

HOME = "/portal"
ENTER = HOME + "/enter"
ENDPOINT = HOME + "/endpoints/{namespace}/{name}"
# What happened, for the page the POST redirects to; read once, then dropped.
FLASH_COOKIE = "hooklane_portal_flash"
DELIVERIES_PER_PAGE = 50
# Where the replay form starts: a receiver that was down for about an hour.
REPLAY_BACK = timedelta(hours=1)
# A link as the admin API makes them (a prefix and 32 random bytes in
# base64url): anything else is refused on sight, without a database call.
_LINK = re.compile(re.escape(grants.LINK_PREFIX) + r"[A-Za-z0-9_-]{16,64}")
_NO_REFERRER = {"Referrer-Policy": "no-referrer"}


def add_routes(app: web.Application) -> None:
    """Add the portal's pages to ``app``."""
    browser.add_routes(app, FACE, Audience.PORTAL)
    router = app.router
    router.add_get(PORTAL_ENTRY + "{token}", entry_page)
    router.add_get(HOME + "/new", new_endpoint_page)
    router.add_get(HOME + "/catalogue", catalogue_page)
    router.add_get(HOME + "/catalogue/openapi.json", catalogue_openapi)
    router.add_get(ENDPOINT, endpoint_page)
    router.add_get(ENDPOINT + "/edit", edit_page)
    router.add_get(HOME + "/brand.css", brand_stylesheet)
    router.add_get(HOME + "/static/{file}", pages.static)
    for path, handler in (
        (ENTER, enter),
        (HOME + "/logout", log_out),
        (ENDPOINT + "/replay", replay),
        (ENDPOINT + "/test-event", test_event),
        (HOME + "/endpoints", create),
        (ENDPOINT + "/edit", edit),
        (ENDPOINT + "/delete", delete),
        (ENDPOINT + "/pause", pause),
        (ENDPOINT + "/resume", resume),
        (ENDPOINT + "/rotate-secret", rotate_secret),
    ):
        router.add_post(path, handler, expect_handler=expect_continue)


# Pure rules: the cookies, the colours.


@dataclass(frozen=True)
class CookieTerms:
    secure: bool
    same_site: str
    partitioned: bool


def cookie_terms(https: bool, framed: bool) -> CookieTerms:
    """How the portal's cookies are set: SameSite=Strict, unless the
    platform frames the portal and the browser came over https. A frame in
    the platform's pages is on another site, where a browser sends only
    SameSite=None cookies, and those only with Secure; Partitioned (CHIPS)
    keeps them to the one site that framed the portal when the session
    began, so that no other site's frame or page carries them."""
    if https and framed:
        return CookieTerms(secure=True, same_site="None", partitioned=True)
    return CookieTerms(secure=https, same_site="Strict", partitioned=False)


def cookie_header(name: str, value: str, terms: CookieTerms, max_age: int | None = None) -> str:
    """A ``Set-Cookie`` value for the portal's path, HttpOnly. Written out
    here because Python's cookies learnt ``Partitioned`` only in 3.14. The
    values are the portal's own tokens and flash words: nothing to quote."""
    parts = [f"{name}={value}", f"Path={HOME}", "HttpOnly", f"SameSite={terms.same_site}"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if terms.secure:
        parts.append("Secure")
    if terms.partitioned:
        parts.append("Partitioned")
    return "; ".join(parts)


def ink(colour: str) -> str:
    """Black or white, whichever reads better on ``colour`` (``#rrggbb``):
    the higher contrast by WCAG 2's relative luminance."""
    channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "#ffffff" if 1.05 / (luminance + 0.05) >= (luminance + 0.05) / 0.05 else "#000000"


def brand_style(colour: str) -> str:
    """The stylesheet of the platform's colour (served, since the CSP
    forbids inline style): the header and the main buttons, their text in
    black or white, whichever reads better on it."""
    return f":root {{ --brand: {colour}; --brand-ink: {ink(colour)}; }}\n"


def _replayed(number: int) -> str:
    if number == 0:
        return "No events to send again since then (or they are pending already)."
    return f"{number} {'event' if number == 1 else 'events'} queued to be sent again."


def _replayed_partly(number: int) -> str:
    return (
        f"{number} {'event' if number == 1 else 'events'} queued to be sent again; time ran out before"
        " the others. Continue the replay below to queue the rest: none is queued twice."
    )


# The sentence for what the portal's buttons did (:func:`.pages.flash_value`);
# None for any other cookie value, so that one set elsewhere shows nothing.
flash_message = pages.Flashes(
    {
        "replayed": _replayed,
        "replayed-partly": _replayed_partly,
        "test-event": "Test event queued: it goes out like any other delivery.",
        "paused": "Paused: nothing is sent to this endpoint until you resume it.",
        "resumed": "Resumed: its waiting deliveries go out again.",
        "saved": "Endpoint saved.",
        "deleted": "Endpoint deleted.",
    }
).message


def endpoint_label(tenant: str, name: str) -> str:
    """An endpoint's name as the tenant knows it: the one it chose for an
    endpoint made here (its resource adds a key of the tenant), else the
    resource's."""
    return chosen_name(tenant, name) or name


_TYPES_SEPARATOR = re.compile(r"[\s,]+")


def endpoint_form(
    posted: Mapping[str, str], name: str | None = None, picked: Sequence[str] = ()
) -> EndpointForm:
    """The endpoint form as the page posts it (``name``: the one it has
    already, when editing): the types ticked in the picker (``picked``)
    and the ones typed, comma-separated; a number left empty taking the
    spec's default. What is not understood is passed on as it came, for
    the spec's parser to refuse in its own words."""
    typed = [t for t in _TYPES_SEPARATOR.split(posted.get("event_types", "")) if t]
    return EndpointForm.from_json(
        {
            "name": name if name is not None else posted.get("name", "").strip(),
            "url": posted.get("url", "").strip(),
            "event_types": picked_types(picked, typed),
            "max_concurrency": _number(posted.get("max_concurrency", "")),
            "timeout_seconds": _number(posted.get("timeout_seconds", "")),
            "ordering_on_dead": posted.get("ordering_on_dead", "").strip() or None,
        }
    )


def _number(text: str) -> int | str | None:
    text = text.strip()
    if not text:
        return None
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else text


def form_values(form: Mapping[str, str] | EndpointForm) -> dict[str, str]:
    """What the form's inputs show: as posted (to be put right), or an
    endpoint's."""
    if isinstance(form, EndpointForm):
        return {
            "name": form.name,
            "url": form.url,
            "event_types": ", ".join(form.event_types),
            "max_concurrency": "" if form.max_concurrency is None else str(form.max_concurrency),
            "timeout_seconds": "" if form.timeout_seconds is None else str(form.timeout_seconds),
            "ordering_on_dead": form.ordering_on_dead or "",
        }
    return {key: form.get(key, "") for key in _FORM_INPUTS}


_FORM_INPUTS = ("name", "url", "event_types", "max_concurrency", "timeout_seconds", "ordering_on_dead")


# Rendering.

_TEMPLATES = pages.environment(HOME, Access=Access, label=endpoint_label)


def _cookie_terms(request: web.Request) -> CookieTerms:
    https = pages.is_https(request.scheme, request.headers.get("X-Forwarded-Proto"))
    return cookie_terms(https, bool(request.app[SETTINGS].portal_frame_ancestors))


def _headers(settings: Settings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    # The dashboard's strict headers but for who may frame the pages: no
    # one unless the platform lists the origins of its own pages.
    return {**pages.security_headers(settings.portal_frame_ancestors), **(extra or {})}


def render(
    request: web.Request,
    template: str,
    *,
    status: int = 200,
    grant: TenantGrant | None = None,
    headers: Mapping[str, str] | None = None,
    **values: Any,
) -> web.Response:
    """A portal page, with the platform's name and, for a session, the
    tenant and the buttons of its rights."""
    settings = request.app[SETTINGS]
    manage = grant is not None and grant.allows(Access.MANAGE) and request.app[WRITER] is not None
    return pages.render(
        _TEMPLATES,
        f"portal/{template}",
        status,
        _headers(settings, headers),
        portal_name=settings.portal_name,
        grant=grant,
        manage=manage,
        **values,
    )


def _set_cookie(request: web.Request, response: web.Response, name: str, value: str, max_age: int) -> None:
    response.headers.add("Set-Cookie", cookie_header(name, value, _cookie_terms(request), max_age))


def _drop_cookie(request: web.Request, response: web.Response, name: str) -> None:
    # A partitioned cookie is only dropped by a Set-Cookie that says so too.
    _set_cookie(request, response, name, "", 0)


_TITLES = {
    401: "Session ended",
    403: "Not allowed",
    404: "Not found",
    408: "Too slow",
    422: "Not understood",
    503: "Unavailable",
}


def problem_page(request: web.Request, found: Problem) -> web.Response:
    """A problem (:mod:`.errors`) as a portal page. No session (401) drops
    the cookie of the one that ended; the database away is a page that
    retries by itself (a page that was read: a form post is not repeated
    behind the person's back)."""
    detail = pages.refusal_text(found.field, found.detail)
    retry = found.retry_after is not None and request.method in ("GET", "HEAD")
    response = _problem(
        request,
        found.status,
        _TITLES.get(found.status, "Refused"),
        detail + (". Retrying by itself." if retry else ""),
        back=found.status != 401,
        retry_seconds=pages.REFRESH_SECONDS if retry else None,
        headers=None if found.retry_after is None else {"Retry-After": str(pages.REFRESH_SECONDS)},
    )
    if found.status == 401 and PORTAL_COOKIE in request.cookies:
        _drop_cookie(request, response, PORTAL_COOKIE)
    return response


# A page answers its problems in HTML, the middleware's refusals too
# (:mod:`.auth`), through the API's one mapping of errors.
portal_page = answers_in(problem_page)


def _problem(
    request: web.Request,
    status: int,
    title: str,
    detail: str,
    *,
    back: bool = True,
    retry_seconds: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """A page saying what went wrong; ``back``: with a link to the
    tenant's endpoints (pointless without a session)."""
    return render(
        request,
        "problem.html",
        status=status,
        headers=headers,
        title=title,
        detail=detail,
        back=back,
        retry_seconds=retry_seconds,
    )


def _link_refused(request: web.Request) -> web.Response:
    # Unknown, used and expired read the same: nothing tells a guesser
    # which links exist.
    return _problem(
        request,
        404,
        "This link cannot be used",
        "It is unknown, used already or expired: a link opens the portal once, within minutes. "
        "Open the portal from your platform again.",
        back=False,
        headers=_NO_REFERRER,
    )


# Entering and leaving.


@audience(Audience.OPEN)
@portal_page
async def entry_page(request: web.Request) -> web.Response:
    """The link's page: a form that redeems it. A GET changes nothing, so
    that whatever fetches the link before the person does (a prefetcher, a
    mail scanner, a chat preview) leaves it unused."""
    token = request.match_info["token"]
    if _LINK.fullmatch(token) is None:
        return _link_refused(request)
    # No referrer: the next requests would carry the link in their Referer.
    return render(request, "enter.html", headers=_NO_REFERRER, token=token)


@audience(Audience.OPEN)
@portal_page
async def enter(request: web.Request) -> web.Response:
    if not same_origin(request):
        # Another site's form could otherwise sign a browser into a
        # session of the attacker's choosing.
        return _problem(
            request,
            403,
            "Refused",
            "Open the portal through the link your platform gives you.",
            back=False,
            headers=_NO_REFERRER,
        )
    token = (await request.post()).get("token")
    if not isinstance(token, str) or _LINK.fullmatch(token) is None:
        return _link_refused(request)
    settings = request.app[SETTINGS]
    async with connection(request) as conn:
        found = await grants.redeem(conn, token, settings.portal_session_seconds)
        previous = request.cookies.get(PORTAL_COOKIE)
        if found is not None and previous:
            # One session a browser: the one this cookie replaces ends.
            await grants.end_session(conn, previous)
    if found is None:
        return _link_refused(request)
    session, grant = found
    response = FACE.redirect(request, HOME)
    response.headers.update(_NO_REFERRER)
    _set_cookie(request, response, PORTAL_COOKIE, session.token, math.ceil(settings.portal_session_seconds))
    logger.info(
        "portal: session opened for tenant %s (%s)",
        grant.tenant,
        grant.access,
        extra={"action": "portal_enter", "tenant": grant.tenant, "access": str(grant.access)},
    )
    return response


@audience(Audience.PORTAL)
@portal_page
async def log_out(request: web.Request) -> web.Response:
    token = tenant_token(request)
    assert token is not None, "the middleware checked it"
    async with connection(request) as conn:
        await grants.end_session(conn, token)
    response = render(request, "left.html")
    _drop_cookie(request, response, PORTAL_COOKIE)
    return response


# Pages.


class _EndpointRead(NamedTuple):
    """What an endpoint's page reads in the snapshot that found it: None
    for each read that found it gone."""

    page: store.DeliveryPage | None
    buckets: list[charts.Bucket] | None
    ordering: store.OrderingSummary | None
    held: store.HeldKeyPage | None


@audience(Audience.PORTAL)
@portal_page
async def endpoint_page(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    state = pages.state_filter(request.query.get("state"))
    before = inputs.delivery_cursor(request.query, "before")
    span = charts.check_span(request.query.get("span"))
    grant = tenant_grant(request)

    async def read(conn: asyncpg.Connection) -> _EndpointRead:
        page = await store.endpoint_deliveries(
            conn,
            namespace,
            name,
            states=None if state is None else [state],
            cursor=before,
            limit=DELIVERIES_PER_PAGE,
        )
        return _EndpointRead(
            page,
            await store.endpoint_chart(conn, namespace, name, span),
            await store.endpoint_ordering(conn, namespace, name),
            await store.held_keys(conn, namespace, name, limit=store.HELD_KEYS_SHOWN),
        )

    async with connection(request) as conn:
        found = await actions.with_health(conn, scope(request), namespace, name, read)
    if found is None:
        return FACE.no_endpoint(request, namespace, name)
    health, (page, buckets, ordering, held) = found
    if buckets is None or ordering is None or held is None:
        # Deleted between the reads.
        return FACE.no_endpoint(request, namespace, name)
    path = FACE.endpoint_path(namespace, name)
    kept = [("state", state)] if state else []
    return FACE.shown_once(
        request,
        "endpoint.html",
        grant=grant,
        changeable=self_service_name(request.app[SETTINGS], grant.tenant, namespace, name) is not None,
        health=health,
        page=page,
        ordering=ordering,
        held=held,
        charts=charts.endpoint_charts(span, health.observed_at, buckets),
        span_links=pages.span_links(path, kept, span),
        state=state,
        path=path,
        older_url=None
        if page is None or page.cursor is None
        else f"{path}?{urlencode([*kept, ('before', page.cursor)])}",
        replay_from=rfc3339_seconds(health.observed_at - REPLAY_BACK),
        **_replay_continued(request.query),
    )


def _replay_continued(query: Mapping[str, str]) -> dict[str, str | None]:
    """The form's ``replay_since`` and ``replay_cursor`` to continue a
    replay that stopped (its redirect set them in the address); None when
    there is none, or what the address says is not one."""
    since, cursor = query.get("replay_since"), query.get("replay_cursor")
    try:
        replay_fields(since, cursor)
    except InvalidInput:
        since = None
    if since is None or cursor is None:
        return {"replay_since": None, "replay_cursor": None}
    return {"replay_since": since, "replay_cursor": cursor}


# Repairs (replay, test event).


@audience(Audience.PORTAL, access=Access.RESEND)
@portal_page
async def replay(request: web.Request) -> web.Response:
    """Send the tenant's events since a time to the endpoint again. One
    that runs out of time comes back to the endpoint's page with its form
    set to continue where it stopped."""
    namespace, name = inputs.endpoint_key(request)
    form = await request.post()
    asked = replay_fields(form.get("since"), form.get("cursor"))
    done = await replay_of(request, namespace, name, asked)
    if done is None:
        return FACE.no_endpoint(request, namespace, name)
    path = FACE.endpoint_path(namespace, name)
    cursor = replayed(done)["next_cursor"]
    if cursor is None:
        return FACE.redirect(request, path, pages.flash_value("replayed", done.count))
    # The replay's own words for its time, not the form's: what the
    # continuation sends is what this one read.
    query = urlencode([("replay_since", rfc3339(asked.since)), ("replay_cursor", cursor)])
    return FACE.redirect(request, f"{path}?{query}", pages.flash_value("replayed-partly", done.count))


@audience(Audience.PORTAL, access=Access.RESEND)
@portal_page
async def test_event(request: web.Request) -> web.Response:
    """Queue a test event to the endpoint alone, and show its delivery."""
    namespace, name = inputs.endpoint_key(request)
    async with connection(request) as conn:
        delivery = await actions.test_event(conn, scope(request), namespace, name)
    if delivery is None:
        return FACE.no_endpoint(request, namespace, name)
    return FACE.redirect(
        request,
        f"{FACE.endpoint_path(namespace, name)}/deliveries/{delivery}",
        pages.flash_value("test-event"),
    )


def _back(query: Mapping[str, str], namespace: str, name: str) -> str:
    """The page a button was on: a delivery's (``?delivery=``), else the
    endpoint's."""
    path = FACE.endpoint_path(namespace, name)
    try:
        delivery = inputs.delivery_id(query.get("delivery", ""), "delivery")
    except InvalidInput:
        return path
    return f"{path}/deliveries/{delivery}"


# Self-service (docs/self-service.md): the mode's one writer, the same spec
# rules and bounds as the tenant API. Only the endpoints the portal made
# are changed here; the writer answers any other as none at all.


@audience(Audience.PORTAL, access=Access.MANAGE)
@portal_page
async def new_endpoint_page(request: web.Request) -> web.Response:
    # Self-service off: refused (409) here already, as the form's POST would be.
    tenant.writer(request)
    return _form_page(request, form_values({}), (), await _catalogue(request), action=HOME + "/endpoints")


@audience(Audience.PORTAL, access=Access.MANAGE)
@portal_page
async def create(request: web.Request) -> web.Response:
    posted, picked = await _posted(request), await _picked(request)
    grant = tenant_grant(request)
    try:
        created = await tenant.writer(request).create(grant.tenant, endpoint_form(posted, picked=picked))
    except (InvalidInput, Refused) as refused:
        return await _form_refused(request, refused, posted, picked, action=HOME + "/endpoints")
    logger.info(
        "portal: tenant %s created endpoint %s/%s",
        grant.tenant,
        created.namespace,
        created.name,
        extra={
            "action": "portal_create",
            "tenant": grant.tenant,
            "endpoint": f"{created.namespace}/{created.name}",
        },
    )
    return _secret_page(request, created.namespace, created.name, created.secret, created=True)


@audience(Audience.PORTAL, access=Access.MANAGE)
@portal_page
async def edit_page(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    grant = tenant_grant(request)
    chosen = self_service_name(request.app[SETTINGS], grant.tenant, namespace, name)
    # Self-service off: refused (409) here already, as the form's POST would be.
    tenant.writer(request)
    # The stored spec (the health leaves out the event types and timeout),
    # in the snapshot that found the endpoint the tenant's.
    async with connection(request) as conn:
        stored = await actions.scoped(
            conn, scope(request), namespace, name, lambda c: _stored(request, c, namespace, name)
        )
    if stored is None:
        return FACE.no_endpoint(request, namespace, name)
    if chosen is None:
        return _platforms(request, namespace, name)
    form = EndpointForm(
        chosen,
        stored.url,
        stored.event_types,
        stored.max_concurrency,
        stored.timeout_seconds,
        ON_DEAD_DELIVERY_NAMES[stored.ordering_on_dead],
    )
    entries = await _catalogue(request)
    # The catalogue's types tick their boxes; patterns, and names the
    # picker does not offer, stay typed, so that a save keeps them.
    offered = pickable(entries, request.app[SETTINGS].portal_event_types)
    picked, typed = picker_split(form.event_types, [e.name for e in offered])
    return _form_page(
        request,
        form_values(replace(form, event_types=tuple(typed))),
        picked,
        entries,
        action=f"{FACE.endpoint_path(namespace, name)}/edit",
        path=FACE.endpoint_path(namespace, name),
        over=over_bounds(Limits(stored.max_concurrency, stored.timeout_seconds), request.app[SETTINGS]),
    )


@audience(Audience.PORTAL, access=Access.MANAGE)
@portal_page
async def edit(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    posted, picked = await _posted(request), await _picked(request)
    grant = tenant_grant(request)
    path = FACE.endpoint_path(namespace, name)
    chosen = self_service_name(request.app[SETTINGS], grant.tenant, namespace, name)
    if chosen is None:
        return await _unchanged(request, namespace, name)
    try:
        # The name is the endpoint's own: whatever the form says, it stays.
        form = endpoint_form(posted, chosen, picked)
        saved = await tenant.writer(request).update(grant.tenant, namespace, name, form)
    except (InvalidInput, Refused) as refused:
        return await _form_refused(
            request, refused, {**posted, "name": chosen}, picked, action=f"{path}/edit", path=path
        )
    if not saved:
        return await _unchanged(request, namespace, name)
    return FACE.redirect(request, path, pages.flash_value("saved"))


@audience(Audience.PORTAL, access=Access.MANAGE)
@portal_page
async def delete(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    if (await _posted(request)).get("confirm") != "yes":
        raise InvalidInput("confirm", "must be ticked: a deleted endpoint cannot be brought back")
    if not await tenant.writer(request).delete(tenant_grant(request).tenant, namespace, name):
        return await _unchanged(request, namespace, name)
    return FACE.redirect(request, HOME, pages.flash_value("deleted"))


@audience(Audience.PORTAL, access=Access.MANAGE)
@portal_page
async def pause(request: web.Request) -> web.Response:
    return await _set_paused(request, True)


@audience(Audience.PORTAL, access=Access.MANAGE)
@portal_page
async def resume(request: web.Request) -> web.Response:
    return await _set_paused(request, False)


async def _set_paused(request: web.Request, paused: bool) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    if not await tenant.writer(request).set_paused(tenant_grant(request).tenant, namespace, name, paused):
        return await _unchanged(request, namespace, name)
    return FACE.redirect(
        request, FACE.endpoint_path(namespace, name), pages.flash_value("paused" if paused else "resumed")
    )


@audience(Audience.PORTAL, access=Access.MANAGE)
@portal_page
async def rotate_secret(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    secret = await tenant.writer(request).rotate_secret(tenant_grant(request).tenant, namespace, name)
    if secret is None:
        return await _unchanged(request, namespace, name)
    return _secret_page(request, namespace, name, secret, created=False)


async def _posted(request: web.Request) -> dict[str, str]:
    # A form posts text fields only; anything else is left out.
    return {key: value for key, value in (await request.post()).items() if isinstance(value, str)}


async def _picked(request: web.Request) -> list[str]:
    """The types ticked in the form's picker (one ``event_type`` each)."""
    return [value for value in (await request.post()).getall("event_type", []) if isinstance(value, str)]


async def _stored(
    request: web.Request, conn: asyncpg.Connection, namespace: str, name: str
) -> store.Stored | None:
    """The endpoint's spec as stored, to fill the edit form."""
    try:
        return await store.stored_endpoint(conn, namespace, name, request.app[SETTINGS].encryption_key)
    except InvalidInput:
        # The platform's keys lack the one its secret was sealed with: the
        # writer could not save it either.
        raise Refused(503, "unavailable", "this endpoint cannot be changed right now") from None


async def _unchanged(request: web.Request, namespace: str, name: str) -> web.Response:
    """The answer when the writer changed nothing: one of the tenant's own
    endpoints that the platform set up is the platform's to change; any
    other (another tenant's too) is none at all."""
    async with connection(request) as conn:
        found = await actions.endpoint(conn, scope(request), namespace, name)
    if found is None:
        return FACE.no_endpoint(request, namespace, name)
    return _platforms(request, namespace, name)


def _platforms(request: web.Request, namespace: str, name: str) -> web.Response:
    return _problem(
        request,
        409,
        "Set up by the platform",
        f"{namespace}/{name} was set up by {request.app[SETTINGS].portal_name}, not here: ask them to change it.",
    )


def _form_page(
    request: web.Request,
    values: dict[str, str],
    picked: Sequence[str],
    entries: Sequence[CatalogueEntry],
    *,
    action: str,
    status: int = 200,
    refused: str | None = None,
    path: str | None = None,
    over: Sequence[OverBound] = (),
) -> web.Response:
    settings = request.app[SETTINGS]
    return render(
        request,
        "form.html",
        status=status,
        grant=tenant_grant(request),
        form=values,
        picked=set(picked),
        picker=grouped(pickable(entries, settings.portal_event_types)),
        action=action,
        path=path,
        refused=refused,
        allowed_types=settings.portal_event_types,
        https_only=settings.portal_https_only,
        bounds=Limits(settings.portal_max_concurrency, settings.portal_max_timeout_seconds),
        over={o.field: o for o in over},
        on_dead_choices=tuple(ON_DEAD_DELIVERY),
    )


async def _form_refused(
    request: web.Request,
    refused: InvalidInput | Refused,
    posted: Mapping[str, str],
    picked: Sequence[str],
    *,
    action: str,
    path: str | None = None,
) -> web.Response:
    """The form again as it was posted, with what is wrong with it: a
    field the spec or the platform's bounds refuse (422), a name taken or
    the bound reached (409). The writer's store away is a page of its own."""
    if isinstance(refused, Refused):
        if refused.status >= 500:
            raise refused
        # A name taken or the bound reached: a sentence of its own.
        status, text = refused.status, pages.refusal_text(None, refused.detail)
    else:
        status, text = 422, pages.refusal_text(refused.field, refused.message)
    return _form_page(
        request,
        form_values(posted),
        picked,
        await _catalogue(request),
        action=action,
        status=status,
        refused=text,
        path=path,
    )


def _secret_page(
    request: web.Request, namespace: str, name: str, secret: str, *, created: bool
) -> web.Response:
    """The signing secret, shown this once: no page or route reads it back."""
    settings = request.app[SETTINGS]
    return render(
        request,
        "secret.html",
        grant=tenant_grant(request),
        namespace=namespace,
        name=name,
        path=FACE.endpoint_path(namespace, name),
        secret=secret,
        created=created,
        grace=pages.age_text(settings.secret_grace_seconds),
        # The operator makes the row from the resource: the endpoint's page
        # is there once it has.
        applied_later=settings.portal_endpoints == "kubernetes",
    )


# The event catalogue (docs/catalogue.md): the platform's, the same for
# every tenant.


@dataclass(frozen=True)
class ShownVersion:
    """One version of a type as the catalogue page shows it."""

    version: int
    latest: bool
    rows: list[SchemaRow]
    # Rows were left out of the table (the raw JSON has them all).
    cut: bool
    schema_json: str
    example_json: str


def shown_versions(entry: CatalogueEntry) -> list[ShownVersion]:
    """The versions of ``entry``, latest first, ready to render."""
    shown = []
    for v in reversed(entry.versions):
        rows, cut = schema_rows(v.schema)
        shown.append(
            ShownVersion(
                v.version,
                v is entry.latest,
                rows,
                cut,
                json.dumps(v.schema, indent=2, ensure_ascii=False),
                json.dumps(v.example, indent=2, ensure_ascii=False),
            )
        )
    return shown


async def _catalogue(request: web.Request) -> list[CatalogueEntry]:
    async with connection(request) as conn:
        return await store.catalogue_entries(conn)


@audience(Audience.PORTAL)
@portal_page
async def catalogue_page(request: web.Request) -> web.Response:
    entries = await _catalogue(request)
    return render(
        request,
        "catalogue.html",
        grant=tenant_grant(request),
        groups=grouped(entries),
        versions={e.name: shown_versions(e) for e in entries},
    )


@audience(Audience.PORTAL)
@portal_page
async def catalogue_openapi(request: web.Request) -> web.Response:
    """The export (:mod:`hooklane.catalogue_openapi`), to download."""
    response = openapi_response(request.app[SETTINGS], await _catalogue(request))
    response.headers["Content-Disposition"] = 'attachment; filename="events.openapi.json"'
    response.headers.update(_headers(request.app[SETTINGS]))
    return response


@audience(Audience.OPEN)
async def brand_stylesheet(request: web.Request) -> web.Response:
    return web.Response(
        text=brand_style(request.app[SETTINGS].portal_colour),
        content_type="text/css",
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
    )


def _set_flash(request: web.Request, response: web.Response, flash: str | None) -> None:
    if flash is None:
        _drop_cookie(request, response, FLASH_COOKIE)
    else:
        # Long enough to reach the next page, however slowly it loads.
        _set_cookie(request, response, FLASH_COOKIE, flash, 60)


FACE = browser.Face(
    HOME,
    FLASH_COOKIE,
    render=render,
    problem_page=problem_page,
    problem=_problem,
    headers=lambda request: _headers(request.app[SETTINGS]),
    set_flash=_set_flash,
    flash_message=flash_message,
    back=lambda request, namespace, name: _back(request.query, namespace, name),
)
