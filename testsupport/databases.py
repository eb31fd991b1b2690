"""Databases of their own on a PostgreSQL server, for tests and benchmarks
that run workers on a server they share (bench/, testsupport/chaos.py),
and the plans of every statement a block runs."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from hooklane import store


def _with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


async def create_database(server_dsn: str, label: str, *, durable: bool = False, migrate: bool = True) -> str:
    """A new, migrated database on the server; returns its DSN.

    ``durable``: every session on it commits with synchronous_commit on,
    whatever the server's command line says (a per-database setting outranks
    it). A throwaway LocalPostgres runs with it off, under which an immediate
    shutdown forgets commits it already acknowledged: a run that crashes the
    server on purpose and counts what survived needs it on.

    ``migrate``: False leaves it empty."""
    name = f"bench_{label.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        if durable:
            await admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
    finally:
        await admin.close()
    dsn = _with_database(server_dsn, name)
    if not migrate:
        return dsn
    conn = await asyncpg.connect(dsn)
    try:
        await store.migrate(conn)
    finally:
        await conn.close()
    return dsn


async def drop_database(server_dsn: str, dsn: str) -> None:
    """Drop a database create_database made (FORCE, because a killed worker
    may still hold a connection)."""
    name = urlsplit(dsn).path.lstrip("/")
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


# Every statement's plan, those inside functions too, sent to the client as
# JSON notices (auto_explain) for the rest of the transaction.
_EXPLAIN_NESTED = (
    "LOAD 'auto_explain'; SET LOCAL auto_explain.log_min_duration = 0;"
    " SET LOCAL auto_explain.log_nested_statements = on; SET LOCAL auto_explain.log_analyze = on;"
    " SET LOCAL auto_explain.log_timing = off; SET LOCAL auto_explain.log_format = json;"
    " SET LOCAL auto_explain.log_level = notice; SET LOCAL client_min_messages = notice"
)


async def nested_plans(conn: asyncpg.Connection, run: Callable[[], Awaitable[object]]) -> list[dict]:
    """The EXPLAIN ANALYZE plans (JSON, the "Plan" of each) of every statement
    ``run`` makes on ``conn``, those inside functions included, where EXPLAIN
    of a function call shows one node. ``run`` is committed."""
    plans: list[dict] = []

    def heard(_conn: object, message: asyncpg.PostgresLogMessage) -> None:
        plans.append(json.loads(message.message.partition("\n")[2])["Plan"])

    conn.add_log_listener(heard)
    try:
        async with conn.transaction():
            await conn.execute(_EXPLAIN_NESTED)
            await run()
    finally:
        conn.remove_log_listener(heard)
    return plans
