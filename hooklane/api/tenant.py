"""The tenant API's routes (``/v1/tenant``): one tenant's own endpoints,
their deliveries and attempts, the repairs its grant allows, and the
reconciliation listing a receiver's code recovers missed events with.

A request carries a tenant token (``Authorization: Bearer hlps_...``),
which the admin API issues (``POST /v1/admin/portal-sessions`` with
``"kind": "token"``) and the middleware (:mod:`.auth`) looks up. Every
route answers for the token's tenant only: another tenant's endpoint,
delivery or event is a 404 exactly like one that does not exist. The JSON
is the admin API's, field for field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from hooklane import store
from hooklane.api import admin, inputs, tenant_actions
from hooklane.api.auth import Audience, audience, connection, expect_continue, tenant_token
from hooklane.api.context import SETTINGS, WRITER, repair_stop, tenant_grant
from hooklane.api.endpoint_writers import EndpointWriter
from hooklane.api.errors import Refused, problem
from hooklane.health import as_json
from hooklane.selfservice import EndpointForm
from hooklane.store import portal
from hooklane.store.portal import Access
from hooklane.times import rfc3339
from hooklane.views import detail_json

PREFIX = "/v1/tenant"
ENDPOINT = PREFIX + "/endpoints/{namespace}/{name}"


def add_routes(app: web.Application) -> None:
    """Add the tenant routes to ``app``."""
    router = app.router
    router.add_get(PREFIX + "/session", session)
    router.add_delete(PREFIX + "/session", end_session)
    router.add_get(PREFIX + "/endpoints", list_endpoints)
    router.add_get(ENDPOINT, get_endpoint)
    router.add_get(ENDPOINT + "/deliveries", list_deliveries)
    router.add_get(ENDPOINT + "/deliveries/{id}", get_delivery)
    router.add_get(ENDPOINT + "/attempts", list_attempts)
    for path, handler in (
        ("/deliveries/{id}/resend", resend_delivery),
        ("/resend-dead", resend_dead),
        ("/replay", replay),
        ("/test-event", test_event),
    ):
        router.add_post(ENDPOINT + path, handler, expect_handler=expect_continue)
    router.add_get(PREFIX + "/events", list_events)
    router.add_post(PREFIX + "/endpoints", create_endpoint, expect_handler=expect_continue)
    router.add_put(ENDPOINT, update_endpoint, expect_handler=expect_continue)
    router.add_delete(ENDPOINT, delete_endpoint)
    for path, handler in (
        ("/pause", pause),
        ("/resume", resume),
        ("/rotate-secret", rotate_secret),
    ):
        router.add_post(ENDPOINT + path, handler, expect_handler=expect_continue)


@audience(Audience.TENANT)
async def session(request: web.Request) -> web.Response:
    grant = tenant_grant(request)
    return web.json_response(
        {"tenant": grant.tenant, "access": str(grant.access), "expires_at": rfc3339(grant.expires_at)}
    )


@audience(Audience.TENANT)
async def end_session(request: web.Request) -> web.Response:
    token = tenant_token(request)
    assert token is not None, "the middleware checked it"
    async with connection(request) as conn:
        await portal.end_session(conn, token)
    return web.Response(status=204)


@audience(Audience.TENANT)
async def list_endpoints(request: web.Request) -> web.Response:
    query = request.query
    chosen = inputs.tenant_filter(query, tenant_grant(request).tenant)
    limit = inputs.limit(query, admin.DEFAULT_ENDPOINTS)
    cursor = inputs.endpoint_cursor(query)
    async with connection(request) as conn:
        page = await store.endpoint_page(conn, chosen, cursor=cursor, limit=limit)
    return web.json_response({"endpoints": [as_json(h) for h in page.endpoints], "next_cursor": page.cursor})


@audience(Audience.TENANT)
async def get_endpoint(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    tenant = tenant_grant(request).tenant
    async with connection(request) as conn:
        found = await tenant_actions.endpoint(conn, tenant, namespace, name)
        if found is None:
            return admin.no_endpoint(namespace, name)
        over = await tenant_actions.endpoint_over_bounds(conn, request.app[SETTINGS], tenant, namespace, name)
    return web.json_response({**as_json(found), "over_bounds": [dataclasses.asdict(o) for o in over]})


@audience(Audience.TENANT)
async def list_deliveries(request: web.Request) -> web.Response:
    return await _listing(request, admin.deliveries_of)


@audience(Audience.TENANT)
async def get_delivery(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    delivery = inputs.delivery_id(request.match_info["id"])
    async with connection(request) as conn:
        detail = await tenant_actions.delivery(conn, tenant_grant(request).tenant, namespace, name, delivery)
    if detail is None:
        return admin.no_delivery(namespace, name, delivery)
    return web.json_response(detail_json(detail))


@audience(Audience.TENANT)
async def list_attempts(request: web.Request) -> web.Response:
    return await _listing(request, admin.attempts_of)


@audience(Audience.TENANT, Access.RESEND)
async def resend_delivery(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    delivery = inputs.delivery_id(request.match_info["id"])
    async with connection(request) as conn:
        done = await tenant_actions.resend(conn, tenant_grant(request).tenant, namespace, name, [delivery])
    if done is None:
        return admin.no_endpoint(namespace, name)
    if done.count == 0:
        return admin.no_dead_delivery(namespace, name, delivery)
    return web.json_response({"resent": done.count})


@audience(Audience.TENANT, Access.RESEND)
async def resend_dead(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    async with connection(request) as conn:
        done = await tenant_actions.resend(
            conn, tenant_grant(request).tenant, namespace, name, None, repair_stop(request)
        )
    if done is None:
        return admin.no_endpoint(namespace, name)
    return web.json_response(admin.repaired("resent", done))


@audience(Audience.TENANT, Access.RESEND)
async def replay(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    done = await replay_of(request, namespace, name, await admin.replay_asked(request))
    if done is None:
        return admin.no_endpoint(namespace, name)
    return web.json_response(admin.replayed(done))


async def replay_of(
    request: web.Request, namespace: str, name: str, asked: admin.ReplayAsked
) -> store.Progress[tuple[int, str]] | None:
    """The replay ``asked`` of the session's tenant, by the request's
    deadline: the tenant API's and the portal's."""
    async with connection(request) as conn:
        return await tenant_actions.replay(
            conn,
            tenant_grant(request).tenant,
            namespace,
            name,
            asked.since,
            asked.after,
            repair_stop(request),
        )


@audience(Audience.TENANT, Access.RESEND)
async def test_event(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    async with connection(request) as conn:
        delivery = await tenant_actions.test_event(conn, tenant_grant(request).tenant, namespace, name)
    if delivery is None:
        return admin.no_endpoint(namespace, name)
    return web.json_response({"delivery_id": delivery}, status=202)


async def _listing(request: web.Request, list_of: admin.Listing) -> web.Response:
    """A listing of one of the tenant's endpoints, read in the snapshot
    that found the endpoint the tenant's."""
    namespace, name = inputs.endpoint_key(request)
    read = list_of(request, namespace, name)
    tenant = tenant_grant(request).tenant
    async with (
        connection(request) as conn,
        portal.tenant_endpoint(conn, tenant, namespace, name) as found,
    ):
        if found is None:
            return admin.no_endpoint(namespace, name)
        return await read(conn)


@audience(Audience.TENANT)
async def list_events(request: web.Request) -> web.Response:
    query = request.query
    if "tenant" in query:
        return problem(
            422, "invalid", "is not taken here: a tenant token lists its own tenant's events", field="tenant"
        )
    return await admin.events_of(request, tenant_grant(request).tenant)


# Self-service (docs/self-service.md): through the mode's one writer, the
# same spec rules as a manifest and the platform's bounds.


@audience(Audience.TENANT, Access.MANAGE)
async def create_endpoint(request: web.Request) -> web.Response:
    form = EndpointForm.from_json(await _body(request))
    created = await writer(request).create(tenant_grant(request).tenant, form)
    return web.json_response(
        {
            "namespace": created.namespace,
            "name": created.name,
            "secret": created.secret,
        },
        status=201,
        headers={"Cache-Control": "no-store"},
    )


@audience(Audience.TENANT, Access.MANAGE)
async def update_endpoint(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    form = EndpointForm.from_json(await _body(request))
    if not await writer(request).update(tenant_grant(request).tenant, namespace, name, form):
        return admin.no_endpoint(namespace, name)
    return web.json_response({"namespace": namespace, "name": name})


@audience(Audience.TENANT, Access.MANAGE)
async def delete_endpoint(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    if not await writer(request).delete(tenant_grant(request).tenant, namespace, name):
        return admin.no_endpoint(namespace, name)
    return web.Response(status=204)


@audience(Audience.TENANT, Access.MANAGE)
async def pause(request: web.Request) -> web.Response:
    return await _set_paused(request, True)


@audience(Audience.TENANT, Access.MANAGE)
async def resume(request: web.Request) -> web.Response:
    return await _set_paused(request, False)


async def _set_paused(request: web.Request, paused: bool) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    if not await writer(request).set_paused(tenant_grant(request).tenant, namespace, name, paused):
        return admin.no_endpoint(namespace, name)
    return web.json_response({"paused": paused})


@audience(Audience.TENANT, Access.MANAGE)
async def rotate_secret(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    secret = await writer(request).rotate_secret(tenant_grant(request).tenant, namespace, name)
    if secret is None:
        return admin.no_endpoint(namespace, name)
    grace = request.app[SETTINGS].secret_grace_seconds
    return web.json_response(
        {"secret": secret, "previous_signs_for_seconds": grace}, headers={"Cache-Control": "no-store"}
    )


def writer(request: web.Request) -> EndpointWriter:
    """The mode's writer; a 409 while self-service is off (a grant with
    manage cannot be issued then, but one may outlive a change of mode)."""
    found = request.app[WRITER]
    if found is None:
        raise Refused(409, "self_service_off", "this platform does not let tenants manage endpoints")
    return found


async def _body(request: web.Request) -> dict[str, Any]:
    return await inputs.json_body(request, required=True, limit=inputs.ADMIN_MAX_BODY_BYTES)
