"""Every read and repair of an endpoint, for every face that offers it (the
admin and tenant APIs, the dashboard, the portal), in a request's scope:
the platform's, where every endpoint is in scope, or one tenant's, where
another tenant's endpoint is None here exactly as one that does not exist.

For a tenant, each call checks the endpoint's tenant in the transaction
that does the work (:func:`hooklane.store.grants.tenant_endpoint`), so
that an endpoint moved to another tenant meanwhile is never read or
repaired for the one it left. The repairs that page through many rows (a
resend of every dead delivery, a replay) commit page by page, and each
page's statement checks the tenant itself: the first page that finds the
endpoint moved stops the repair, and what a page queued as the move
committed keeps the old tenant, which the workers discard.

Every repair is logged once, in one shape: who (the face), for which
tenant (none: the platform), which endpoint, what, and how many.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import asyncpg

from hooklane import store
from hooklane.health import EndpointHealth
from hooklane.selfservice import Limits, OverBound, PortalBounds, over_bounds, self_service_name
from hooklane.store import grants
from hooklane.store.grants import TenantGrant

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Scope:
    """Whom a request acts for: the platform (no ``grant``), or the tenant
    of a session's ``grant`` with what it allows. ``actor`` names the face
    in the audit log and, for a discard, in the deliveries it ends."""

    actor: str
    grant: TenantGrant | None = None

    @property
    def tenant(self) -> str | None:
        return None if self.grant is None else self.grant.tenant


@asynccontextmanager
async def _in_scope(
    conn: asyncpg.Connection, scope: Scope, namespace: str, name: str, *, change: bool = False
) -> AsyncIterator[bool]:
    """The one scoping rule: whether the endpoint is in ``scope``, and for
    a tenant a transaction holding that answer for what is done in it
    (:func:`hooklane.store.grants.tenant_endpoint`). The platform's calls
    check nothing here: every store call answers None for no endpoint."""
    if scope.tenant is None:
        yield True
        return
    async with grants.tenant_endpoint(conn, scope.tenant, namespace, name, change=change) as found:
        yield found is not None


async def scoped(
    conn: asyncpg.Connection,
    scope: Scope,
    namespace: str,
    name: str,
    read: Callable[[asyncpg.Connection], Awaitable[T | None]],
) -> T | None:
    """What ``read`` reads of the endpoint, in the snapshot that found it
    in scope; None when it is not."""
    async with _in_scope(conn, scope, namespace, name) as found:
        return await read(conn) if found else None


async def with_health(
    conn: asyncpg.Connection,
    scope: Scope,
    namespace: str,
    name: str,
    read: Callable[[asyncpg.Connection], Awaitable[T]],
) -> tuple[EndpointHealth, T] | None:
    """The endpoint's health and what ``read`` reads of it, in one snapshot
    that found it in scope; None when it is not, or there is no such
    endpoint."""

    async def both(conn: asyncpg.Connection) -> tuple[EndpointHealth, T] | None:
        healths = await store.endpoint_health(conn, endpoint=(namespace, name))
        return (healths[0], await read(conn)) if healths else None

    return await scoped(conn, scope, namespace, name, both)


async def endpoint(
    conn: asyncpg.Connection, scope: Scope, namespace: str, name: str
) -> EndpointHealth | None:
    healths = await scoped(
        conn, scope, namespace, name, lambda c: store.endpoint_health(c, endpoint=(namespace, name))
    )
    return healths[0] if healths else None


async def endpoint_over_bounds(
    conn: asyncpg.Connection, settings: PortalBounds, scope: Scope, namespace: str, name: str
) -> tuple[OverBound, ...]:
    """The fields of the tenant's endpoint beyond the platform's current
    bounds, kept since before a bound was lowered; none for an endpoint
    the platform set up, which its bounds do not hold."""
    if scope.tenant is None or self_service_name(settings, scope.tenant, namespace, name) is None:
        return ()
    limits = await scoped(conn, scope, namespace, name, lambda c: store.endpoint_limits(c, namespace, name))
    return () if limits is None else over_bounds(Limits(*limits), settings)


async def delivery(
    conn: asyncpg.Connection, scope: Scope, namespace: str, name: str, delivery_id: int
) -> store.DeliveryDetail | None:
    return await scoped(
        conn, scope, namespace, name, lambda c: store.delivery_detail(c, delivery_id, (namespace, name))
    )


async def resend(
    conn: asyncpg.Connection,
    scope: Scope,
    namespace: str,
    name: str,
    ids: list[int] | None,
    stop_at: float | None = None,
) -> store.Progress[int] | None:
    """Queue again the endpoint's dead deliveries (``ids``, or all), page by
    page until ``stop_at``: how many; None when the endpoint is not in
    scope, or left it on the way."""
    done = await store.resend_dead_pages(conn, namespace, name, ids, tenant=scope.tenant, stop_at=stop_at)
    return _logged(scope, namespace, name, "resend", done)


async def replay(
    conn: asyncpg.Connection,
    scope: Scope,
    namespace: str,
    name: str,
    since: datetime,
    after: tuple[int, str],
    stop_at: float,
) -> store.Progress[tuple[int, str]] | None:
    """Send the endpoint's tenant's events since ``since`` (from the
    position ``after`` in them) to it again, page by page until
    ``stop_at``; None when the endpoint is not in scope, or left it on the
    way."""
    done = await store.replay_pages(
        conn, namespace, name, since, tenant=scope.tenant, after=after, stop_at=stop_at
    )
    return _logged(scope, namespace, name, "replay", done)


async def discard(
    conn: asyncpg.Connection, scope: Scope, namespace: str, name: str, ids: list[int] | None, stop_at: float
) -> store.Progress[int] | None:
    """End the endpoint's dead deliveries (``ids``, or all) for good, the
    actor recorded in each: the platform's repair, which no tenant's grant
    offers."""
    assert scope.tenant is None, "the platform's repair"
    done = await store.discard_dead(conn, namespace, name, ids, scope.actor, stop_at=stop_at)
    return _logged(scope, namespace, name, "discard", done)


async def reactivate(conn: asyncpg.Connection, scope: Scope, namespace: str, name: str) -> store.Reactivation:
    """Close a deactivated endpoint's circuit: the platform's repair."""
    assert scope.tenant is None, "the platform's repair"
    done = await store.reactivate_endpoint(conn, namespace, name)
    if done is store.Reactivation.REACTIVATED:
        _audit(scope, namespace, name, "reactivate", 1)
    return done


async def test_event(conn: asyncpg.Connection, scope: Scope, namespace: str, name: str) -> int | None:
    """Queue a ``hooklane.test`` event of the tenant to its endpoint alone:
    the new delivery's id."""
    assert scope.tenant is not None, "a tenant's action"
    async with grants.tenant_endpoint(conn, scope.tenant, namespace, name, change=True) as found:
        if found is None:
            return None
        delivery = await grants.send_test_event(conn, found, scope.tenant)
    _audit(scope, namespace, name, "test_event", int(delivery is not None))
    return delivery


P = TypeVar("P")


def _logged(
    scope: Scope, namespace: str, name: str, action: str, done: store.Progress[P] | None
) -> store.Progress[P] | None:
    """A paged repair's outcome, logged; None when the endpoint is not in
    scope now: what it queued before it moved is discarded by the
    workers, as any delivery of an endpoint's previous tenant."""
    if done is not None:
        _audit(scope, namespace, name, action, done.count)
    return None if done is None or done.gone else done


def _audit(scope: Scope, namespace: str, name: str, action: str, count: int) -> None:
    logger.info(
        "%s%s: %s %s/%s: %d",
        scope.actor,
        "" if scope.tenant is None else f" for tenant {scope.tenant}",
        action,
        namespace,
        name,
        count,
        extra={
            "actor": scope.actor,
            "tenant": scope.tenant,
            "endpoint": f"{namespace}/{name}",
            "action": action,
            "count": count,
        },
    )
