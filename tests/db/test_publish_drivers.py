"""Publishing inside the application's own transaction from every Python
caller (hooklane/publish/): asyncpg, psycopg 3 and SQLAlchemy, sync and
async. Each commits an order with its event (delivered, signed), rolls one
back (nothing stored, nothing sent), and is refused twice, by the check
before any SQL and by the publish function (an id reused with other
content), its transaction going on to commit the order all the same."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import django
import psycopg
import pytest
from django.conf import settings
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane.errors import EventConflict, InvalidInput
from hooklane.publish import psycopg as with_psycopg
from hooklane.publish import sqlalchemy as with_sqlalchemy
from testsupport.fixtures import SECRET, add_endpoint, wait_for
from testsupport.publish import ordered_deliveries, queued_in_order
from testsupport.receivers import Answer

ORDER = "INSERT INTO orders (id) VALUES ('{}')"

# Django wants its settings once a process; each test adds its database.
if not settings.configured:
    settings.configure(DATABASES={}, USE_TZ=True)
    django.setup()


@dataclass
class Transaction:
    """What one application transaction does: orders inserted and events
    published in turn, then COMMIT (or ROLLBACK). The refusals each publish
    raised are kept, in order."""

    steps: list[tuple[str, Any]]
    commit: bool = True
    refused: list[type[InvalidInput]] = field(default_factory=list)

    def event(self, publish: Callable[..., object], args: dict[str, Any]) -> None:
        try:
            publish(**args)
        except InvalidInput as exc:
            self.refused.append(type(exc))

    async def event_async(self, publish: Callable[..., Awaitable[object]], args: dict[str, Any]) -> None:
        try:
            await publish(**args)
        except InvalidInput as exc:
            self.refused.append(type(exc))


def psycopg_sync(dsn: str, tx: Transaction) -> None:
    with psycopg.connect(dsn) as conn:
        for kind, arg in tx.steps:
            if kind == "order":
                conn.execute(ORDER.format(arg))
            else:
                tx.event(lambda **a: with_psycopg.publish(conn, **a), arg)
        if not tx.commit:
            conn.rollback()


async def psycopg_async(dsn: str, tx: Transaction) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for kind, arg in tx.steps:
            if kind == "order":
                await conn.execute(ORDER.format(arg))
            else:
                await tx.event_async(lambda **a: with_psycopg.publish_async(conn, **a), arg)
        if not tx.commit:
            await conn.rollback()


def sqlalchemy_connection(dsn: str, tx: Transaction) -> None:
    engine = create_engine(dsn.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            for kind, arg in tx.steps:
                if kind == "order":
                    conn.execute(text(ORDER.format(arg)))
                else:
                    tx.event(lambda **a: with_sqlalchemy.publish(conn, **a), arg)
            conn.commit() if tx.commit else conn.rollback()
    finally:
        engine.dispose()


def sqlalchemy_session(dsn: str, tx: Transaction) -> None:
    engine = create_engine(dsn.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with Session(engine) as session:
            for kind, arg in tx.steps:
                if kind == "order":
                    session.execute(text(ORDER.format(arg)))
                else:
                    tx.event(lambda **a: with_sqlalchemy.publish(session, **a), arg)
            session.commit() if tx.commit else session.rollback()
    finally:
        engine.dispose()


async def sqlalchemy_async_connection(dsn: str, tx: Transaction) -> None:
    # asyncpg under SQLAlchemy: the caller is the same whatever the driver.
    engine = create_async_engine(dsn.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with engine.connect() as conn:
            for kind, arg in tx.steps:
                if kind == "order":
                    await conn.execute(text(ORDER.format(arg)))
                else:
                    await tx.event_async(lambda **a: with_sqlalchemy.publish_async(conn, **a), arg)
            await (conn.commit() if tx.commit else conn.rollback())
    finally:
        await engine.dispose()


async def sqlalchemy_async_session(dsn: str, tx: Transaction) -> None:
    engine = create_async_engine(dsn.replace("postgresql://", "postgresql+psycopg://"))
    try:
        async with AsyncSession(engine) as session:
            for kind, arg in tx.steps:
                if kind == "order":
                    await session.execute(text(ORDER.format(arg)))
                else:
                    await tx.event_async(lambda **a: with_sqlalchemy.publish_async(session, **a), arg)
            await (session.commit() if tx.commit else session.rollback())
    finally:
        await engine.dispose()


async def asyncpg_connection(dsn: str, tx: Transaction) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        transaction = conn.transaction()
        await transaction.start()
        for kind, arg in tx.steps:
            if kind == "order":
                await conn.execute(ORDER.format(arg))
            else:
                await tx.event_async(lambda **a: hooklane.publish(conn, **a), arg)
        await (transaction.commit() if tx.commit else transaction.rollback())
    finally:
        await conn.close()


def django_atomic(dsn: str, tx: Transaction) -> None:
    """Django's own transaction (``atomic``) on a database it is configured
    with, its psycopg 3 connection handed to the caller."""
    from django.db import connections, transaction

    alias = f"publish_{uuid.uuid4().hex}"
    parts = urlsplit(dsn)
    connections.settings[alias] = connections.configure_settings(
        {
            "default": {"ENGINE": "django.db.backends.dummy"},
            alias: {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": parts.path.lstrip("/"),
                "USER": parts.username,
                "HOST": parts.hostname,
                "PORT": parts.port,
            },
        }
    )[alias]
    try:
        with transaction.atomic(using=alias):
            with connections[alias].cursor() as cursor:
                for kind, arg in tx.steps:
                    if kind == "order":
                        cursor.execute(ORDER.format(arg))
                    else:
                        tx.event(lambda **a: with_psycopg.publish(connections[alias].connection, **a), arg)
            if not tx.commit:
                transaction.set_rollback(True, using=alias)
    finally:
        connections[alias].close()


CALLERS = {
    "asyncpg": asyncpg_connection,
    "psycopg": psycopg_sync,
    "psycopg-async": psycopg_async,
    "django": django_atomic,
    "sqlalchemy-connection": sqlalchemy_connection,
    "sqlalchemy-session": sqlalchemy_session,
    "sqlalchemy-async-connection": sqlalchemy_async_connection,
    "sqlalchemy-async-session": sqlalchemy_async_session,
}


def created(order: str, **more: Any) -> tuple[str, dict[str, Any]]:
    return ("publish", {"tenant": "acme", "type": "order.created", "data": {"order": order}, **more})


@pytest.mark.parametrize("caller", CALLERS)
async def test_each_caller_publishes_inside_its_own_transaction(db, dsn, receiver, start_worker, caller):
    await db.execute("CREATE TABLE orders (id text PRIMARY KEY)")
    await add_endpoint(db, "orders", receiver.on("orders", Answer(204)))

    async def run(tx: Transaction) -> Transaction:
        call = CALLERS[caller]
        if asyncio.iscoroutinefunction(call):
            await call(dsn, tx)
        else:
            await asyncio.to_thread(call, dsn, tx)
        return tx

    committed = await run(Transaction([("order", "o-1"), created("o-1", id="order-o-1")]))
    rolled_back = await run(Transaction([("order", "o-2"), created("o-2", id="order-o-2")], commit=False))
    refused = await run(
        Transaction(
            [
                ("order", "o-3"),
                # Refused before any SQL: no JSON has NaN.
                created("o-3", data={"total": float("nan")}),
                # Refused by the function: the id names another event.
                created("o-3", id="order-o-1"),
                ("order", "o-4"),
            ]
        )
    )
    assert committed.refused == rolled_back.refused == []
    assert refused.refused == [InvalidInput, EventConflict]
    assert [r["id"] for r in await db.fetch("SELECT id FROM orders ORDER BY id")] == ["o-1", "o-3", "o-4"]
    assert [r["id"] for r in await db.fetch("SELECT id FROM events")] == ["order-o-1"]

    start_worker()
    await wait_for(lambda: db.fetchval("SELECT bool_and(state = 'delivered') FROM deliveries"))
    got = receiver.at("orders")
    assert len(got) == 1
    payload = Webhook(SECRET).verify(got[0].body, got[0].headers)
    assert (payload["id"], payload["data"]) == ("order-o-1", {"order": "o-1"})


@pytest.mark.parametrize("caller", CALLERS)
async def test_each_caller_publishes_with_an_ordering_key(db, dsn, caller):
    """The key numbers the deliveries in commit order, only the head due;
    a bad key is refused before any SQL, and an id published again under
    another key by the function, the transaction going on either way."""
    await db.execute("CREATE TABLE orders (id text PRIMARY KEY)")
    await add_endpoint(db, "orders", "http://127.0.0.1:1/orders")

    async def run(tx: Transaction) -> Transaction:
        call = CALLERS[caller]
        if asyncio.iscoroutinefunction(call):
            await call(dsn, tx)
        else:
            await asyncio.to_thread(call, dsn, tx)
        return tx

    for n in range(3):
        tx = await run(Transaction([("order", f"o-{n}"), created(f"o-{n}", id=f"e-{n}", ordering_key="o")]))
        assert tx.refused == []
    refused = await run(
        Transaction(
            [
                ("order", "o-3"),
                created("o-3", id="e-3", ordering_key="o\n"),
                created("o-3", id="e-0", ordering_key="other"),
                ("order", "o-4"),
            ]
        )
    )
    assert refused.refused == [InvalidInput, EventConflict]
    assert await db.fetchval("SELECT count(*) FROM orders") == 5
    rows = await db.fetch("SELECT id, ordering_key FROM events ORDER BY id")
    assert [tuple(r) for r in rows] == [("e-0", "o"), ("e-1", "o"), ("e-2", "o")]
    assert await ordered_deliveries(db, "o") == {"orders": queued_in_order(["e-0", "e-1", "e-2"])}
