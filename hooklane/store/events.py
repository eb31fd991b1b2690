"""Events: the outbox write, reconciliation listing and retention."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from hooklane.errors import EventConflict
from hooklane.store.queries import QUERIES


async def insert_event(
    conn: asyncpg.Connection,
    *,
    id: str,
    tenant: str,
    type: str,
    data_json: str,
    coalesce_key: str | None,
) -> int | None:
    """Store the event and its deliveries on ``conn``, in whatever
    transaction it is in. Returns the fan-out (0: no endpoint matched), or
    None when the tenant already stored this very event under this id.
    ``EventConflict`` when the tenant stored a different one under it:
    nothing is stored, and the transaction is still usable. The caller's
    ``conn`` raises its own errors (see :func:`hooklane.publish`)."""
    args = (id, tenant, type, data_json, coalesce_key)
    row = await conn.fetchrow(QUERIES["publish"], *args)
    assert row is not None, "publish returns one row, always"
    if row["fanout"] is not None:
        return row["fanout"]
    conflict = row["conflict"]
    if conflict is None:
        conflict = await conn.fetchval(QUERIES["event_conflict"], *args)
    if conflict:
        raise EventConflict(id, tenant)
    return None


async def list_events(
    conn: asyncpg.Connection, tenant: str, since: datetime, until: datetime, limit: int = 1000
) -> list[asyncpg.Record]:
    return await conn.fetch(QUERIES["list_events"], tenant, since, until, limit)


async def purge_events(conn: asyncpg.Connection, retention_seconds: float, batch: int = 1000) -> int:
    """Drop events past retention, a batch at a time; returns how many."""
    purged = 0
    while True:
        status = await conn.execute(QUERIES["purge_events"], retention_seconds, batch)
        count = int(status.split()[-1])
        purged += count
        if count < batch:
            return purged
