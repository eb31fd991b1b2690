"""The JSON routes over endpoints and their records, one handler each for
the admin API (``/v1/admin``, every endpoint) and the tenant API
(``/v1/tenant``, the token's tenant's own): endpoints with their health
(the records ``hooklane status``, the operator and the gauges show:
:mod:`hooklane.health`), an endpoint's deliveries and attempts, its
ordering state (the keys held back and why), a delivery with its attempts (the JSON of :mod:`hooklane.views`, which ``hooklane
delivery show --json`` prints too), the repairs both may make (resend,
replay) and receivers' reconciliation (a tenant's events by time, with a
stable cursor).

Each handler parses its input, calls :mod:`.actions` in the request's
scope and shapes the answer, the same JSON field for field whoever asks:
an endpoint out of the scope is a 404 exactly like one that does not
exist. Every refusal is the JSON of :mod:`.errors`, a bad parameter a 422
that names it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
from aiohttp import web

from hooklane import store
from hooklane.api import actions, inputs
from hooklane.api.auth import Audience, audience, connection, expect_continue, route
from hooklane.api.context import SETTINGS, repair_stop, scope
from hooklane.api.errors import problem
from hooklane.errors import InvalidInput, shown
from hooklane.health import as_json
from hooklane.spec import check_tenant
from hooklane.store.cursor import event_cursor, event_position
from hooklane.store.grants import Access
from hooklane.times import parse_time, rfc3339
from hooklane.views import delivery_json, detail_json, listed_attempt_json, ordering_json

ENDPOINT = "/endpoints/{namespace}/{name}"
_DEFAULT_DELIVERIES = 100
_DEFAULT_ENDPOINTS = 100
_DEFAULT_ATTEMPTS = 100


def add_routes(app: web.Application, prefix: str, who: Audience) -> None:
    """Add the routes under ``prefix`` for ``who``: the admin API's or the
    tenant API's."""
    router = app.router
    router.add_get(prefix + "/endpoints", route(who, list_endpoints))
    router.add_get(prefix + ENDPOINT, route(who, get_endpoint))
    router.add_get(prefix + ENDPOINT + "/deliveries", route(who, list_deliveries))
    router.add_get(prefix + ENDPOINT + "/deliveries/{id}", route(who, get_delivery))
    router.add_get(prefix + ENDPOINT + "/attempts", route(who, list_attempts))
    router.add_get(prefix + ENDPOINT + "/ordering", route(who, get_ordering))
    for path, handler in (
        ("/deliveries/{id}/resend", resend_delivery),
        ("/resend-dead", resend_dead),
        ("/replay", replay),
    ):
        router.add_post(prefix + ENDPOINT + path, route(who, handler), expect_handler=expect_continue)
    router.add_get(prefix + "/events", route(who, list_events))


_BOTH = (Audience.ADMIN, Audience.TENANT)


@audience(*_BOTH)
async def list_endpoints(request: web.Request) -> web.Response:
    query = request.query
    chosen = inputs.tenant_filter(query, scope(request).tenant)
    limit = inputs.limit(query, _DEFAULT_ENDPOINTS)
    cursor = inputs.endpoint_cursor(query)
    async with connection(request) as conn:
        page = await store.endpoint_page(conn, chosen, cursor=cursor, limit=limit)
    return web.json_response({"endpoints": [as_json(h) for h in page.endpoints], "next_cursor": page.cursor})


@audience(*_BOTH)
async def get_endpoint(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    within = scope(request)
    async with connection(request) as conn:
        found = await actions.endpoint(conn, within, namespace, name)
        if found is None:
            return no_endpoint(namespace, name)
        if within.tenant is None:
            return web.json_response(as_json(found))
        over = await actions.endpoint_over_bounds(conn, request.app[SETTINGS], within, namespace, name)
    return web.json_response({**as_json(found), "over_bounds": [dataclasses.asdict(o) for o in over]})


@audience(*_BOTH)
async def list_deliveries(request: web.Request) -> web.Response:
    endpoint = inputs.endpoint_key(request)
    query = request.query
    states = store.check_states(inputs.values(query, "state"))
    since, until = inputs.time(query, "since"), inputs.time(query, "until")
    status, failure = inputs.answer_filter(query)
    chosen: dict[str, Any] = {
        "states": states,
        "since": since,
        "until": until,
        "status": status,
        "failure": failure,
    }
    chosen |= {"limit": inputs.limit(query, _DEFAULT_DELIVERIES), "cursor": inputs.delivery_cursor(query)}
    return await _listing(request, endpoint, store.endpoint_deliveries, chosen, "deliveries", delivery_json)


@audience(*_BOTH)
async def get_delivery(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    delivery = inputs.delivery_id(request.match_info["id"])
    async with connection(request) as conn:
        detail = await actions.delivery(conn, scope(request), namespace, name, delivery)
    if detail is None:
        return problem(
            404, "not_found", f"endpoint {namespace}/{name} has no delivery {delivery}", field="id"
        )
    return web.json_response(detail_json(detail))


@audience(*_BOTH)
async def list_attempts(request: web.Request) -> web.Response:
    endpoint = inputs.endpoint_key(request)
    query = request.query
    since, until = inputs.time_range(query)
    outcomes = store.check_outcomes(inputs.values(query, "outcome"))
    status, failure = inputs.answer_filter(query)
    chosen: dict[str, Any] = {
        "since": since,
        "until": until,
        "outcomes": outcomes,
        "status": status,
        "failure": failure,
    }
    chosen |= {"limit": inputs.limit(query, _DEFAULT_ATTEMPTS), "cursor": inputs.attempt_cursor(query)}
    return await _listing(request, endpoint, store.endpoint_attempts, chosen, "attempts", listed_attempt_json)


@audience(*_BOTH)
async def get_ordering(request: web.Request) -> web.Response:
    """The endpoint's ordering state and a page of its held keys, held
    longest first: which keys wait for a dead delivery to be resent or
    discarded, and why."""
    namespace, name = inputs.endpoint_key(request)
    limit = inputs.limit(request.query, store.HELD_KEYS_SHOWN)
    cursor = inputs.held_key_cursor(request.query)

    async def read(conn: asyncpg.Connection) -> dict[str, Any] | None:
        summary = await store.endpoint_ordering(conn, namespace, name)
        held = await store.held_keys(conn, namespace, name, cursor=cursor, limit=limit)
        return None if summary is None or held is None else ordering_json(summary, held)

    async with connection(request) as conn:
        found = await actions.scoped(conn, scope(request), namespace, name, read)
    if found is None:
        return no_endpoint(namespace, name)
    return web.json_response(found)


async def _listing(
    request: web.Request,
    endpoint: tuple[str, str],
    read: Callable[..., Awaitable[Any]],
    chosen: dict[str, Any],
    key: str,
    shown: Callable[[Any], dict[str, Any]],
) -> web.Response:
    """A page of one endpoint's records (``key``) that ``read`` reads by
    the query's choices (checked before any database is reached), in the
    snapshot that found the endpoint in scope."""
    namespace, name = endpoint
    async with connection(request) as conn:
        page = await actions.scoped(
            conn, scope(request), namespace, name, lambda c: read(c, namespace, name, **chosen)
        )
    if page is None:
        return no_endpoint(namespace, name)
    return web.json_response({key: [shown(r) for r in getattr(page, key)], "next_cursor": page.cursor})


@audience(*_BOTH, access=Access.RESEND)
async def resend_delivery(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    delivery = inputs.delivery_id(request.match_info["id"])
    async with connection(request) as conn:
        done = await actions.resend(conn, scope(request), namespace, name, [delivery])
    if done is None:
        return no_endpoint(namespace, name)
    if done.count == 0:
        return problem(
            404, "not_found", f"endpoint {namespace}/{name} has no dead delivery {delivery}", field="id"
        )
    return web.json_response({"resent": done.count})


@audience(*_BOTH, access=Access.RESEND)
async def resend_dead(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    async with connection(request) as conn:
        done = await actions.resend(conn, scope(request), namespace, name, None, repair_stop(request))
    if done is None:
        return no_endpoint(namespace, name)
    return web.json_response(repaired("resent", done))


def repaired(what: str, done: store.Progress[Any]) -> dict[str, Any]:
    """The answer of a resend or a discard of every dead delivery: how
    many, and whether it reached the last (``complete``). One stopped by
    its deadline is continued by sending it again: what it did is no
    longer dead."""
    return {what: done.count, "complete": done.stopped_at is None}


@audience(*_BOTH, access=Access.RESEND)
async def replay(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    body = await body_of(request, required=True)
    done = await replay_of(request, namespace, name, replay_fields(body.get("since"), body.get("cursor")))
    if done is None:
        return no_endpoint(namespace, name)
    return web.json_response(replayed(done))


@dataclass(frozen=True)
class ReplayAsked:
    """A replay's body: the time its events start from, and where in them
    it continues (a stopped replay's ``next_cursor``)."""

    since: datetime
    after: tuple[int, str]


def replay_fields(since: object, cursor: object) -> ReplayAsked:
    """A replay's ``since`` and ``cursor`` (None: from the first event), as
    a body or a form gave them."""
    if not isinstance(since, str):
        raise InvalidInput("since", f"must be an RFC 3339 time like 2026-03-01T12:00:00Z, not {shown(since)}")
    if cursor is not None and not isinstance(cursor, str):
        raise InvalidInput("cursor", f"must be the next_cursor of a replay's answer, not {shown(cursor)}")
    return ReplayAsked(parse_time(since.strip(), "since"), event_position(cursor or None))


async def replay_of(
    request: web.Request, namespace: str, name: str, asked: ReplayAsked
) -> store.Progress[tuple[int, str]] | None:
    """The replay ``asked``, in the request's scope and by its deadline:
    the JSON routes' and the portal's."""
    async with connection(request) as conn:
        return await actions.replay(
            conn, scope(request), namespace, name, asked.since, asked.after, repair_stop(request)
        )


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


@audience(*_BOTH)
async def list_events(request: web.Request) -> web.Response:
    """A tenant's events by time: receivers' reconciliation. The platform
    names the tenant (``tenant``); a tenant token lists its own."""
    query = request.query
    tenant = scope(request).tenant
    if tenant is None:
        tenant = check_tenant(inputs.required(query, "tenant"), "tenant")
    elif "tenant" in query:
        return problem(
            422, "invalid", "is not taken here: a tenant token lists its own tenant's events", field="tenant"
        )
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


def no_endpoint(namespace: str, name: str) -> web.Response:
    return problem(404, "not_found", f"no endpoint {namespace}/{name}")


async def body_of(request: web.Request, *, required: bool) -> dict[str, Any]:
    """A JSON object body; {} when it may be left out and is."""
    return await inputs.json_body(request, required=required, limit=inputs.ADMIN_MAX_BODY_BYTES)
