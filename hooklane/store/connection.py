"""Connections to Hooklane's database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import asyncpg

from hooklane.errors import InvalidInput

# Session settings for the worker's connections. Its statements take arrays
# of ids whose length varies from 1 to hundreds; a cached generic plan
# assumes a handful and can turn a batch of results into a nested loop over
# every row in flight, so plan each execution with the real arrays. JIT
# compilation costs more than these millisecond statements take. No lock is
# worth waiting long for: a statement that would is aborted and retried. And
# the server probes an idle peer, so that a worker cut off without a reset
# loses its advisory locks (its partitions) in seconds, not hours.
WORKER_SESSION = {
    "plan_cache_mode": "force_custom_plan",
    "jit": "off",
    "lock_timeout": "10s",
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
}

# The connection is gone or unusable: Postgres out of reach, restarted or
# failed over (running statements then end with an operator-intervention
# error), or no answer in time. asyncpg raises InternalClientError ("cannot
# switch to state ...") when the server vanished in the middle of a
# statement and the connection is used again, such as by the reset a pool
# runs on release.
CONNECTION_LOST = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    asyncpg.exceptions.OperatorInterventionError,
    OSError,
    asyncio.TimeoutError,
)
# Worth trying again: the above, or a statement Postgres aborted (deadlock,
# serialization failure, lock timeout).
TRANSIENT = (
    *CONNECTION_LOST,
    asyncpg.exceptions.TransactionRollbackError,
    asyncpg.exceptions.LockNotAvailableError,
)


def _require(dsn: str) -> str:
    if not dsn:
        raise InvalidInput("HOOKLANE_DATABASE_URL", "is not set: point it at the PostgreSQL database")
    return dsn


async def connect(dsn: str, **kwargs) -> asyncpg.Connection:
    return await asyncpg.connect(_require(dsn), **kwargs)


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10, **kwargs) -> asyncpg.Pool:
    return await asyncpg.create_pool(_require(dsn), min_size=min_size, max_size=max_size, **kwargs)


@asynccontextmanager
async def acquire(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """A pooled connection that is never handed out again once it failed.

    asyncpg's own ``pool.acquire()`` resets a connection on release; after
    the server went away mid-statement that reset fails, and its error
    replaces the one the caller was ready to handle.
    """
    conn = await pool.acquire()
    try:
        yield conn
    finally:
        # A failed reset: asyncpg terminated the connection, and the pool
        # opens a new one when needed.
        with suppress(*CONNECTION_LOST):
            await pool.release(conn)
