"""Connections to Hooklane's database, and where its errors are translated.

Every statement the store runs goes through a :class:`StoreConnection`,
which raises :mod:`hooklane.errors`' ``StoreError`` family in place of the
driver's errors; :func:`store_error` decides which. The worker, the operator
and the CLI catch those only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import asyncpg

from hooklane.errors import (
    DatabaseUnreachable,
    DataRefused,
    HooklaneError,
    InvalidInput,
    SchemaMissing,
    StoreError,
    TransientStoreError,
    printable,
)

# Session settings for the worker's connections. Its statements take arrays
# of ids whose length varies from 1 to hundreds; a cached generic plan
# assumes a handful and can turn a batch of results into a nested loop over
# every row in flight, so plan each execution with the real arrays (the
# reservation's and complete's functions, whose plans do not depend
# on them, keep theirs: migration 0004). Each statement reads a few rows of
# `deliveries` per endpoint or per result by an index, whatever the
# planner's statistics say: on a fresh or fast-growing database they are a
# nearly empty table's (autovacuum analyses a table after its first fifty
# rows), from which the planner chose sequential scans, or bitmap scans of
# an endpoint's every delivery, and the functions kept them for the session,
# reading the whole table every round (issue 37: 0.5-0.7 s rounds for ten
# seconds of a new install's first load). Without either, it takes the
# partial indexes the statements were written for (tests/db/test_fresh_plans.py).
# JIT compilation costs more than these millisecond statements take. No
# lock is worth waiting long for: a statement that would is aborted and
# retried. And the server probes an idle peer, so that a worker cut off
# without a reset loses its advisory locks (its partitions) in seconds, not
# hours.
WORKER_SESSION = {
    "plan_cache_mode": "force_custom_plan",
    "enable_seqscan": "off",
    "enable_bitmapscan": "off",
    "jit": "off",
    "lock_timeout": "10s",
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
}

# Session settings for the API's connections: a statement stuck behind a
# lock must not keep a producer waiting past its answer's deadline (the
# request is answered 503 at api_ack_timeout_seconds anyway; this frees
# the connection too). JIT costs more than these short statements take. A
# connection the API abandoned at a deadline is closed; the server checks
# for that every second even while its statement waits on a lock, so an
# abandoned transaction stops holding its row locks at once.
API_SESSION = {
    "jit": "off",
    "lock_timeout": "5s",
    "client_connection_check_interval": "1s",
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
}

# The connection is gone or unusable: Postgres out of reach, restarted or
# failed over (running statements then end with an operator-intervention
# error), or no answer in time. asyncpg raises InternalClientError ("cannot
# switch to state ...") when the server vanished in the middle of a
# statement and the connection is used again, such as by the reset a pool
# runs on release. These become DatabaseUnreachable.
CONNECTION_LOST = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    asyncpg.exceptions.OperatorInterventionError,
    OSError,
    asyncio.TimeoutError,
)
# Worth trying again: the above, or a statement Postgres aborted (deadlock,
# serialization failure, lock timeout). These become TransientStoreError;
# this tuple is the one definition of "transient".
TRANSIENT = (
    *CONNECTION_LOST,
    asyncpg.exceptions.TransactionRollbackError,
    asyncpg.exceptions.LockNotAvailableError,
)
# No Hooklane schema, or one older than this release's statements (a table
# or a function of a later migration missing): `hooklane migrate` has not
# run (yet).
SCHEMA_MISSING = (asyncpg.exceptions.UndefinedTableError, asyncpg.exceptions.UndefinedFunctionError)
# asyncpg refusing a query argument before sending anything (an
# InterfaceError, but the call is wrong, not the connection), and Postgres'
# data exceptions (SQLSTATE class 22: a value out of range, a NUL in a
# text): the caller's input is at fault, whatever retrying.
_ARGUMENT_REFUSED = (asyncpg.exceptions._base.DataError, asyncpg.exceptions.DataError)
# How long the reset of a released connection may take (a round trip):
# past it the connection is closed rather than waited on, so that a stalled
# server cannot hold the caller in a release.
RELEASE_TIMEOUT_SECONDS = 2.0
_DRIVER = (*TRANSIENT, asyncpg.PostgresError)


def store_error(exc: BaseException, *, connecting: bool = False) -> StoreError | None:
    """The Hooklane error for an error of the driver, None for any other.
    While ``connecting``, every failure means no connection could be made."""
    if isinstance(exc, HooklaneError) or not isinstance(exc, _DRIVER):
        return None
    message = printable(str(exc) or type(exc).__name__)
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(exc, _ARGUMENT_REFUSED) and not connecting:
        return DataRefused(message, sqlstate)
    if connecting or isinstance(exc, CONNECTION_LOST):
        return DatabaseUnreachable(message, sqlstate)
    if isinstance(exc, SCHEMA_MISSING):
        return SchemaMissing(message, sqlstate)
    if isinstance(exc, TRANSIENT):
        return TransientStoreError(message, sqlstate)
    return StoreError(message, sqlstate)


@asynccontextmanager
async def store_errors(*, connecting: bool = False) -> AsyncIterator[None]:
    """Raise the driver's errors inside as Hooklane's (:func:`store_error`)."""
    try:
        yield
    except Exception as exc:
        error = store_error(exc, connecting=connecting)
        if error is None:
            raise
        raise error from exc


class StoreConnection(asyncpg.Connection):
    """The connection the store hands out: asyncpg's, with every statement
    (transactions' BEGIN and COMMIT included, which go through ``execute``)
    raising Hooklane's errors. The rest of Hooklane never sees asyncpg's."""

    async def execute(self, *args: Any, **kwargs: Any) -> str:
        async with store_errors():
            return await super().execute(*args, **kwargs)

    async def executemany(self, *args: Any, **kwargs: Any) -> None:
        async with store_errors():
            return await super().executemany(*args, **kwargs)

    # The stubs overload fetch and fetchrow on ``record_class``, which
    # Hooklane never passes; these two pass every argument through.
    async def fetch(self, *args: Any, **kwargs: Any) -> list[asyncpg.Record]:  # type: ignore[override]
        async with store_errors():
            return await super().fetch(*args, **kwargs)

    async def fetchrow(self, *args: Any, **kwargs: Any) -> asyncpg.Record | None:  # type: ignore[override]
        async with store_errors():
            return await super().fetchrow(*args, **kwargs)

    async def fetchval(self, *args: Any, **kwargs: Any) -> Any:
        async with store_errors():
            return await super().fetchval(*args, **kwargs)

    async def add_listener(self, *args: Any, **kwargs: Any) -> None:
        async with store_errors():
            return await super().add_listener(*args, **kwargs)


def _require(dsn: str) -> str:
    if not dsn:
        raise InvalidInput("HOOKLANE_DATABASE_URL", "is not set: point it at the PostgreSQL database")
    return dsn


@asynccontextmanager
async def _connecting() -> AsyncIterator[None]:
    async with store_errors(connecting=True):
        try:
            yield
        except ValueError as exc:
            # asyncpg refusing a malformed URL; its message never quotes the
            # URL, which may hold a password.
            raise InvalidInput("HOOKLANE_DATABASE_URL", f"is not a valid PostgreSQL URL: {exc}") from None


async def connect(dsn: str, **kwargs: Any) -> StoreConnection:
    """A connection raising Hooklane's errors; ``DatabaseUnreachable`` when
    none can be made, ``InvalidInput`` for a malformed ``dsn``."""
    dsn = _require(dsn)
    async with _connecting():
        return await asyncpg.connect(dsn, connection_class=StoreConnection, **kwargs)


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10, **kwargs: Any) -> asyncpg.Pool:
    """A pool of :class:`StoreConnection`; errors as :func:`connect`."""
    dsn = _require(dsn)
    async with _connecting():
        return await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            connection_class=StoreConnection,
            **kwargs,
        )


@asynccontextmanager
async def acquire(pool: asyncpg.Pool) -> AsyncIterator[StoreConnection]:
    """A pooled connection that is never handed out again once it failed;
    ``DatabaseUnreachable`` when none can be had.

    asyncpg's own ``pool.acquire()`` resets a connection on release; after
    the server went away mid-statement that reset fails, and its error
    replaces the one the caller was ready to handle. A caller that gives up
    (cancelled, or timed out) may leave a statement in flight: its
    connection is closed on the spot, since a reset, or the cancel request
    asyncpg would send first, waits on a server that may have stalled.
    """
    async with _connecting():
        conn = await pool.acquire()
    try:
        # Once the server dropped the connection, the pool's proxy refuses
        # calls with asyncpg's own error, before StoreConnection sees them.
        async with store_errors():
            # A proxy of a StoreConnection (the pool's connection_class), which
            # forwards every call to it: the stubs type it as a proxy of a plain
            # Connection.
            yield conn  # type: ignore[misc]
    except (asyncio.CancelledError, TimeoutError, DatabaseUnreachable):
        # Released already when the server dropped it (asyncpg's proxy then
        # refuses every call): nothing left to close.
        with suppress(asyncpg.InterfaceError):
            conn.terminate()
        raise
    finally:
        # A failed reset: asyncpg terminated the connection, and the pool
        # opens a new one when needed. A terminated connection is released
        # without a round trip.
        with suppress(DatabaseUnreachable, *CONNECTION_LOST):
            await pool.release(conn, timeout=RELEASE_TIMEOUT_SECONDS)
