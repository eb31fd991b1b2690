"""The admin API's routes (``/v1/admin``), for the platform's operators
and their programs, with an admin token (:mod:`.auth`).

Endpoints with their health (the records ``hooklane status``, the
operator and the gauges show: :mod:`hooklane.health`), an endpoint's
deliveries, the repairs (resend, discard, replay, reactivate), receivers'
reconciliation (a tenant's events by time, with a stable cursor) and the
unrouted events. Each handler parses its input, calls one store function
and shapes the answer; every refusal is the JSON of :mod:`.errors`, a bad
parameter a 422 that names it.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from aiohttp import web

from hooklane import store
from hooklane.api.auth import Audience, audience
from hooklane.api.context import POOL
from hooklane.api.errors import problem
from hooklane.errors import InvalidInput, shown
from hooklane.health import as_json
from hooklane.manifest import check_name, check_namespace, check_tenant
from hooklane.times import parse_time, rfc3339

logger = logging.getLogger(__name__)

PREFIX = "/v1/admin"
_ENDPOINT = PREFIX + "/endpoints/{namespace}/{name}"
# Who discarded, as a discarded delivery's last_error records it.
_ACTOR = "the admin API"
# A repair's body is a few ids or a time; the limit only bounds a wrong one.
_MAX_BODY_BYTES = 256 * 1024
_DEFAULT_DELIVERIES = 100


def add_routes(app: web.Application) -> None:
    """Add the admin routes to ``app``."""
    router = app.router
    router.add_get(PREFIX + "/endpoints", list_endpoints)
    router.add_get(_ENDPOINT, get_endpoint)
    router.add_get(_ENDPOINT + "/deliveries", list_deliveries)
    router.add_post(_ENDPOINT + "/deliveries/{id}/resend", resend_delivery)
    router.add_post(_ENDPOINT + "/resend-dead", resend_dead)
    router.add_post(_ENDPOINT + "/discard-dead", discard_dead)
    router.add_post(_ENDPOINT + "/replay", replay)
    router.add_post(_ENDPOINT + "/reactivate", reactivate)
    router.add_get(PREFIX + "/events", list_events)
    router.add_get(PREFIX + "/unrouted", unrouted)


@audience(Audience.ADMIN)
async def list_endpoints(request: web.Request) -> web.Response:
    async with store.acquire(request.app[POOL]) as conn:
        healths = await store.endpoint_health(conn)
    return web.json_response({"endpoints": [as_json(h) for h in healths]})


@audience(Audience.ADMIN)
async def get_endpoint(request: web.Request) -> web.Response:
    namespace, name = _endpoint(request)
    async with store.acquire(request.app[POOL]) as conn:
        found = await store.endpoint_health(conn, endpoint=(namespace, name))
    if not found:
        return _no_endpoint(namespace, name)
    return web.json_response(as_json(found[0]))


@audience(Audience.ADMIN)
async def list_deliveries(request: web.Request) -> web.Response:
    namespace, name = _endpoint(request)
    query = request.query
    states = [s for value in query.getall("state", []) for s in value.split(",")] or None
    since, until = _time(query, "since"), _time(query, "until")
    limit = _limit(query, _DEFAULT_DELIVERIES)
    # A malformed cursor is the caller's error (422), even while the
    # database is away: checked before a connection is taken.
    store.delivery_position(query.get("cursor"))
    async with store.acquire(request.app[POOL]) as conn:
        page = await store.endpoint_deliveries(
            conn,
            namespace,
            name,
            states=store.check_states(states),
            since=since,
            until=until,
            cursor=query.get("cursor"),
            limit=limit,
        )
    if page is None:
        return _no_endpoint(namespace, name)
    return web.json_response(
        {"deliveries": [_delivery(d) for d in page.deliveries], "next_cursor": page.cursor}
    )


@audience(Audience.ADMIN)
async def resend_delivery(request: web.Request) -> web.Response:
    namespace, name = _endpoint(request)
    delivery = store.check_delivery_id(request.match_info["id"])
    async with store.acquire(request.app[POOL]) as conn:
        count = await store.resend_dead(conn, namespace, name, [delivery])
    if count is None:
        return _no_endpoint(namespace, name)
    if count == 0:
        return problem(
            404, "not_found", f"endpoint {namespace}/{name} has no dead delivery {delivery}", field="id"
        )
    _log("resend", namespace, name, count)
    return web.json_response({"resent": count})


@audience(Audience.ADMIN)
async def resend_dead(request: web.Request) -> web.Response:
    namespace, name = _endpoint(request)
    async with store.acquire(request.app[POOL]) as conn:
        count = await store.resend_dead(conn, namespace, name)
    if count is None:
        return _no_endpoint(namespace, name)
    _log("resend", namespace, name, count)
    return web.json_response({"resent": count})


@audience(Audience.ADMIN)
async def discard_dead(request: web.Request) -> web.Response:
    namespace, name = _endpoint(request)
    body = await _body(request, required=False)
    ids = _ids(body.get("ids"))
    async with store.acquire(request.app[POOL]) as conn:
        count = await store.discard_dead(conn, namespace, name, ids, _ACTOR)
    if count is None:
        return _no_endpoint(namespace, name)
    _log("discard", namespace, name, count)
    return web.json_response({"discarded": count})


@audience(Audience.ADMIN)
async def replay(request: web.Request) -> web.Response:
    namespace, name = _endpoint(request)
    body = await _body(request, required=True)
    text = body.get("since")
    if not isinstance(text, str):
        raise InvalidInput("since", f"must be an RFC 3339 time like 2026-03-01T12:00:00Z, not {shown(text)}")
    since = parse_time(text, "since")
    async with store.acquire(request.app[POOL]) as conn:
        count = await store.replay_since(conn, namespace, name, since)
    if count is None:
        return _no_endpoint(namespace, name)
    _log("replay", namespace, name, count)
    return web.json_response({"replayed": count})


@audience(Audience.ADMIN)
async def reactivate(request: web.Request) -> web.Response:
    namespace, name = _endpoint(request)
    async with store.acquire(request.app[POOL]) as conn:
        found = await store.reactivate_endpoint(conn, namespace, name)
    if not found:
        return _no_endpoint(namespace, name)
    _log("reactivate", namespace, name, 1)
    return web.json_response({"reactivated": True})


@audience(Audience.ADMIN)
async def list_events(request: web.Request) -> web.Response:
    query = request.query
    tenant = check_tenant(_required(query, "tenant"), "tenant")
    since, until = parse_time(_required(query, "since"), "since"), _time(query, "until")
    limit = _limit(query, store.MAX_PAGE)
    async with store.acquire(request.app[POOL]) as conn:
        page = await store.list_events(conn, tenant, since, until, limit=limit, cursor=query.get("cursor"))
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
    async with store.acquire(request.app[POOL]) as conn:
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


def _endpoint(request: web.Request) -> tuple[str, str]:
    return (
        check_namespace(request.match_info["namespace"], "namespace"),
        check_name(request.match_info["name"], "name"),
    )


def _no_endpoint(namespace: str, name: str) -> web.Response:
    return problem(404, "not_found", f"no endpoint {namespace}/{name}")


def _required(query: Any, key: str) -> str:
    value = query.get(key)
    if value is None:
        raise InvalidInput(key, "is required")
    return str(value)


def _time(query: Any, key: str) -> datetime | None:
    value = query.get(key)
    return None if value is None else parse_time(value, key)


def _limit(query: Any, default: int) -> int:
    value = query.get("limit")
    if value is None:
        return default
    if not value.isascii() or not value.isdigit() or len(value) > 6:
        raise InvalidInput(
            "limit", f"must be a whole number between 1 and {store.MAX_PAGE}, not {shown(value)}"
        )
    return store.check_page(int(value))


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
    if not request.can_read_body:
        if required:
            raise InvalidInput("body", "is required: a JSON object")
        return {}
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(text="the body must be application/json")
    if request.content_length is not None and request.content_length > _MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=_MAX_BODY_BYTES, actual_size=request.content_length)
    raw = await request.content.read(_MAX_BODY_BYTES + 1)
    if len(raw) > _MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=_MAX_BODY_BYTES, actual_size=len(raw))
    try:
        body = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise web.HTTPBadRequest(text="the body is not valid UTF-8 JSON") from None
    if not isinstance(body, dict):
        raise InvalidInput("body", f"must be a JSON object, not {shown(body)}")
    return body


def _delivery(d: store.DeliveryView) -> dict[str, Any]:
    return {
        "id": d.id,
        "event_id": d.event_id,
        "event_type": d.event_type,
        "state": d.state,
        "attempts": d.attempts,
        "attempted_by": d.attempted_by,
        "created_at": rfc3339(d.created_at),
        "next_attempt_at": rfc3339(d.next_attempt_at),
        "delivered_at": rfc3339(d.delivered_at),
        "last_status": d.last_status,
        "last_error": d.last_error,
    }


def _log(action: str, namespace: str, name: str, count: int) -> None:
    logger.info(
        "admin API: %s %s/%s: %d",
        action,
        namespace,
        name,
        count,
        extra={"action": action, "endpoint": f"{namespace}/{name}", "count": count},
    )
