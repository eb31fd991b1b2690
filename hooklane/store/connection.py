"""Connections to Hooklane's database."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

import asyncpg

from hooklane.errors import InvalidInput


# Session settings for the worker's connections. Its statements take arrays
# of ids whose length varies from 1 to hundreds; a cached generic plan
# assumes a handful and can turn a batch of results into a nested loop over
# every row in flight, so plan each execution with the real arrays. JIT
# compilation costs more than these millisecond statements take.
WORKER_SESSION = {"plan_cache_mode": "force_custom_plan", "jit": "off"}


def _require(dsn: str) -> str:
    if not dsn:
        raise InvalidInput("HOOKLANE_DATABASE_URL", "is not set: point it at the PostgreSQL database")
    return dsn


async def connect(dsn: str, **kwargs) -> asyncpg.Connection:
    return await asyncpg.connect(_require(dsn), **kwargs)


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10, **kwargs) -> asyncpg.Pool:
    return await asyncpg.create_pool(_require(dsn), min_size=min_size, max_size=max_size, **kwargs)


@asynccontextmanager
async def connection(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """One connection for the length of a block (a CLI command)."""
    conn = await connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()
