"""The store's connections raise Hooklane's error types only, on a real
Postgres: a violated constraint, a refused value, a lock timeout, a
missing schema, a lost connection and no server at all."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import kopf
import pytest

from hooklane import store
from hooklane.errors import (
    DatabaseUnreachable,
    DataRefused,
    InvalidInput,
    SchemaMissing,
    StoreError,
    TransientStoreError,
)
from hooklane.operator.handlers import kopf_error
from testsupport.errors import exc


async def test_a_constraint_violation_is_a_permanent_store_error(dsn):
    conn = await store.connect(dsn)
    try:
        await conn.execute("CREATE TEMP TABLE t (x integer CHECK (x > 0))")
        with pytest.raises(StoreError) as raised:
            await conn.execute("INSERT INTO t VALUES (0)")
        assert not raised.value.transient and raised.value.sqlstate == "23514"
        assert isinstance(raised.value.__cause__, exc.CheckViolationError)
        assert isinstance(kopf_error(raised.value), kopf.PermanentError)
        # COMMIT too: a deferred unique constraint is checked there
        await conn.execute("CREATE TEMP TABLE u (x integer UNIQUE DEFERRABLE INITIALLY DEFERRED)")
        with pytest.raises(StoreError) as at_commit:
            async with conn.transaction():
                await conn.execute("INSERT INTO u VALUES (1), (1)")
                await conn.execute("INSERT INTO t VALUES (1)")
        assert at_commit.value.sqlstate == "23505"
        assert await conn.fetchval("SELECT count(*) FROM t") == 0
    finally:
        await conn.close()


async def test_a_value_postgres_or_the_driver_refuses_is_data_refused(dsn):
    """Never an outage: the same call gets the same refusal, and the caller's
    value is at fault (the API answers 422, the CLI exits 2)."""
    conn = await store.connect(dsn)
    try:
        for query, args, sqlstate in (
            ("SELECT 1 / $1::int", (0,), "22012"),
            ("SELECT $1::text", ("a\x00b",), "22021"),
            ("SELECT $1::timestamptz", (datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),), "22000"),
        ):
            with pytest.raises(DataRefused) as raised:
                await conn.fetchval(query, *args)
            assert not raised.value.transient and raised.value.sqlstate == sqlstate
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


async def test_a_lock_timeout_is_transient(dsn):
    holder = await store.connect(dsn)
    waiter = await store.connect(dsn, server_settings={"lock_timeout": "50ms"})
    try:
        async with holder.transaction():
            await holder.execute("LOCK TABLE endpoints IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(TransientStoreError) as raised:
                await waiter.fetchval("SELECT count(*) FROM endpoints")
        assert raised.value.sqlstate == "55P03" and not isinstance(raised.value, DatabaseUnreachable)
    finally:
        await holder.close()
        await waiter.close()


async def test_a_database_without_the_schema_says_so(dsn):
    conn = await store.connect(dsn)
    try:
        await conn.execute("DROP TABLE endpoints CASCADE")
        with pytest.raises(SchemaMissing):
            await store.stored_endpoints(conn, None)
    finally:
        await conn.close()


async def test_a_lost_connection_is_unreachable_and_leaves_the_pool_usable(dsn):
    pool = await store.create_pool(dsn, min_size=1, max_size=1)
    admin = await store.connect(dsn)
    try:
        with pytest.raises(DatabaseUnreachable):
            async with store.acquire(pool) as conn:
                # waits until the backend is gone, so the next statement cannot win the race
                await admin.execute("SELECT pg_terminate_backend($1, 10000)", conn.get_server_pid())
                await conn.fetchval("SELECT 1")
        async with store.acquire(pool) as conn:
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await admin.close()
        await pool.close()


async def test_no_server_is_unreachable_and_a_malformed_url_is_invalid_input():
    with pytest.raises(DatabaseUnreachable):
        await asyncio.wait_for(store.connect("postgresql://postgres@127.0.0.1:1/x", timeout=5), 10)
    with pytest.raises(InvalidInput) as malformed:
        await store.connect("postgresql://postgres:s3cret@127.0.0.1:notaport/x")
    assert malformed.value.field == "HOOKLANE_DATABASE_URL" and "s3cret" not in str(malformed.value)
