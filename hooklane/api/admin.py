"""The admin API's routes (``/v1/admin``), for the platform's operators
and their programs, with an admin token (:mod:`.auth`).

The routes it shares with the tenant API, over every endpoint here
(:mod:`.endpoints`), and the platform's own: the repairs no tenant makes
(discard, reactivate), the unrouted events, and the links and tokens that
open a tenant's portal or tenant API.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from hooklane import store
from hooklane.api import actions, endpoints, inputs
from hooklane.api.auth import Audience, audience, connection, expect_continue
from hooklane.api.context import SETTINGS, repair_stop, scope
from hooklane.api.endpoints import body_of, no_endpoint, repaired
from hooklane.api.errors import problem
from hooklane.errors import InvalidInput, shown
from hooklane.spec import check_tenant
from hooklane.store import grants
from hooklane.store.grants import Access, check_access
from hooklane.times import rfc3339

logger = logging.getLogger(__name__)

PREFIX = "/v1/admin"
_ENDPOINT = PREFIX + endpoints.ENDPOINT


def add_routes(app: web.Application) -> None:
    """Add the admin routes to ``app``."""
    endpoints.add_routes(app, PREFIX, Audience.ADMIN)
    router = app.router
    for path, handler in (("/discard-dead", discard_dead), ("/reactivate", reactivate)):
        router.add_post(_ENDPOINT + path, handler, expect_handler=expect_continue)
    router.add_get(PREFIX + "/unrouted", unrouted)
    router.add_post(PREFIX + "/portal-sessions", portal_session, expect_handler=expect_continue)


@audience(Audience.ADMIN)
async def discard_dead(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    body = await body_of(request, required=False)
    ids = _ids(body.get("ids"))
    async with connection(request) as conn:
        done = await actions.discard(conn, scope(request), namespace, name, ids, repair_stop(request))
    if done is None:
        return no_endpoint(namespace, name)
    return web.json_response(repaired("discarded", done))


@audience(Audience.ADMIN)
async def reactivate(request: web.Request) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    async with connection(request) as conn:
        done = await actions.reactivate(conn, scope(request), namespace, name)
    if done is store.Reactivation.NO_ENDPOINT:
        return no_endpoint(namespace, name)
    if done is store.Reactivation.NOT_DEACTIVATED:
        return problem(
            409,
            "not_deactivated",
            f"endpoint {namespace}/{name} is not deactivated: nothing to reactivate, its circuit is left as it is",
        )
    return web.json_response({"reactivated": True})


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
    body = await body_of(request, required=True)
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
        issued = await grants.issue(conn, tenant, access, seconds, link=link)
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
