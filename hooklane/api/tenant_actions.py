"""What a tenant's session may read and repair, for the tenant API and the
portal alike: each call is scoped to the grant's tenant, and another
tenant's endpoint is None here exactly as one that does not exist.

Each call checks the endpoint's tenant in the transaction that does the
work (:func:`hooklane.store.portal.tenant_endpoint`), so that an endpoint
moved to another tenant meanwhile is never read or repaired for the one
it left.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

import asyncpg

from hooklane import store
from hooklane.health import EndpointHealth
from hooklane.store import portal

logger = logging.getLogger(__name__)


async def endpoint(conn: asyncpg.Connection, tenant: str, namespace: str, name: str) -> EndpointHealth | None:
    async with portal.tenant_endpoint(conn, tenant, namespace, name) as found:
        if found is None:
            return None
        healths = await store.endpoint_health(conn, endpoint=(namespace, name))
    return healths[0] if healths else None


async def delivery(
    conn: asyncpg.Connection, tenant: str, namespace: str, name: str, delivery_id: int
) -> store.DeliveryDetail | None:
    async with portal.tenant_endpoint(conn, tenant, namespace, name) as found:
        if found is None:
            return None
        return await store.delivery_detail(conn, delivery_id, (namespace, name))


async def resend(
    conn: asyncpg.Connection, tenant: str, namespace: str, name: str, ids: list[int] | None
) -> int | None:
    """Queue again the endpoint's dead deliveries (``ids``, or all): how
    many; None when the endpoint is not the tenant's."""
    return await _repair(
        conn, tenant, namespace, name, "resend", lambda _id: store.resend_dead(conn, namespace, name, ids)
    )


async def replay(
    conn: asyncpg.Connection, tenant: str, namespace: str, name: str, since: datetime
) -> int | None:
    """Send the tenant's events since ``since`` to the endpoint again."""
    return await _repair(
        conn, tenant, namespace, name, "replay", lambda _id: store.replay_since(conn, namespace, name, since)
    )


async def test_event(conn: asyncpg.Connection, tenant: str, namespace: str, name: str) -> int | None:
    """Queue a ``hooklane.test`` event to the endpoint alone: the new
    delivery's id."""
    return await _repair(
        conn, tenant, namespace, name, "test_event", lambda found: portal.send_test_event(conn, found, tenant)
    )


async def _repair(
    conn: asyncpg.Connection,
    tenant: str,
    namespace: str,
    name: str,
    action: str,
    work: Callable[[int], Awaitable[int | None]],
) -> int | None:
    """``work`` on the endpoint's id, in the transaction that holds it the
    tenant's, logged; None when it is not the tenant's."""
    async with portal.tenant_endpoint(conn, tenant, namespace, name, change=True) as found:
        if found is None:
            return None
        done = await work(found)
    logger.info(
        "tenant %s: %s %s/%s: %s",
        tenant,
        action,
        namespace,
        name,
        done,
        extra={"action": action, "tenant": tenant, "endpoint": f"{namespace}/{name}", "result": done},
    )
    return done
