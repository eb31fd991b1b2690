"""What a tenant's session may read and repair, for the tenant API and the
portal alike: each call is scoped to the grant's tenant, and another
tenant's endpoint is None here exactly as one that does not exist.

Each call checks the endpoint's tenant in the transaction that does the
work (:func:`hooklane.store.portal.tenant_endpoint`), so that an endpoint
moved to another tenant meanwhile is never read or repaired for the one
it left. The repairs that page through many rows (a resend of every dead
delivery, a replay) commit page by page, and each page's statement checks
the tenant itself: the first page that finds the endpoint moved stops the
repair, and what a page queued as the move committed keeps the old tenant,
which the workers discard.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TypeVar

import asyncpg

from hooklane import store
from hooklane.health import EndpointHealth
from hooklane.selfservice import Limits, OverBound, PortalBounds, over_bounds, self_service_name
from hooklane.store import portal

logger = logging.getLogger(__name__)
P = TypeVar("P")


async def endpoint(conn: asyncpg.Connection, tenant: str, namespace: str, name: str) -> EndpointHealth | None:
    async with portal.tenant_endpoint(conn, tenant, namespace, name) as found:
        if found is None:
            return None
        healths = await store.endpoint_health(conn, endpoint=(namespace, name))
    return healths[0] if healths else None


async def endpoint_over_bounds(
    conn: asyncpg.Connection, settings: PortalBounds, tenant: str, namespace: str, name: str
) -> tuple[OverBound, ...]:
    """The fields of the tenant's endpoint beyond the platform's current
    bounds, kept since before a bound was lowered; none for an endpoint
    the platform set up, which its bounds do not hold."""
    if self_service_name(settings, tenant, namespace, name) is None:
        return ()
    async with portal.tenant_endpoint(conn, tenant, namespace, name) as found:
        limits = None if found is None else await store.endpoint_limits(conn, namespace, name)
    return () if limits is None else over_bounds(Limits(*limits), settings)


async def delivery(
    conn: asyncpg.Connection, tenant: str, namespace: str, name: str, delivery_id: int
) -> store.DeliveryDetail | None:
    async with portal.tenant_endpoint(conn, tenant, namespace, name) as found:
        if found is None:
            return None
        return await store.delivery_detail(conn, delivery_id, (namespace, name))


async def resend(
    conn: asyncpg.Connection,
    tenant: str,
    namespace: str,
    name: str,
    ids: list[int] | None,
    stop_at: float | None = None,
) -> store.Progress[int] | None:
    """Queue again the endpoint's dead deliveries (``ids``, or all), page by
    page until ``stop_at``: how many; None when the endpoint is not the
    tenant's, or stopped being so on the way."""
    done = await store.resend_dead_pages(conn, namespace, name, ids, tenant=tenant, stop_at=stop_at)
    return _logged(tenant, namespace, name, "resend", done)


async def replay(
    conn: asyncpg.Connection,
    tenant: str,
    namespace: str,
    name: str,
    since: datetime,
    after: tuple[int, str],
    stop_at: float,
) -> store.Progress[tuple[int, str]] | None:
    """Send the tenant's events since ``since`` (from the position
    ``after`` in them) to the endpoint again, page by page until
    ``stop_at``; None when the endpoint is not the tenant's, or stopped
    being so on the way."""
    done = await store.replay_pages(conn, namespace, name, since, tenant=tenant, after=after, stop_at=stop_at)
    return _logged(tenant, namespace, name, "replay", done)


def _logged(
    tenant: str, namespace: str, name: str, action: str, done: store.Progress[P] | None
) -> store.Progress[P] | None:
    """A paged repair's outcome, logged; None when the endpoint is not the
    tenant's now: what it queued before it moved is discarded by the
    workers, as any delivery of an endpoint's previous tenant."""
    if done is not None:
        _log(tenant, namespace, name, action, done.count)
    return None if done is None or done.gone else done


async def test_event(conn: asyncpg.Connection, tenant: str, namespace: str, name: str) -> int | None:
    """Queue a ``hooklane.test`` event to the endpoint alone: the new
    delivery's id."""
    async with portal.tenant_endpoint(conn, tenant, namespace, name, change=True) as found:
        if found is None:
            return None
        delivery = await portal.send_test_event(conn, found, tenant)
    _log(tenant, namespace, name, "test_event", delivery)
    return delivery


def _log(tenant: str, namespace: str, name: str, action: str, done: int | None) -> None:
    logger.info(
        "tenant %s: %s %s/%s: %s",
        tenant,
        action,
        namespace,
        name,
        done,
        extra={"action": action, "tenant": tenant, "endpoint": f"{namespace}/{name}", "result": done},
    )
