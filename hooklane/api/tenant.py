"""The tenant API's routes (``/v1/tenant``): one tenant's own endpoints,
their deliveries and attempts, the repairs its grant allows, and the
reconciliation listing a receiver's code recovers missed events with.

A request carries a tenant token (``Authorization: Bearer hlps_...``),
which the admin API issues (``POST /v1/admin/portal-sessions`` with
``"kind": "token"``) and the middleware (:mod:`.auth`) looks up. Every
route answers for the token's tenant only: another tenant's endpoint,
delivery or event is a 404 exactly like one that does not exist. The
routes it shares with the admin API are one handler each
(:mod:`.endpoints`); here are the tenant's own: its session, the test
event and self-service.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hooklane.api import actions, endpoints, inputs
from hooklane.api.auth import Audience, audience, connection, expect_continue, tenant_token
from hooklane.api.context import SETTINGS, WRITER, scope, tenant_grant
from hooklane.api.endpoint_writers import EndpointWriter
from hooklane.api.endpoints import no_endpoint
from hooklane.api.errors import Refused
from hooklane.selfservice import EndpointForm
from hooklane.store import grants
from hooklane.store.grants import Access
from hooklane.times import rfc3339

PREFIX = "/v1/tenant"
ENDPOINT = PREFIX + endpoints.ENDPOINT


def add_routes(app: web.Application) -> None:
    """Add the tenant routes to ``app``."""
    endpoints.add_routes(app, PREFIX, Audience.TENANT)
    router = app.router
    router.add_get(PREFIX + "/session", session)
    router.add_delete(PREFIX + "/session", end_session)
    router.add_post(ENDPOINT + "/test-event", test_event, expect_handler=expect_continue)
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
        await grants.end_session(conn, token)
    return web.Response(status=204)


@audience(Audience.TENANT, access=Access.RESEND)
async def test_event(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    async with connection(request) as conn:
        delivery = await actions.test_event(conn, scope(request), namespace, name)
    if delivery is None:
        return no_endpoint(namespace, name)
    return web.json_response({"delivery_id": delivery}, status=202)


# Self-service (docs/self-service.md): through the mode's one writer, the
# same spec rules as a manifest and the platform's bounds.


@audience(Audience.TENANT, access=Access.MANAGE)
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


@audience(Audience.TENANT, access=Access.MANAGE)
async def update_endpoint(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    form = EndpointForm.from_json(await _body(request))
    if not await writer(request).update(tenant_grant(request).tenant, namespace, name, form):
        return no_endpoint(namespace, name)
    return web.json_response({"namespace": namespace, "name": name})


@audience(Audience.TENANT, access=Access.MANAGE)
async def delete_endpoint(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    if not await writer(request).delete(tenant_grant(request).tenant, namespace, name):
        return no_endpoint(namespace, name)
    return web.Response(status=204)


@audience(Audience.TENANT, access=Access.MANAGE)
async def pause(request: web.Request) -> web.Response:
    return await _set_paused(request, True)


@audience(Audience.TENANT, access=Access.MANAGE)
async def resume(request: web.Request) -> web.Response:
    return await _set_paused(request, False)


async def _set_paused(request: web.Request, paused: bool) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    if not await writer(request).set_paused(tenant_grant(request).tenant, namespace, name, paused):
        return no_endpoint(namespace, name)
    return web.json_response({"paused": paused})


@audience(Audience.TENANT, access=Access.MANAGE)
async def rotate_secret(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    secret = await writer(request).rotate_secret(tenant_grant(request).tenant, namespace, name)
    if secret is None:
        return no_endpoint(namespace, name)
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
    return await endpoints.body_of(request, required=True)
