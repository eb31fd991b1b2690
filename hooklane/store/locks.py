"""Advisory locks: how workers own partitions and count each other."""

from __future__ import annotations

import asyncpg

from hooklane.store.queries import QUERIES


async def try_lock(conn: asyncpg.Connection, lock_class: int, key: int) -> bool:
    """Take the session-level advisory lock (class, key) if it is free."""
    return await conn.fetchval(*QUERIES["try_lock"](lock_class=lock_class, key=key))


async def unlock(conn: asyncpg.Connection, lock_class: int, key: int) -> bool:
    """Release a lock this session holds; False if it held none."""
    return await conn.fetchval(*QUERIES["unlock"](lock_class=lock_class, key=key))


async def live_workers(conn: asyncpg.Connection, member_class: int) -> tuple[int, str]:
    """How many sessions hold a lock of ``member_class`` (the live workers),
    and the database's snapshot as it counted them (a pg_snapshot's text)."""
    row = await conn.fetchrow(*QUERIES["live_workers"](member_class=member_class))
    assert row is not None, "an aggregate without GROUP BY returns one row"
    return row["n"], row["snapshot"]
