"""Bounded shares of the API's one pool of Postgres connections.

Producers, the platform's operators and its tenants reach the database
through the same few connections (``api_pool_size``). Unbounded, a
tenant's slow repairs could take them all and hold every publish behind
them for as long as their deadline. So each request takes a place in its
audience's share before it asks the pool:

- ingest (the group committer) takes no place: ``api_pool_ingest_reserved``
  connections are left to it alone, whatever the others do;
- the admin API and the dashboard share the rest of the pool with the
  tenants;
- the tenant API and the portal (its link pages too) hold
  ``api_pool_tenant_max`` connections at most between them, so that the
  platform's own people always find some.

A request waits for its place as it would wait for the pool, by its
deadline; how long each share waited is ``hooklane_api_pool_wait_seconds``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from enum import Enum

import asyncpg

from hooklane import metrics, store
from hooklane.errors import InvalidInput
from hooklane.settings import Settings
from hooklane.store.connection import StoreConnection

# A connection from the pool, taken in a share and given back on exit.
Connect = Callable[[], AbstractAsyncContextManager[StoreConnection]]


class Share(Enum):
    INGEST = "ingest"
    ADMIN = "admin"
    TENANT = "tenant"


def check_shares(settings: Settings) -> None:
    """``InvalidInput`` when the shares do not fit in the pool: ingest's
    reserve must leave the others one connection, the tenants' share no
    more than the others have."""
    size, reserved = settings.api_pool_size, settings.api_pool_ingest_reserved
    if reserved >= size:
        raise InvalidInput(
            "HOOKLANE_API_POOL_INGEST_RESERVED",
            f"{reserved} must be below HOOKLANE_API_POOL_SIZE ({size}): the admin API, the dashboard"
            " and the tenants need a connection too",
        )
    if settings.api_pool_tenant_max > size - reserved:
        raise InvalidInput(
            "HOOKLANE_API_POOL_TENANT_MAX",
            f"{settings.api_pool_tenant_max} is more than the {size - reserved} connections"
            f" HOOKLANE_API_POOL_SIZE ({size}) leaves besides HOOKLANE_API_POOL_INGEST_RESERVED ({reserved})",
        )


class PoolShares:
    """The places of each share in front of ``pool``, sized by ``settings``
    (:func:`check_shares` passed)."""

    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self._pool = pool
        # Every share but ingest's: its reserve is what they cannot take.
        self._others = asyncio.Semaphore(settings.api_pool_size - settings.api_pool_ingest_reserved)
        self._tenants = asyncio.Semaphore(settings.api_pool_tenant_max)
        self._gates: dict[Share, tuple[asyncio.Semaphore, ...]] = {
            Share.INGEST: (),
            Share.ADMIN: (self._others,),
            # Always in this order, so that no two requests hold one each
            # while waiting for the other's.
            Share.TENANT: (self._tenants, self._others),
        }

    @asynccontextmanager
    async def acquire(self, share: Share) -> AsyncIterator[StoreConnection]:
        """A connection of the pool, once ``share`` has a place for it."""
        began = asyncio.get_running_loop().time()
        async with AsyncExitStack() as places:
            for gate in self._gates[share]:
                await places.enter_async_context(gate)
            async with store.acquire(self._pool) as conn:
                metrics.API_POOL_WAIT.labels(share.value).observe(asyncio.get_running_loop().time() - began)
                yield conn

    def connect(self, share: Share) -> Connect:
        """``acquire`` of one share, for a caller that serves only it."""
        return lambda: self.acquire(share)
