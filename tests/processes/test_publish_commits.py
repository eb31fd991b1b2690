"""A publishing transaction's commit waits for nobody else's (issue 38).

PostgreSQL holds one lock for the whole instance from a notifying
transaction's pre-commit until its commit is flushed and, with a
synchronous standby, acknowledged. While publishes notified, one commit
held there (a slow disk, a standby far away) held up every other publishing
transaction, of any tenant. Here one commit is held for good: its session
waits for a synchronous standby that never connects, while the other
sessions commit locally. On a server of its own, thrown away with that
setting when the test ends, whatever the outcome.
"""

from __future__ import annotations

import asyncio

import asyncpg

import hooklane
from hooklane import store
from hooklane.dev.postgres import LocalPostgres
from testsupport.fixtures import add_endpoint, wait_for

STANDBY = "hooklane_standby_that_never_connects"


async def _held_at_sync_rep(admin: asyncpg.Connection, pid: int) -> bool:
    return await admin.fetchval("SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE pid = $1", pid)


async def _configured(conn: asyncpg.Connection) -> bool:
    return await conn.fetchval("SHOW synchronous_standby_names") == STANDBY


async def test_a_commit_held_at_its_flush_holds_up_no_other_tenants_publish():
    with LocalPostgres(durable=True) as pg:
        admin = await asyncpg.connect(pg.dsn)
        held = other = None
        try:
            await store.migrate(admin)
            await add_endpoint(admin, "a", "http://127.0.0.1:1/a", tenant="tenant-a")
            await add_endpoint(admin, "b", "http://127.0.0.1:1/b", tenant="tenant-b")
            await admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY}'")
            await admin.execute("SELECT pg_reload_conf()")
            held = await asyncpg.connect(pg.dsn, server_settings={"synchronous_commit": "on"})
            other = await asyncpg.connect(pg.dsn, server_settings={"synchronous_commit": "local"})
            for conn in (held, other):
                await wait_for(lambda conn=conn: _configured(conn))

            async def publish(conn: asyncpg.Connection, tenant: str) -> None:
                async with conn.transaction():
                    await hooklane.publish(conn, tenant=tenant, type="order.created", data={}, id=tenant)

            holding = asyncio.create_task(publish(held, "tenant-a"))
            await wait_for(lambda: _held_at_sync_rep(admin, held.get_server_pid()))
            # Another tenant's publishing transaction commits while the
            # first one's commit is still held.
            await asyncio.wait_for(publish(other, "tenant-b"), timeout=15)
            assert not holding.done()
            # The held transaction is not visible until its commit returns.
            assert await admin.fetchval("SELECT array_agg(id) FROM events") == ["tenant-b"]
            # A commit held at synchronous replication is flushed locally
            # already: cancelling the wait lets it return.
            await admin.execute("SELECT pg_cancel_backend($1)", held.get_server_pid())
            await asyncio.wait_for(holding, timeout=15)
            assert await admin.fetchval("SELECT count(*) FROM events") == 2
        finally:
            for conn in (held, other):
                if conn is not None:
                    conn.terminate()
            await admin.close()
