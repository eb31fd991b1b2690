"""The admin API's routes (``/v1/admin``), for the platform's operators
and their programs, with an admin token (:mod:`.auth`).

Endpoints with their health (the records ``hooklane status``, the
operator and the gauges show: :mod:`hooklane.health`), an endpoint's
deliveries and attempts, a delivery with its attempts (the JSON of
:mod:`hooklane.views`, which ``hooklane delivery show --json`` prints too),
the repairs (resend, discard, replay, reactivate), receivers'
reconciliation (a tenant's events by time, with a stable cursor) and the
unrouted events. Each handler parses its input, calls one store function
and shapes the answer; every refusal is the JSON of :mod:`.errors`, a bad
parameter a 422 that names it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
from aiohttp import web

from hooklane import store
from hooklane.api import inputs
from hooklane.api.auth import Audience, audience, connection, expect_continue
from hooklane.api.context import SETTINGS, repair_stop
from hooklane.api.errors import problem
from hooklane.errors import InvalidInput, shown
from hooklane.health import as_json
from hooklane.spec import check_tenant
from hooklane.store import portal
from hooklane.store.cursor import event_cursor, event_position
from hooklane.store.portal import Access, check_access
from hooklane.times import parse_time, rfc3339
from hooklane.views import delivery_json, detail_json, listed_attempt_json

logger = logging.getLogger(__name__)

PREFIX = "/v1/admin"
_ENDPOINT = PREFIX + "/endpoints/{namespace}/{name}"
# Who discarded, as a discarded delivery's last_error records it.
_ACTOR = "the admin API"
_DEFAULT_DELIVERIES = 100
DEFAULT_ENDPOINTS = 100
_DEFAULT_ATTEMPTS = 100

# A listing's read, its query checked: it answers on the connection given.
Read = Callable[[asyncpg.Connection], Awaitable[web.Response]]
# A listing of one endpoint's records by the request's query.
Listing = Callable[[web.Request, str, str], Read]


def add_routes(app: web.Application) -> None:
    """Add the admin routes to ``app``."""
    router = app.router
    router.add_get(PREFIX + "/endpoints", list_endpoints)
    router.add_get(_ENDPOINT, get_endpoint)
    router.add_get(_ENDPOINT + "/deliveries", list_deliveries)
    router.add_get(_ENDPOINT + "/deliveries/{id}", get_delivery)
    router.add_get(_ENDPOINT + "/attempts", list_attempts)
    for path, handler in (
        ("/deliveries/{id}/resend", resend_delivery),
        ("/resend-dead", resend_dead),
        ("/discard-dead", discard_dead),
        ("/replay", replay),
        ("/reactivate", reactivate),
    ):
        router.add_post(_ENDPOINT + path, handler, expect_handler=expect_continue)
    router.add_get(PREFIX + "/events", list_events)
    router.add_get(PREFIX + "/unrouted", unrouted)
    router.add_post(PREFIX + "/portal-sessions", portal_session, expect_handler=expect_continue)


@audience(Audience.ADMIN)
async def list_endpoints(request: web.Request) -> web.Response:
    query = request.query
    chosen = inputs.endpoint_filter(query)
    limit = inputs.limit(query, DEFAULT_ENDPOINTS)
    cursor = inputs.endpoint_cursor(query)
    async with connection(request) as conn:
        page = await store.endpoint_page(conn, chosen, cursor=cursor, limit=limit)
    return web.json_response({"endpoints": [as_json(h) for h in page.endpoints], "next_cursor": page.cursor})


@audience(Audience.ADMIN)
async def get_endpoint(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    async with connection(request) as conn:
        found = await store.endpoint_health(conn, endpoint=(namespace, name))
    if not found:
        return no_endpoint(namespace, name)
    return web.json_response(as_json(found[0]))


@audience(Audience.ADMIN)
async def list_deliveries(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    read = deliveries_of(request, namespace, name)
    async with connection(request) as conn:
        return await read(conn)


def deliveries_of(request: web.Request, namespace: str, name: str) -> Read:
    """The answer of a listing of the endpoint's deliveries, by the
    request's query (checked before any database is reached): the admin
    API's and a tenant's."""
    query = request.query
    states = store.check_states(inputs.values(query, "state"))
    since, until = inputs.time(query, "since"), inputs.time(query, "until")
    status, failure = inputs.answer_filter(query)
    limit = inputs.limit(query, _DEFAULT_DELIVERIES)
    cursor = inputs.delivery_cursor(query)

    async def read(conn: asyncpg.Connection) -> web.Response:
        page = await store.endpoint_deliveries(
            conn,
            namespace,
            name,
            states=states,
            since=since,
            until=until,
            status=status,
            failure=failure,
            cursor=cursor,
            limit=limit,
        )
        if page is None:
            return no_endpoint(namespace, name)
        return web.json_response(
            {"deliveries": [delivery_json(d) for d in page.deliveries], "next_cursor": page.cursor}
        )

    return read


@audience(Audience.ADMIN)
async def get_delivery(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    delivery = inputs.delivery_id(request.match_info["id"])
    async with connection(request) as conn:
        detail = await store.delivery_detail(conn, delivery, (namespace, name))
    if detail is None:
        return no_delivery(namespace, name, delivery)
    return web.json_response(detail_json(detail))


@audience(Audience.ADMIN)
async def list_attempts(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    read = attempts_of(request, namespace, name)
    async with connection(request) as conn:
        return await read(conn)


def attempts_of(request: web.Request, namespace: str, name: str) -> Read:
    """The answer of a listing of the endpoint's attempts, by the
    request's query (checked before any database is reached): the admin
    API's and a tenant's."""
    query = request.query
    since, until = inputs.time_range(query)
    outcomes = store.check_outcomes(inputs.values(query, "outcome"))
    status, failure = inputs.answer_filter(query)
    limit = inputs.limit(query, _DEFAULT_ATTEMPTS)
    cursor = inputs.attempt_cursor(query)

    async def read(conn: asyncpg.Connection) -> web.Response:
        page = await store.endpoint_attempts(
            conn,
            namespace,
            name,
            since=since,
            until=until,
            outcomes=outcomes,
            status=status,
            failure=failure,
            cursor=cursor,
            limit=limit,
        )
        if page is None:
            return no_endpoint(namespace, name)
        return web.json_response(
            {"attempts": [listed_attempt_json(a) for a in page.attempts], "next_cursor": page.cursor}
        )

    return read


@audience(Audience.ADMIN)
async def resend_delivery(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    delivery = inputs.delivery_id(request.match_info["id"])
    async with connection(request) as conn:
        count = await store.resend_dead(conn, namespace, name, [delivery])
    if count is None:
        return no_endpoint(namespace, name)
    if count == 0:
        return no_dead_delivery(namespace, name, delivery)
    _log("resend", namespace, name, count)
    return web.json_response({"resent": count})


@audience(Audience.ADMIN)
async def resend_dead(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    async with connection(request) as conn:
        done = await store.resend_dead_pages(conn, namespace, name, stop_at=repair_stop(request))
    if done is None:
        return no_endpoint(namespace, name)
    _log("resend", namespace, name, done.count)
    return web.json_response(repaired("resent", done))


@audience(Audience.ADMIN)
async def discard_dead(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    body = await _body(request, required=False)
    ids = _ids(body.get("ids"))
    async with connection(request) as conn:
        done = await store.discard_dead(conn, namespace, name, ids, _ACTOR, stop_at=repair_stop(request))
    if done is None:
        return no_endpoint(namespace, name)
    _log("discard", namespace, name, done.count)
    return web.json_response(repaired("discarded", done))


def repaired(what: str, done: store.Progress[Any]) -> dict[str, Any]:
    """The answer of a resend or a discard of every dead delivery: how
    many, and whether it reached the last (``complete``). One stopped by
    its deadline is continued by sending it again: what it did is no
    longer dead."""
    return {what: done.count, "complete": done.stopped_at is None}


@audience(Audience.ADMIN)
async def replay(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    asked = await replay_asked(request)
    async with connection(request) as conn:
        done = await store.replay_pages(
            conn, namespace, name, asked.since, after=asked.after, stop_at=repair_stop(request)
        )
    if done is None:
        return no_endpoint(namespace, name)
    _log("replay", namespace, name, done.count)
    return web.json_response(replayed(done))


@dataclass(frozen=True)
class ReplayAsked:
    """A replay's body: the time its events start from, and where in them
    it continues (a stopped replay's ``next_cursor``)."""

    since: datetime
    after: tuple[int, str]


async def replay_asked(request: web.Request) -> ReplayAsked:
    body = await _body(request, required=True)
    return replay_fields(body.get("since"), body.get("cursor"))


def replay_fields(since: object, cursor: object) -> ReplayAsked:
    """A replay's ``since`` and ``cursor`` (None: from the first event), as
    a body or a form gave them."""
    if not isinstance(since, str):
        raise InvalidInput("since", f"must be an RFC 3339 time like 2026-03-01T12:00:00Z, not {shown(since)}")
    if cursor is not None and not isinstance(cursor, str):
        raise InvalidInput("cursor", f"must be the next_cursor of a replay's answer, not {shown(cursor)}")
    return ReplayAsked(parse_time(since.strip(), "since"), event_position(cursor or None))


def replayed(done: store.Progress[tuple[int, str]]) -> dict[str, Any]:
    """A replay's answer: how many events it queued, and, when its deadline
    stopped it, where it stopped: sent again with the same ``since`` and
    this ``cursor``, it continues there and queues each event once."""
    stopped = done.stopped_at
    return {
        "replayed": done.count,
        "complete": stopped is None,
        "next_cursor": None if stopped is None else event_cursor(*stopped),
    }


@audience(Audience.ADMIN)
async def reactivate(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    async with connection(request) as conn:
        done = await store.reactivate_endpoint(conn, namespace, name)
    if done is store.Reactivation.NO_ENDPOINT:
        return no_endpoint(namespace, name)
    if done is store.Reactivation.NOT_DEACTIVATED:
        return problem(
            409,
            "not_deactivated",
            f"endpoint {namespace}/{name} is not deactivated: nothing to reactivate, its circuit is left as it is",
        )
    _log("reactivate", namespace, name, 1)
    return web.json_response({"reactivated": True})


@audience(Audience.ADMIN)
async def list_events(request: web.Request) -> web.Response:
    return await events_of(request, check_tenant(inputs.required(request.query, "tenant"), "tenant"))


async def events_of(request: web.Request, tenant: str) -> web.Response:
    """The tenant's events by time, by the request's query: receivers'
    reconciliation, for the admin API and a tenant's own token."""
    query = request.query
    since, until = parse_time(inputs.required(query, "since"), "since"), inputs.time(query, "until")
    limit = inputs.limit(query, store.MAX_PAGE)
    cursor = inputs.event_cursor(query)
    async with connection(request) as conn:
        page = await store.list_events(conn, tenant, since, until, limit=limit, cursor=cursor)
    events = [
        {
            "id": e.id,
            "type": e.type,
            "created_at": rfc3339(e.created_at),
            "fanout": e.fanout,
            "data": json.loads(e.data),
        }
        for e in page.events
    ]
    return web.json_response({"events": events, "next_cursor": page.cursor})


@audience(Audience.ADMIN)
async def unrouted(request: web.Request) -> web.Response:
    async with connection(request) as conn:
        counts = await store.unrouted_counts(conn)
    return web.json_response(
        {
            "total": sum(u.events for u in counts),
            "unrouted": [
                {
                    "tenant": u.tenant,
                    "type": u.type,
                    "events": u.events,
                    "oldest": rfc3339(u.oldest),
                    "newest": rfc3339(u.newest),
                }
                for u in counts
            ],
        }
    )


# Where a portal link is redeemed; the link's token follows.
PORTAL_ENTRY = "/portal/enter/"


@audience(Audience.ADMIN)
async def portal_session(request: web.Request) -> web.Response:
    """A single-use link into one tenant's portal (``"kind": "link"``, the
    default), or a tenant token for the tenant API (``"kind": "token"``),
    with the rights of ``access`` (read, resend or manage; read when left
    out). Shown once: only its digest is kept."""
    body = await _body(request, required=True)
    unknown = sorted(set(body) - {"tenant", "access", "kind"})
    if unknown:
        raise InvalidInput(unknown[0], "is not a field of a portal session (tenant, access, kind)")
    tenant = check_tenant(body.get("tenant"), "tenant")
    access = check_access(body.get("access"))
    kind = body.get("kind", "link")
    if kind not in ("link", "token"):
        raise InvalidInput("kind", f"must be link or token, not {shown(kind)}")
    settings = request.app[SETTINGS]
    if access is Access.MANAGE and settings.portal_endpoints == "off":
        raise InvalidInput(
            "access",
            "manage needs self-service endpoints: set HOOKLANE_PORTAL_ENDPOINTS to local or kubernetes",
        )
    link = kind == "link"
    seconds = settings.portal_link_seconds if link else settings.portal_session_seconds
    async with connection(request) as conn:
        issued = await portal.issue(conn, tenant, access, seconds, link=link)
    answer: dict[str, Any] = {
        "tenant": tenant,
        "access": str(access),
        "kind": kind,
        "expires_at": rfc3339(issued.expires_at),
    }
    if link:
        path = PORTAL_ENTRY + issued.token
        answer |= {"url": f"{public_origin(request)}{path}", "path": path}
    else:
        answer["token"] = issued.token
    logger.info(
        "admin API: portal %s for tenant %s (%s)",
        kind,
        tenant,
        access,
        extra={"action": "portal_session", "tenant": tenant, "access": str(access), "kind": kind},
    )
    return web.json_response(answer, status=201, headers={"Cache-Control": "no-store"})


def public_origin(request: web.Request) -> str:
    """The scheme and host the caller reached the API by: behind an ingress
    that terminated TLS, https (``X-Forwarded-Proto``)."""
    forwarded = (request.headers.get("X-Forwarded-Proto") or "").split(",")[0].strip().lower()
    scheme = "https" if forwarded == "https" else request.scheme
    return f"{scheme}://{request.host}"


def no_endpoint(namespace: str, name: str) -> web.Response:
    return problem(404, "not_found", f"no endpoint {namespace}/{name}")


def no_delivery(namespace: str, name: str, delivery: int) -> web.Response:
    return problem(404, "not_found", f"endpoint {namespace}/{name} has no delivery {delivery}", field="id")


def no_dead_delivery(namespace: str, name: str, delivery: int) -> web.Response:
    return problem(
        404, "not_found", f"endpoint {namespace}/{name} has no dead delivery {delivery}", field="id"
    )


def _ids(value: Any) -> list[int] | None:
    """The ``ids`` of a discard: None (all) or delivery ids."""
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(type(i) is int and 1 <= i <= store.MAX_DELIVERY_ID for i in value)
    ):
        raise InvalidInput("ids", f"must be a non-empty list of delivery ids, not {shown(value)}")
    return value


async def _body(request: web.Request, *, required: bool) -> dict[str, Any]:
    """A repair's JSON object body; {} when it may be left out and is."""
    return await inputs.json_body(request, required=required, limit=inputs.ADMIN_MAX_BODY_BYTES)


def _log(action: str, namespace: str, name: str, count: int) -> None:
    logger.info(
        "admin API: %s %s/%s: %d",
        action,
        namespace,
        name,
        count,
        extra={"action": action, "endpoint": f"{namespace}/{name}", "count": count},
    )
