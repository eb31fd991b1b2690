"""The event catalogue's check at publish (migration 0024,
docs/catalogue.md): one rule in hooklane_try_publish_v1, so every path
that publishes is held to it: the SQL functions, hooklane.publish on
asyncpg, psycopg and SQLAlchemy, and the HTTP API, single and batched in
a group commit. The validator is jsonschema in PL/Python, on the tests'
real PostgreSQL. The CLI's: tests/processes/test_catalogue_check.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import asyncpg
import psycopg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine

import hooklane
from hooklane import store
from hooklane.api.app import make_app
from hooklane.api.ingest import COMMITTER
from hooklane.api.tokens import TokenSource
from hooklane.errors import CatalogueRefused, InvalidInput
from hooklane.publish import psycopg as with_psycopg
from hooklane.publish import sqlalchemy as with_sqlalchemy
from hooklane.settings import Settings
from hooklane.tokens import Tokens
from testsupport.fixtures import wait_for

ORDER_PAID = {
    "type": "object",
    "properties": {"amount": {"type": "integer"}, "currency": {"enum": ["EUR", "USD"]}},
    "required": ["amount"],
}
GOOD = {"amount": 12, "currency": "EUR"}
BAD = {"amount": "x", "currency": "EUR"}
BAD_MESSAGE = "data.amount: 'x' is not of type 'integer' (schema version 1, rule type)"
TOKEN = "catalogue-token-0123456789"


async def add_type(
    db: asyncpg.Connection,
    name: str,
    *schemas: dict[str, Any],
    archived: bool = False,
    deprecated_since: str | None = None,
) -> None:
    """A type of the catalogue, as `hooklane eventtype apply` writes one,
    with one version per schema (numbered from 1)."""
    await db.execute(
        "INSERT INTO catalogue_types (name, archived, deprecated_since, source) "
        "VALUES ($1, $2, $3::text::date, 'local')",
        name,
        archived,
        deprecated_since,
    )
    for number, schema in enumerate(schemas, 1):
        await db.execute(
            "INSERT INTO catalogue_versions (type, version, schema, example, digest) "
            "VALUES ($1, $2, $3::jsonb, '{}', md5($3::jsonb::text))",
            name,
            number,
            json.dumps(schema),
        )


async def try_publish(db: asyncpg.Connection, type: str, data: dict[str, Any], tenant: str = "acme") -> Any:
    return await db.fetchrow(
        "SELECT * FROM hooklane_try_publish_v1($1, $2, $3::jsonb)", tenant, type, json.dumps(data)
    )


async def refusals(db: asyncpg.Connection) -> list[tuple[str, str, str]]:
    rows = await db.fetch("SELECT tenant, type, reason FROM catalogue_refusals ORDER BY refused_at, type")
    return [(r["tenant"], r["type"], r["reason"]) for r in rows]


async def event(db: asyncpg.Connection, event_id: str) -> Any:
    return await db.fetchrow(
        "SELECT type, schema_version, schema_problem, schema_deprecated FROM events WHERE id = $1", event_id
    )


@pytest.fixture
async def enforced(db: asyncpg.Connection) -> asyncpg.Connection:
    await add_type(db, "order.paid", ORDER_PAID)
    await store.set_catalogue_mode(db, store.DEFAULT_TENANT, "enforce")
    return db


# --------------------------------------------------------------------------
# The rule, through the SQL functions


async def test_off_changes_nothing(db: asyncpg.Connection) -> None:
    await add_type(db, "order.paid", ORDER_PAID)
    for type, data in (("order.paid", BAD), ("order.unknown", GOOD), ("order.paid", GOOD)):
        row = await try_publish(db, type, data)
        assert (row["stored"], row["error_code"]) == (True, None)
        assert tuple(await event(db, row["event_id"])) == (type, None, None, None)
    assert await refusals(db) == []
    # Nothing asked for the validator: a database without PL/Python
    # publishes as before.
    assert not await db.fetchval("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'plpython3u')")


async def test_enforce_refuses_invalid_data_on_every_sql_function(
    enforced: asyncpg.Connection, dsn: str
) -> None:
    db = enforced
    row = await try_publish(db, "order.paid", BAD)
    assert (row["event_id"], row["error_code"], row["error_field"], row["error_message"]) == (
        None,
        "WH422",
        "data",
        BAD_MESSAGE,
    )
    row = await db.fetchrow(
        "SELECT * FROM hooklane_try_publish_v2('acme', 'order.paid', $1)", json.dumps(BAD)
    )
    assert (row["error_code"], row["error_field"], row["error_message"]) == ("WH422", "data", BAD_MESSAGE)
    # An application's own connection, the driver's errors as they come.
    plain = await asyncpg.connect(dsn)
    try:
        for function, data in (("hooklane_publish_v1", "$1::jsonb"), ("hooklane_publish_v2", "$1")):
            with pytest.raises(asyncpg.PostgresError) as raised:
                await plain.fetchval(f"SELECT {function}('acme', 'order.paid', {data})", json.dumps(BAD))
            assert (raised.value.sqlstate, raised.value.column_name) == ("WH422", "data")
            assert str(raised.value) == f"data: {BAD_MESSAGE}"
    finally:
        await plain.close()
    assert await db.fetchval("SELECT count(*) FROM events") == 0
    # The two that answered in their result committed their refusal (the
    # raising ones aborted their statement, and their row with it).
    assert await refusals(db) == [("acme", "order.paid", "schema")] * 2
    row = await try_publish(db, "order.paid", GOOD)
    assert row["stored"]
    assert tuple(await event(db, row["event_id"])) == ("order.paid", 1, None, None)


async def test_the_message_names_the_path_inside_data_and_the_rule(enforced: asyncpg.Connection) -> None:
    db = enforced
    await add_type(
        db,
        "order.shipped",
        {
            "type": "object",
            "properties": {
                "lines": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"odd key": {"maximum": 5}}},
                }
            },
            "required": ["lines"],
        },
    )
    cases = [
        ({}, "data: 'lines' is a required property (schema version 1, rule required)"),
        (
            {"lines": [{"odd key": 1}, {"odd key": 9}]},
            'data.lines[1]["odd key"]: 9 is greater than the maximum of 5 (schema version 1, rule maximum)',
        ),
    ]
    for data, message in cases:
        assert (await try_publish(db, "order.shipped", data))["error_message"] == message


async def test_versions_are_tried_newest_first(enforced: asyncpg.Connection) -> None:
    db = enforced
    v1 = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    v2 = {"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]}
    await add_type(db, "count.changed", v1, v2)
    assert (await event(db, (await try_publish(db, "count.changed", {"n": 1}))["event_id"]))[1] == 1
    assert (await event(db, (await try_publish(db, "count.changed", {"n": "1"}))["event_id"]))[1] == 2
    # Valid under none: the newest version's problem is the one named.
    refused = await try_publish(db, "count.changed", {"n": None})
    assert refused["error_message"] == "data.n: None is not of type 'string' (schema version 2, rule type)"


async def test_unknown_and_archived_types_are_refused(enforced: asyncpg.Connection) -> None:
    db = enforced
    await add_type(db, "order.old", ORDER_PAID, archived=True)
    unknown = await try_publish(db, "order.payed", GOOD)
    assert (unknown["error_code"], unknown["error_field"]) == ("WH422", "type")
    assert unknown["error_message"].startswith("order.payed is not in the event catalogue")
    archived = await try_publish(db, "order.old", GOOD)
    assert (archived["error_code"], archived["error_field"]) == ("WH422", "type")
    assert "archived" in archived["error_message"]
    assert await refusals(db) == [("acme", "order.payed", "unknown"), ("acme", "order.old", "archived")]
    assert await db.fetchval("SELECT count(*) FROM events") == 0


async def test_an_archived_type_is_refused_whatever_the_mode(db: asyncpg.Connection) -> None:
    await add_type(db, "order.old", ORDER_PAID, archived=True)
    for mode in ("off", "warn"):
        await store.set_catalogue_mode(db, store.DEFAULT_TENANT, mode)
        assert (await try_publish(db, "order.old", GOOD))["error_field"] == "type"
    assert await refusals(db) == [("acme", "order.old", "archived")] * 2


async def test_deprecated_types_are_accepted_and_counted(db: asyncpg.Connection) -> None:
    await add_type(db, "order.legacy", ORDER_PAID, deprecated_since="2020-01-01")
    await add_type(db, "order.later", ORDER_PAID, deprecated_since="2999-01-01")
    for mode in ("off", "enforce"):
        await store.set_catalogue_mode(db, store.DEFAULT_TENANT, mode)
        assert (await try_publish(db, "order.legacy", GOOD))["stored"]
        assert (await try_publish(db, "order.later", GOOD))["stored"]
    since = await db.fetchval("SELECT now() - interval '1 hour'")
    counted = await store.event_type_counts(db, since, limit=10)
    # Both unrouted (no endpoint here); only the one past its date counted.
    assert [(c.type, c.deprecated_recent, c.unrouted_recent) for c in counted.counts] == [
        ("order.legacy", 2, 2),
        ("order.later", 0, 2),
    ]
    assert await refusals(db) == []


async def test_warn_stores_and_marks(db: asyncpg.Connection) -> None:
    await add_type(db, "order.paid", ORDER_PAID)
    await store.set_catalogue_mode(db, store.DEFAULT_TENANT, "warn")
    marked = {}
    for type, data in (("order.paid", BAD), ("order.payed", GOOD), ("order.paid", GOOD)):
        row = await try_publish(db, type, data)
        assert (row["stored"], row["error_code"]) == (True, None)
        marked[type, json.dumps(data)] = tuple(await event(db, row["event_id"]))[1:3]
    assert list(marked.values()) == [
        (None, f"data: {BAD_MESSAGE}"),
        (
            None,
            "type: order.payed is not in the event catalogue (hooklane eventtype apply, or a "
            "WebhookEventType resource, adds it)",
        ),
        (1, None),
    ]
    assert await refusals(db) == []
    since = await db.fetchval("SELECT now() - interval '1 hour'")
    counted = await store.event_type_counts(db, since, limit=10)
    assert sorted((c.type, c.warned_recent, c.unrouted_recent) for c in counted.counts) == [
        ("order.paid", 1, 2),
        ("order.payed", 1, 1),
    ]


async def test_refusals_go_after_the_events_retention(db: asyncpg.Connection) -> None:
    await db.execute(
        """INSERT INTO catalogue_refusals (tenant, type, reason, message, refused_at)
           SELECT 'acme', 'order.payed', 'unknown', 'm', now() - make_interval(days => n)
           FROM generate_series(1, 5) n"""
    )
    assert await store.purge_catalogue_refusals(db, 2.5 * 86400, batch=2) == 3
    kept = await db.fetchval("SELECT count(*) FROM catalogue_refusals")
    assert kept == 2


async def test_a_tenant_mode_outranks_the_default(db: asyncpg.Connection) -> None:
    await add_type(db, "order.paid", ORDER_PAID)
    await store.set_catalogue_mode(db, store.DEFAULT_TENANT, "enforce")
    await store.set_catalogue_mode(db, "globex", "off")
    assert (await try_publish(db, "order.paid", BAD, tenant="acme"))["error_field"] == "data"
    assert (await try_publish(db, "order.paid", BAD, tenant="globex"))["stored"]
    assert await store.catalogue_mode_of(db, "globex") == ("off", True)
    assert await store.catalogue_mode_of(db, "acme") == ("enforce", False)
    assert [(m.tenant, m.mode) for m in await store.catalogue_modes(db)] == [
        ("", "enforce"),
        ("globex", "off"),
    ]


async def test_a_schema_changed_after_its_validator_was_cached_is_picked_up(
    enforced: asyncpg.Connection,
) -> None:
    db = enforced
    # The same connection, so the same backend and its cache.
    assert (await try_publish(db, "order.paid", GOOD))["stored"]
    assert (await try_publish(db, "order.paid", BAD))["error_field"] == "data"
    loose = {"type": "object", "properties": {"amount": {"type": ["integer", "string"]}}}
    await db.execute(
        "UPDATE catalogue_versions SET schema = $1::jsonb, digest = md5($1::jsonb::text) "
        "WHERE type = 'order.paid'",
        json.dumps(loose),
    )
    assert (await try_publish(db, "order.paid", BAD))["stored"]
    await db.execute(
        'UPDATE catalogue_versions SET schema = \'{"type": "object", "required": ["z"]}\', '
        'digest = md5(\'{"type": "object", "required": ["z"]}\'::jsonb::text)'
    )
    assert (await try_publish(db, "order.paid", BAD))["error_message"] == (
        "data: 'z' is a required property (schema version 1, rule required)"
    )


async def test_a_reference_outside_the_schema_is_never_fetched(enforced: asyncpg.Connection) -> None:
    db = enforced
    await add_type(
        db,
        "order.linked",
        {
            "$defs": {"amount": {"type": "integer"}},
            "type": "object",
            "properties": {
                "amount": {"$ref": "#/$defs/amount"},
                "file": {"$ref": "file:///etc/passwd"},
            },
        },
    )
    assert (await try_publish(db, "order.linked", {"amount": 1}))["stored"]
    refused = await try_publish(db, "order.linked", {"amount": 1, "file": 1})
    assert refused["error_field"] == "data"
    assert "file:///etc/passwd is outside the schema (not bundled at apply)" in refused["error_message"]
    assert "root:" not in refused["error_message"]


async def test_integers_keep_their_type_through_the_check(enforced: asyncpg.Connection) -> None:
    db = enforced
    # jsonb prints 1.0 as 1.0 and 1e2 as 100: JSON Schema's integer is a
    # number without a fraction, whichever way it was written.
    for amount in ("12", "1e2", "12.0", "18446744073709551615"):
        row = await db.fetchrow(
            "SELECT * FROM hooklane_try_publish_v1('acme', 'order.paid', $1::jsonb)",
            f'{{"amount": {amount}}}',
        )
        assert row["stored"], (amount, row["error_message"])
    refused = await db.fetchrow(
        "SELECT * FROM hooklane_try_publish_v1('acme', 'order.paid', '{\"amount\": 12.5}')"
    )
    assert (
        refused["error_message"] == "data.amount: 12.5 is not of type 'integer' (schema version 1, rule type)"
    )


# --------------------------------------------------------------------------
# Setting a mode


async def test_a_mode_is_checked(db: asyncpg.Connection) -> None:
    with pytest.raises(InvalidInput) as refused:
        await store.set_catalogue_mode(db, store.DEFAULT_TENANT, "strict")
    assert str(refused.value) == "mode: must be one of off, warn, enforce, not 'strict'"


async def test_a_role_that_cannot_create_plpython_is_told_what_to_do(
    db: asyncpg.Connection, dsn: str
) -> None:
    role = f"catalogue_{uuid.uuid4().hex[:8]}"
    await db.execute(f"CREATE ROLE {role} LOGIN")
    try:
        await db.execute(f"GRANT ALL ON catalogue_modes TO {role}")
        conn = await store.connect(dsn.replace("postgres@", f"{role}@"))
        try:
            with pytest.raises(InvalidInput) as refused:
                await store.set_catalogue_mode(conn, store.DEFAULT_TENANT, "enforce")
            # 'off' needs no PL/Python.
            await store.set_catalogue_mode(conn, "acme", "off")
        finally:
            await conn.close()
        assert refused.value.field == "mode"
        assert "needs a PostgreSQL superuser" in refused.value.message
        major = await db.fetchval("SELECT current_setting('server_version_num')::integer / 10000")
        assert f"postgresql-plpython3-{major} and python3-jsonschema" in refused.value.message
        assert [(m.tenant, m.mode) for m in await store.catalogue_modes(db)] == [("acme", "off")]
        # Once a superuser created it, the role may set any mode.
        await store.set_catalogue_mode(db, store.DEFAULT_TENANT, "warn")
        conn = await store.connect(dsn.replace("postgres@", f"{role}@"))
        try:
            await store.set_catalogue_mode(conn, store.DEFAULT_TENANT, "enforce")
        finally:
            await conn.close()
        assert await store.catalogue_mode_of(db, "globex") == ("enforce", False)
    finally:
        await db.execute(f"REVOKE ALL ON catalogue_modes FROM {role}")
        await db.execute(f"DROP ROLE {role}")


async def test_the_validator_is_not_public(enforced: asyncpg.Connection) -> None:
    assert not await enforced.fetchval(
        "SELECT has_function_privilege('public', 'hooklane_catalogue_problem_v1(text, text)', 'EXECUTE')"
    )


# --------------------------------------------------------------------------
# Every Python caller: refused as InvalidInput naming data, the caller's
# transaction going on to commit its own write (and the refusal's row).


def _psycopg(dsn: str, data: dict[str, Any]) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO orders VALUES ('psycopg')")
        with_psycopg.publish(conn, tenant="acme", type="order.paid", data=data)


async def _psycopg_async(dsn: str, data: dict[str, Any]) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute("INSERT INTO orders VALUES ('psycopg-async')")
        await with_psycopg.publish_async(conn, tenant="acme", type="order.paid", data=data)


def _sqlalchemy(dsn: str, data: dict[str, Any]) -> None:
    engine = create_engine(dsn.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO orders VALUES ('sqlalchemy')"))
            with_sqlalchemy.publish(conn, tenant="acme", type="order.paid", data=data)
    finally:
        engine.dispose()


async def _sqlalchemy_async(dsn: str, data: dict[str, Any]) -> None:
    engine = create_async_engine(dsn.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO orders VALUES ('sqlalchemy-async')"))
            await with_sqlalchemy.publish_async(conn, tenant="acme", type="order.paid", data=data)
    finally:
        await engine.dispose()


async def _asyncpg(dsn: str, data: dict[str, Any]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES ('asyncpg')")
            await hooklane.publish(conn, tenant="acme", type="order.paid", data=data)
    finally:
        await conn.close()


@pytest.mark.parametrize("caller", ["asyncpg", "psycopg", "psycopg-async", "sqlalchemy", "sqlalchemy-async"])
async def test_every_python_caller_is_refused(enforced: asyncpg.Connection, dsn: str, caller: str) -> None:
    db = enforced
    await db.execute("CREATE TABLE orders (id text)")

    async def run(data: dict[str, Any]) -> None:
        if caller == "asyncpg":
            await _asyncpg(dsn, data)
        elif caller == "psycopg":
            await asyncio.to_thread(_psycopg, dsn, data)
        elif caller == "psycopg-async":
            await _psycopg_async(dsn, data)
        elif caller == "sqlalchemy":
            await asyncio.to_thread(_sqlalchemy, dsn, data)
        else:
            await _sqlalchemy_async(dsn, data)

    with pytest.raises(CatalogueRefused) as refused:
        await run(BAD)
    assert (refused.value.field, refused.value.message) == ("data", BAD_MESSAGE)
    # The exception left the block: its transaction rolled back, the
    # refusal's row with it, as every write of it.
    assert await db.fetchval("SELECT count(*) FROM orders") == 0
    assert await refusals(db) == []
    await run(GOOD)
    assert await db.fetchval("SELECT count(*) FROM orders") == 1
    assert await db.fetchval("SELECT schema_version FROM events") == 1


async def test_a_caller_that_goes_on_after_a_refusal_commits_its_row(
    enforced: asyncpg.Connection, dsn: str
) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            with pytest.raises(InvalidInput):
                await hooklane.publish(conn, tenant="acme", type="order.paid", data=BAD)
            await hooklane.publish(conn, tenant="acme", type="order.paid", data=GOOD)
    finally:
        await conn.close()
    assert await refusals(enforced) == [("acme", "order.paid", "schema")]
    assert await enforced.fetchval("SELECT count(*) FROM events") == 1


# --------------------------------------------------------------------------
# The HTTP API: the group commit calls the same function


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    cfg = replace(settings, api_pool_size=2)  # one committer
    pool = await store.create_pool(
        cfg.database_url, min_size=0, max_size=cfg.api_pool_size, server_settings=store.API_SESSION
    )
    app = make_app(
        cfg, pool, TokenSource(Tokens.parse(TOKEN, "test"), None, "test"), TokenSource(Tokens(), None, "test")
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client
    await pool.close()


async def post(client: TestClient, path: str, body: Any) -> tuple[int, dict[str, Any]]:  # type: ignore[type-arg]
    async with client.post(path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}) as response:
        return response.status, await response.json()


def paid(event_id: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"id": event_id, "tenant": "acme", "type": "order.paid", "data": data}


async def test_the_api_refuses_an_invalid_event_alone_and_in_a_batch(
    enforced: asyncpg.Connection,
    client: TestClient,  # type: ignore[type-arg]
) -> None:
    db = enforced
    status, answer = await post(client, "/v1/events", paid("bad", BAD))
    assert status == 422
    assert (answer["field"], answer["detail"]) == ("data", BAD_MESSAGE)
    status, answer = await post(client, "/v1/events/batch", {"events": [paid("b-0", GOOD), paid("b-1", BAD)]})
    assert status == 422
    assert (answer["field"], answer["detail"]) == ("events[1].data", BAD_MESSAGE)
    status, answer = await post(client, "/v1/events", {**paid("p", GOOD), "type": "order.payed"})
    assert (status, answer["field"]) == (422, "type")
    assert await db.fetchval("SELECT count(*) FROM events") == 0
    assert await post(client, "/v1/events", paid("good", GOOD)) == (202, {"id": "good"})
    # The single ones refused without a savepoint: their rows committed
    # with the group's transaction; the batch's, undone with its savepoint,
    # were written again after it.
    assert sorted(await refusals(db)) == [
        ("acme", "order.paid", "schema"),
        ("acme", "order.paid", "schema"),
        ("acme", "order.payed", "unknown"),
    ]


async def test_a_refused_event_in_a_group_leaves_the_others_committed(
    enforced: asyncpg.Connection,
    client: TestClient,  # type: ignore[type-arg]
    dsn: str,
) -> None:
    db = enforced
    committer = client.app[COMMITTER]
    lock = await asyncpg.connect(dsn)
    tx = lock.transaction()
    await tx.start()
    await lock.execute("LOCK TABLE events IN EXCLUSIVE MODE")
    try:
        first = asyncio.create_task(post(client, "/v1/events", paid("first", GOOD)))
        await wait_for(lambda: committer.committing == 1)
        sends = [
            asyncio.create_task(post(client, "/v1/events", paid(f"s-{i}", BAD if i == 2 else GOOD)))
            for i in range(5)
        ]
        sends.append(asyncio.create_task(post(client, "/v1/events/batch", {"events": [paid("b", BAD)]})))
        await wait_for(lambda: committer.queued == 6)
    finally:
        await tx.rollback()
        await lock.close()
    assert (await first)[0] == 202
    assert [status for status, _ in await asyncio.gather(*sends)] == [202, 202, 422, 202, 202, 422]
    rows = {r["id"]: r["xact"] for r in await db.fetch("SELECT id, xact FROM events")}
    assert sorted(rows) == ["first", "s-0", "s-1", "s-3", "s-4"]
    assert len({rows[f"s-{i}"] for i in (0, 1, 3, 4)}) == 1


async def test_a_schema_written_around_apply_is_reported_not_raised(enforced: asyncpg.Connection) -> None:
    db = enforced
    # `hooklane eventtype apply` and the operator refuse such a schema; a
    # row written by hand still gets an answer, not a traceback.
    await add_type(db, "order.odd", {"type": "decimal"})
    refused = await try_publish(db, "order.odd", GOOD)
    assert (refused["error_code"], refused["error_field"]) == ("WH422", "data")
    assert refused["error_message"].startswith("data: the schema is not a valid JSON Schema: ")
    assert refused["error_message"].endswith("(schema version 1, rule schema)")
