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
from dataclasses import dataclass
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


# Ingest's reserve when unset: its group committer holds one connection
# per task, 4 at most (hooklane.api.ingest.MAX_COMMITTERS).
DEFAULT_INGEST_RESERVED = 4


@dataclass(frozen=True)
class Sizes:
    """How many connections of the pool are ingest's alone, and how many
    the tenants may hold at most."""

    ingest_reserved: int
    tenant_max: int


def share_sizes(settings: Settings) -> Sizes:
    """The shares ``settings`` give the pool, the unset ones derived from
    its size; ``InvalidInput`` when the ones set do not fit: ingest's
    reserve must leave the others a connection, the tenants' share no more
    than the others have."""
    size, reserved = settings.api_pool_size, settings.api_pool_ingest_reserved
    if reserved is None:
        reserved = min(DEFAULT_INGEST_RESERVED, size - 1)
    elif reserved >= size:
        raise InvalidInput(
            "HOOKLANE_API_POOL_INGEST_RESERVED",
            f"{reserved} must be below HOOKLANE_API_POOL_SIZE ({size}): the admin API, the dashboard"
            " and the tenants need a connection too",
        )
    tenants = settings.api_pool_tenant_max
    if tenants is None:
        tenants = max(1, (size - reserved) // 2)
    elif tenants > size - reserved:
        raise InvalidInput(
            "HOOKLANE_API_POOL_TENANT_MAX",
            f"{tenants} is more than the {size - reserved} connections HOOKLANE_API_POOL_SIZE ({size})"
            f" leaves besides ingest's reserve ({reserved}, HOOKLANE_API_POOL_INGEST_RESERVED)",
        )
    return Sizes(reserved, tenants)


class PoolShares:
    """The places of each share in front of ``pool`` of ``size``
    connections."""

    def __init__(self, pool: asyncpg.Pool, size: int, sizes: Sizes) -> None:
        self._pool = pool
        # Every share but ingest's: its reserve is what they cannot take.
        self._others = asyncio.Semaphore(size - sizes.ingest_reserved)
        self._tenants = asyncio.Semaphore(sizes.tenant_max)
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
