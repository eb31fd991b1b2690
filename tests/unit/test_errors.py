"""One error vocabulary at the store boundary: which driver errors are
transient, and that the store's connections raise Hooklane's types only."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import asyncpg
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
from hooklane.operator.handlers import RETRY_DELAY_SECONDS, kopf_error
from hooklane.store.connection import store_error

exc = asyncpg.exceptions


@pytest.mark.parametrize(
    ("driver", "kind"),
    [
        (exc.CheckViolationError("new row violates check constraint"), StoreError),
        (exc.UniqueViolationError("duplicate key value"), StoreError),
        # a data exception (SQLSTATE class 22): the caller's value, never an outage
        (exc.DivisionByZeroError("division by zero"), DataRefused),
        (exc.DatetimeFieldOverflowError("date/time field value out of range"), DataRefused),
        (exc.CharacterNotInRepertoireError('invalid byte sequence for encoding "UTF8": 0x00'), DataRefused),
        (exc.DataError("invalid input syntax"), DataRefused),
        # refused by asyncpg before sending: an InterfaceError, but no lost connection
        (exc._base.DataError("invalid input for query argument $1: (date value out of range)"), DataRefused),
        (exc.DeadlockDetectedError("deadlock detected"), TransientStoreError),
        (exc.SerializationError("could not serialize access"), TransientStoreError),
        (exc.LockNotAvailableError("canceling statement due to lock timeout"), TransientStoreError),
        (exc.UndefinedTableError('relation "endpoints" does not exist'), SchemaMissing),
        (exc.ConnectionDoesNotExistError("connection was closed"), DatabaseUnreachable),
        (exc.AdminShutdownError("terminating connection"), DatabaseUnreachable),
        (exc.InternalClientError("cannot switch to state 15"), DatabaseUnreachable),
        (asyncpg.InterfaceError("the pool is closing"), DatabaseUnreachable),
        (ConnectionRefusedError(111, "Connection refused"), DatabaseUnreachable),
        (TimeoutError(), DatabaseUnreachable),
    ],
)
def test_driver_errors_become_one_kind_each(driver, kind):
    error = store_error(driver)
    assert type(error) is kind
    assert error.transient == issubclass(kind, TransientStoreError)
    assert str(error) == (str(driver) or type(driver).__name__)


def test_postgres_errors_keep_their_sqlstate():
    assert store_error(exc.CheckViolationError("x")).sqlstate == "23514"
    assert store_error(exc.DeadlockDetectedError("x")).sqlstate == "40P01"
    assert store_error(OSError("x")).sqlstate is None


def test_any_failure_to_connect_is_unreachable():
    for driver in (
        exc.InvalidPasswordError("password authentication failed"),
        exc.InvalidCatalogNameError("x"),
    ):
        assert store_error(driver) is not None and not store_error(driver).transient
        assert type(store_error(driver, connecting=True)) is DatabaseUnreachable


def test_other_errors_are_not_the_stores():
    for other in (ValueError("x"), RuntimeError("x"), InvalidInput("id", "x"), DatabaseUnreachable("x")):
        assert store_error(other) is None


def test_error_text_from_the_server_cannot_move_a_cursor():
    assert str(store_error(exc.CheckViolationError("bad \x1b[2J row"))) == "bad \\x1b[2J row"


def test_the_operator_retries_transient_errors_only():
    retried = kopf_error(DatabaseUnreachable("connection refused"))
    assert isinstance(retried, kopf.TemporaryError) and retried.delay == RETRY_DELAY_SECONDS
    assert isinstance(kopf_error(TransientStoreError("deadlock detected", "40P01")), kopf.TemporaryError)
    assert isinstance(kopf_error(SchemaMissing("no table")), kopf.TemporaryError)
    refused = kopf_error(StoreError("new row violates check constraint", "23514"))
    assert isinstance(refused, kopf.PermanentError) and "violates check constraint" in str(refused)


# --- real Postgres ------------------------------------------------------------


@pytest.mark.db
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


@pytest.mark.db
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


@pytest.mark.db
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


@pytest.mark.db
async def test_a_database_without_the_schema_says_so(dsn):
    conn = await store.connect(dsn)
    try:
        await conn.execute("DROP TABLE endpoints CASCADE")
        with pytest.raises(SchemaMissing):
            await store.stored_endpoints(conn, None)
    finally:
        await conn.close()


@pytest.mark.db
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


@pytest.mark.db
async def test_no_server_is_unreachable_and_a_malformed_url_is_invalid_input():
    with pytest.raises(DatabaseUnreachable):
        await asyncio.wait_for(store.connect("postgresql://postgres@127.0.0.1:1/x", timeout=5), 10)
    with pytest.raises(InvalidInput) as malformed:
        await store.connect("postgresql://postgres:s3cret@127.0.0.1:notaport/x")
    assert malformed.value.field == "HOOKLANE_DATABASE_URL" and "s3cret" not in str(malformed.value)
