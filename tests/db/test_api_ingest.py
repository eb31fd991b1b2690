"""Publishing over HTTP (``POST /v1/events``, ``/v1/events/batch``): real
Postgres, real HTTP on loopback. The real ``hooklane api`` process, end to
end: tests/processes/test_api_ingest.py."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from importlib import resources
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from openapi_schema_validator import OAS31Validator
from prometheus_client import REGISTRY

from hooklane import store
from hooklane.api import ingest
from hooklane.api.app import make_app
from hooklane.api.group_commit import (
    RETRY_PAUSE_CAP_SECONDS,
    RETRY_PAUSE_SECONDS,
    GroupCommitter,
    _Unit,
    retry_pause,
    take,
)
from hooklane.api.ingest import COMMITTER
from hooklane.api.tokens import TokenSource
from hooklane.dev.postgres import free_port
from hooklane.errors import OutcomeUnknown, TransientStoreError
from hooklane.settings import Settings
from hooklane.store import Event
from hooklane.tokens import Tokens
from testsupport.api_ingest import AUTH, EVENT, TOKEN, event
from testsupport.fixtures import add_endpoint, wait_for
from testsupport.publish import ordered_deliveries, queued_in_order

ACME_ONLY = "acme-only-token-0123456789"

Client = TestClient  # type: ignore[type-arg]
MakeClient = Callable[..., Awaitable[TestClient]]  # type: ignore[type-arg]


@pytest.fixture
async def make_client(settings: Settings) -> AsyncIterator[MakeClient]:
    """``await make_client(**settings overrides)``: a client of a real API
    server on loopback, on the test's database (or the overrides' one)."""
    opened: list[tuple[TestClient, asyncpg.Pool]] = []  # type: ignore[type-arg]

    async def make(**overrides: Any) -> TestClient:  # type: ignore[type-arg]
        cfg = replace(settings, **{"api_ack_timeout_seconds": 2.0, "api_max_body_bytes": 65536, **overrides})
        pool = await store.create_pool(
            cfg.database_url, min_size=0, max_size=cfg.api_pool_size, server_settings=store.API_SESSION
        )
        tokens = TokenSource(Tokens.parse(f"{TOKEN}\n{ACME_ONLY} tenants=acme", "test"), None, "test")
        app = make_app(cfg, pool, tokens, TokenSource(Tokens(), None, "test"))
        client = TestClient(TestServer(app))
        await client.start_server()
        opened.append((client, pool))
        return client

    yield make
    for client, pool in opened:
        await client.close()
        await pool.close()


@pytest.fixture
async def client(make_client: MakeClient) -> TestClient:  # type: ignore[type-arg]
    return await make_client()


async def post(client: TestClient, path: str, body: Any, **kwargs: Any) -> tuple[int, dict]:  # type: ignore[type-arg]
    headers = {**AUTH, **kwargs.pop("headers", {})}
    async with client.post(path, json=body, headers=headers, **kwargs) as response:
        return response.status, await response.json()


async def stored(db: asyncpg.Connection) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT id, tenant, type, data::text AS data, fanout, xact FROM events ORDER BY id, tenant"
    )


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    value = REGISTRY.get_sample_value(name, labels or {})
    return value or 0.0


# --------------------------------------------------------------------------
# Accepting


async def test_one_event_is_committed_with_its_deliveries_before_202(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    await add_endpoint(db, "orders", "http://127.0.0.1:9/hook")
    accepted = sample("hooklane_api_events_accepted_total")
    acks = sample("hooklane_api_ack_seconds_count")

    status, body = await post(client, "/v1/events", EVENT)

    assert status == 202
    assert body["id"].startswith("msg_")
    [row] = await stored(db)
    assert (row["id"], row["tenant"], row["type"], json.loads(row["data"])) == (
        body["id"],
        "acme",
        "order.created",
        {"order": 1},
    )
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE event_id = $1", body["id"]) == 1
    assert sample("hooklane_api_events_accepted_total") == accepted + 1
    assert sample("hooklane_api_ack_seconds_count") == acks + 1


async def test_an_event_matching_no_endpoint_is_stored_and_accepted(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    status, body = await post(client, "/v1/events", {**EVENT, "tenant": "nobody"})
    assert status == 202
    [row] = await stored(db)
    assert (row["id"], row["fanout"]) == (body["id"], 0)


async def test_the_same_id_twice_is_stored_once_and_answered_the_same(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    event = {**EVENT, "id": "order-1", "coalesce_key": "order-1"}
    first = await post(client, "/v1/events", event)
    again = await post(client, "/v1/events", event)
    assert first == again == (202, {"id": "order-1"})
    assert [r["id"] for r in await stored(db)] == ["order-1"]


async def test_the_same_id_with_other_content_is_a_conflict(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    refused = sample("hooklane_api_events_refused_total", {"reason": "conflict"})
    assert (await post(client, "/v1/events", {**EVENT, "id": "order-1"}))[0] == 202

    status, body = await post(client, "/v1/events", {**EVENT, "id": "order-1", "data": {"order": 2}})

    assert status == 409
    assert (body["error"], body["field"]) == ("conflict", "id")
    [row] = await stored(db)
    assert json.loads(row["data"]) == {"order": 1}
    assert sample("hooklane_api_events_refused_total", {"reason": "conflict"}) == refused + 1


# --------------------------------------------------------------------------
# Refusing: each case answers JSON naming the problem and stores nothing


def _deep(levels: int) -> bytes:
    return b'{"type":"a.b","tenant":"acme","data":{"x":' + b"[" * levels + b"]" * levels + b"}}"


BAD_BODIES = [
    # (name, content type, body, status, error, field)
    ("not json type", "text/plain", json.dumps(EVENT).encode(), 415, "unsupported_media_type", None),
    (
        "latin-1",
        "application/json; charset=latin-1",
        json.dumps(EVENT).encode(),
        415,
        "unsupported_media_type",
        None,
    ),
    (
        "not utf-8",
        "application/json",
        b'{"type":"a.b","tenant":"acme","data":{"x":"\xff"}}',
        400,
        "malformed",
        None,
    ),
    ("utf-16", "application/json", json.dumps(EVENT).encode("utf-16"), 400, "malformed", None),
    ("truncated", "application/json", b'{"type":"a.b",', 400, "malformed", None),
    ("NaN", "application/json", b'{"type":"a.b","tenant":"acme","data":{"x":NaN}}', 400, "malformed", None),
    (
        "Infinity",
        "application/json",
        b'{"type":"a.b","tenant":"acme","data":{"x":-Infinity}}',
        400,
        "malformed",
        None,
    ),
    (
        "duplicate key",
        "application/json",
        b'{"type":"a.b","type":"c.d","tenant":"acme","data":{}}',
        400,
        "malformed",
        None,
    ),
    (
        "huge integer",
        "application/json",
        b'{"type":"a.b","tenant":"acme","data":{"x":' + b"9" * 4000 + b"}}",
        422,
        "invalid",
        "data",
    ),
    (
        "too many digits",
        "application/json",
        b'{"type":"a.b","tenant":"acme","data":{"x":' + b"9" * 4400 + b"}}",
        400,
        "malformed",
        None,
    ),
    ("deep nesting", "application/json", _deep(100), 422, "invalid", "data"),
    ("deeper than the parser", "application/json", b"[" * 4000, 400, "malformed", None),
    ("array", "application/json", b"[]", 400, "malformed", None),
    ("string", "application/json", b'"x"', 400, "malformed", None),
    ("missing type", "application/json", b'{"tenant":"acme","data":{}}', 422, "invalid", "type"),
    ("missing data", "application/json", b'{"type":"a.b","tenant":"acme"}', 422, "invalid", "data"),
    (
        "bad type",
        "application/json",
        b'{"type":"Order Created","tenant":"acme","data":{}}',
        422,
        "invalid",
        "type",
    ),
    ("bad tenant", "application/json", b'{"type":"a.b","tenant":"","data":{}}', 422, "invalid", "tenant"),
    (
        "data not object",
        "application/json",
        b'{"type":"a.b","tenant":"acme","data":[1]}',
        422,
        "invalid",
        "data",
    ),
    (
        "id wrong type",
        "application/json",
        b'{"type":"a.b","tenant":"acme","data":{},"id":7}',
        422,
        "invalid",
        "id",
    ),
    (
        "unknown field",
        "application/json",
        b'{"type":"a.b","tenant":"acme","data":{},"when":1}',
        422,
        "invalid",
        "when",
    ),
    (
        "lone surrogate",
        "application/json",
        b'{"type":"a.b","tenant":"acme","data":{"x":"\\ud800"}}',
        422,
        "invalid",
        "data",
    ),
    (
        "NUL",
        "application/json",
        b'{"type":"a.b","tenant":"acme","data":{"x":"\\u0000"}}',
        422,
        "invalid",
        "data",
    ),
]


@pytest.mark.parametrize(
    ("content_type", "raw", "status", "error", "field"),
    [case[1:] for case in BAD_BODIES],
    ids=[case[0] for case in BAD_BODIES],
)
async def test_bad_input_is_refused_with_json_naming_it_and_nothing_is_stored(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
    content_type: str,
    raw: bytes,
    status: int,
    error: str,
    field: str | None,
) -> None:
    headers = {**AUTH, "Content-Type": content_type}
    async with client.post("/v1/events", data=raw, headers=headers) as response:
        assert response.status == status, await response.text()
        assert response.content_type == "application/json"
        body = await response.json()
    assert body["error"] == error
    assert body.get("field") == field
    assert await stored(db) == []


async def test_a_body_announced_too_large_is_refused_before_it_is_read(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    # Headers only: a server that waited for the body would never answer.
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 1000000000\r\n\r\n".encode()
    )
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), timeout=10)
    writer.close()
    assert status_line.split()[1] == b"413"


async def test_a_body_trickling_in_is_refused(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ingest, "READ_TIMEOUT_SECONDS", 0.5)
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n".encode()
        + b'{"type":'
    )
    await writer.drain()
    answer = b""
    while not answer.endswith(b"}"):
        chunk = await asyncio.wait_for(reader.read(4096), timeout=10)
        assert chunk, answer
        answer += chunk
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split()[1] == b"408"
    assert json.loads(body)["error"] == "timeout"
    assert await stored(db) == []


async def test_a_chunked_body_growing_past_the_limit_is_refused(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"type":"a.b","tenant":"acme","data":{"x":"'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}}'

    refused = sample("hooklane_api_events_refused_total", {"reason": "too_large"})
    headers = {**AUTH, "Content-Type": "application/json"}
    async with client.post("/v1/events", data=chunks(), headers=headers) as response:
        assert response.status == 413
        assert (await response.json())["error"] == "too_large"
    assert await stored(db) == []
    assert sample("hooklane_api_events_refused_total", {"reason": "too_large"}) == refused + 1


async def test_a_token_limited_to_tenants_may_not_publish_for_another(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    limited = {"Authorization": f"Bearer {ACME_ONLY}"}
    assert (await post(client, "/v1/events", EVENT, headers=limited))[0] == 202
    status, body = await post(client, "/v1/events", {**EVENT, "tenant": "globex"}, headers=limited)
    assert status == 403
    assert (body["error"], body["field"]) == ("forbidden", "tenant")
    assert [r["tenant"] for r in await stored(db)] == ["acme"]


# --------------------------------------------------------------------------
# Batches


def batch(n: int, **extra: Any) -> dict:
    return {"events": [{**EVENT, "id": f"b-{i}", "data": {"n": i}, **extra} for i in range(n)]}


async def test_a_batch_is_committed_in_one_transaction_and_answers_its_ids_in_order(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    events = batch(5)["events"]
    events.insert(2, {**EVENT, "data": {"generated": True}})
    status, body = await post(client, "/v1/events/batch", {"events": events})
    assert status == 202
    assert body["ids"][:2] == ["b-0", "b-1"] and body["ids"][3:] == ["b-2", "b-3", "b-4"]
    assert body["ids"][2].startswith("msg_")
    rows = await stored(db)
    assert sorted(r["id"] for r in rows) == sorted(body["ids"])
    assert len({r["xact"] for r in rows}) == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"events": []}, "events"),
        ({"events": batch(101)["events"]}, "events"),
        ({"events": {"type": "a.b"}}, "events"),
        ({}, "events"),
        ({**batch(2), "more": 1}, "more"),
        ({"events": [*batch(3)["events"], {**EVENT, "type": "Bad Type"}]}, "events[3].type"),
        ({"events": [*batch(1)["events"], 7]}, "events[1]"),
        ({"events": [*batch(2)["events"], {**EVENT, "extra": 1}]}, "events[2].extra"),
    ],
)
async def test_a_batch_with_a_bad_event_is_refused_whole(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
    body: dict,
    field: str,
) -> None:
    status, answer = await post(client, "/v1/events/batch", body)
    assert status == 422
    assert (answer["error"], answer["field"]) == ("invalid", field)
    assert await stored(db) == []


async def test_a_batch_with_a_forbidden_tenant_is_refused_whole(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    events = [*batch(2)["events"], {**EVENT, "tenant": "globex"}]
    status, answer = await post(
        client, "/v1/events/batch", {"events": events}, headers={"Authorization": f"Bearer {ACME_ONLY}"}
    )
    assert (status, answer["field"]) == (403, "events[2].tenant")
    assert await stored(db) == []


async def test_a_batch_with_a_conflict_stores_nothing_and_names_its_index(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    assert (await post(client, "/v1/events", {**EVENT, "id": "b-2"}))[0] == 202
    status, answer = await post(client, "/v1/events/batch", batch(4))
    assert (status, answer["error"], answer["field"]) == (409, "conflict", "events[2].id")
    assert [r["id"] for r in await stored(db)] == ["b-2"]


async def test_duplicate_ids_inside_one_batch(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    same = {**EVENT, "id": "twice"}
    assert await post(client, "/v1/events/batch", {"events": [same, same]}) == (202, {"ids": ["twice"] * 2})
    status, answer = await post(
        client,
        "/v1/events/batch",
        {"events": [{**same, "id": "x"}, {**same, "id": "x", "data": {"other": 1}}]},
    )
    assert (status, answer["field"]) == (409, "events[1].id")
    assert [r["id"] for r in await stored(db)] == ["twice"]


async def test_an_ordering_key_numbers_the_deliveries_in_the_order_accepted(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    """Single events in the order their 202s came; a batch's in the batch's
    order, whatever order its ids sort in."""
    await add_endpoint(db, "orders", "http://127.0.0.1:1/orders")
    for event_id in ("s-2", "s-1"):
        assert await post(client, "/v1/events", {**EVENT, "id": event_id, "ordering_key": "order-7"}) == (
            202,
            {"id": event_id},
        )
    events = [{**EVENT, "id": f"b-{n}", "ordering_key": "order-7"} for n in (3, 2, 1)]
    events.insert(1, {**EVENT, "id": "b-other", "ordering_key": "order-8"})
    events.insert(2, {**EVENT, "id": "b-none"})
    assert (await post(client, "/v1/events/batch", {"events": events}))[0] == 202
    assert await ordered_deliveries(db, "order-7") == {
        "orders": queued_in_order(["s-2", "s-1", "b-3", "b-2", "b-1"])
    }
    assert await ordered_deliveries(db, "order-8") == {"orders": queued_in_order(["b-other"])}
    keys = {r["id"]: r["ordering_key"] for r in await db.fetch("SELECT id, ordering_key FROM events")}
    assert keys == {
        **dict.fromkeys(["s-1", "s-2", "b-1", "b-2", "b-3"], "order-7"),
        "b-other": "order-8",
        "b-none": None,
    }


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)"),
        ("k" * 256, "must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)"),
        (7, "must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)"),
        ("order\n7", "must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)"),
        ("ordre-é", "must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)"),
    ],
)
async def test_a_bad_ordering_key_is_refused_naming_it(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
    key: Any,
    message: str,
) -> None:
    status, answer = await post(client, "/v1/events", {**EVENT, "ordering_key": key})
    assert (status, answer["error"], answer["field"]) == (422, "invalid", "ordering_key")
    assert message in answer["detail"], answer
    events = [{**EVENT, "ordering_key": "k"}, {**EVENT, "ordering_key": key}]
    status, answer = await post(client, "/v1/events/batch", {"events": events})
    assert (status, answer["field"]) == (422, "events[1].ordering_key")
    assert await stored(db) == []


async def test_an_id_published_again_under_another_ordering_key_is_a_conflict(
    client: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    keyed = {**EVENT, "id": "order-1", "ordering_key": "order-1"}
    assert await post(client, "/v1/events", keyed) == (202, {"id": "order-1"})
    assert await post(client, "/v1/events", keyed) == (202, {"id": "order-1"})
    for other in ({**keyed, "ordering_key": "order-2"}, {**EVENT, "id": "order-1"}):
        status, answer = await post(client, "/v1/events", other)
        assert (status, answer["error"], answer["field"]) == (409, "conflict", "id")
    status, answer = await post(
        client, "/v1/events/batch", {"events": [{**keyed, "id": "x"}, {**keyed, "ordering_key": "o"}]}
    )
    assert (status, answer["field"]) == (409, "events[1].id")
    assert [r["id"] for r in await stored(db)] == ["order-1"]


# --------------------------------------------------------------------------
# Group commit


async def lock_events(dsn: str) -> tuple[asyncpg.Connection, asyncpg.transaction.Transaction]:
    """Hold every publish up: inserting an event waits for this lock."""
    conn = await asyncpg.connect(dsn)
    tx = conn.transaction()
    await tx.start()
    await conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")
    return conn, tx


async def test_concurrent_requests_share_transactions(
    make_client: MakeClient, dsn: str, db: asyncpg.Connection
) -> None:
    client = await make_client(api_pool_size=4)  # three committers
    committer: GroupCommitter = client.app[COMMITTER]
    lock, tx = await lock_events(dsn)
    requests = 40
    sends = [
        asyncio.create_task(post(client, "/v1/events", {**EVENT, "id": f"e-{i}"})) for i in range(requests)
    ]
    await wait_for(lambda: committer.queued + committer.committing == requests)
    await tx.rollback()
    await lock.close()

    answers = await asyncio.gather(*sends)

    assert [status for status, _ in answers] == [202] * requests
    transactions = len({r["xact"] for r in await stored(db)})
    # Three transactions waited on the lock; whatever queued behind them
    # goes in one transaction per committer at most.
    assert transactions <= 6 < requests


async def test_a_conflicting_batch_in_a_group_leaves_the_others_committed(
    make_client: MakeClient, dsn: str, db: asyncpg.Connection
) -> None:
    client = await make_client(api_pool_size=2)  # one committer
    committer: GroupCommitter = client.app[COMMITTER]
    assert (await post(client, "/v1/events", {**EVENT, "id": "b-1"}))[0] == 202
    lock, tx = await lock_events(dsn)
    first = asyncio.create_task(post(client, "/v1/events", {**EVENT, "id": "first"}))
    await wait_for(lambda: committer.committing == 1)
    conflicting = asyncio.create_task(post(client, "/v1/events/batch", batch(3)))
    singles = [asyncio.create_task(post(client, "/v1/events", {**EVENT, "id": f"s-{i}"})) for i in range(5)]
    await wait_for(lambda: committer.queued == 6)
    await tx.rollback()
    await lock.close()

    assert (await first)[0] == 202
    assert (await conflicting)[0] == 409
    assert [status for status, _ in await asyncio.gather(*singles)] == [202] * 5
    rows = {r["id"]: r["xact"] for r in await stored(db)}
    assert sorted(rows) == ["b-1", "first", "s-0", "s-1", "s-2", "s-3", "s-4"]
    assert len({rows[f"s-{i}"] for i in range(5)}) == 1


async def test_a_group_keeps_the_order_its_requests_were_accepted_in_for_each_key(
    make_client: MakeClient, dsn: str, db: asyncpg.Connection
) -> None:
    """Singles, batches and singles again of one key queued behind a held
    commit: whatever order their ids sort in, and though a group stores its
    singles before its batches, the key numbers them as they were
    accepted."""
    await add_endpoint(db, "orders", "http://127.0.0.1:1/orders")
    client = await make_client(api_pool_size=2)  # one committer
    committer: GroupCommitter = client.app[COMMITTER]
    lock, tx = await lock_events(dsn)
    first = asyncio.create_task(post(client, "/v1/events", {**EVENT, "id": "z-first", "ordering_key": "k"}))
    await wait_for(lambda: committer.committing == 1)
    queued = [
        {**EVENT, "id": "y-single", "ordering_key": "k"},
        [{**EVENT, "id": "x-batch", "ordering_key": "k"}, {**EVENT, "id": "w-batch", "ordering_key": "k"}],
        {**EVENT, "id": "a-other", "ordering_key": "other"},
        {**EVENT, "id": "v-single", "ordering_key": "k"},
        {**EVENT, "id": "b-other", "ordering_key": "other"},
        [{**EVENT, "id": "u-batch", "ordering_key": "k"}],
        {**EVENT, "id": "t-single", "ordering_key": "k"},
    ]
    sends = []
    for n, body in enumerate(queued, 1):
        if isinstance(body, list):
            sends.append(asyncio.create_task(post(client, "/v1/events/batch", {"events": body})))
        else:
            sends.append(asyncio.create_task(post(client, "/v1/events", body)))
        # Queued one after another: the order they were accepted in.
        await wait_for(lambda n=n: committer.queued == n)
    await tx.rollback()
    await lock.close()

    assert (await first)[0] == 202
    assert [status for status, _ in await asyncio.gather(*sends)] == [202] * len(queued)
    assert await ordered_deliveries(db, "k") == {
        "orders": queued_in_order(
            ["z-first", "y-single", "x-batch", "w-batch", "v-single", "u-batch", "t-single"]
        )
    }
    assert await ordered_deliveries(db, "other") == {"orders": queued_in_order(["a-other", "b-other"])}
    # A group ends only before a unit sharing a key with a batch in it.
    xacts = {r["id"]: r["xact"] for r in await stored(db)}
    assert xacts["x-batch"] == xacts["a-other"] != xacts["v-single"] == xacts["b-other"]


async def test_insert_events_stores_many_and_names_the_conflicts(db: asyncpg.Connection) -> None:
    async with db.transaction():
        assert await store.insert_events(db, [Event("a", "acme", "a.b", '{"n": 1}')]) == {}
        refused = await store.insert_events(
            db,
            [
                Event("a", "acme", "a.b", '{"n": 1}'),  # the same again: stored once
                Event("a", "acme", "a.b", '{"n": 2}'),  # other content under a stored id
                Event("a", "globex", "a.b", '{"n": 2}'),  # another tenant's id: another event
                Event("b", "acme", "a.b", "{}", "k"),
                Event("b", "acme", "a.b", "{}"),  # another coalesce key, same call
                Event("c", "acme", "a b", "{}"),  # refused by the function's own check
            ],
        )
    assert {i: (type(e).__name__, e.field) for i, e in refused.items()} == {
        1: ("EventConflict", "id"),
        4: ("EventConflict", "id"),
        5: ("InvalidInput", "type"),
    }
    assert [(r["id"], r["tenant"], json.loads(r["data"])) for r in await stored(db)] == [
        ("a", "acme", {"n": 1}),
        ("a", "globex", {"n": 2}),
        ("b", "acme", {}),
    ]


def unit(events: int, done: bool = False, deadline: float = 1, ordering_key: str | None = None) -> _Unit:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    if done:
        future.cancel()
    return _Unit(
        [Event(str(i), "acme", "a.b", "{}", None, ordering_key=ordering_key) for i in range(events)],
        future,
        deadline,
    )


async def test_take_groups_up_to_the_cap_and_drops_abandoned_units() -> None:
    queue = deque(
        [unit(1, done=True), unit(2), unit(3), unit(1, done=True), unit(1, deadline=0), unit(4), unit(1)]
    )
    first = take(queue, cap=6, now=0)
    assert [len(u.events) for u in first] == [2, 3]
    assert all(u.taken for u in first)
    # A unit larger than the cap goes alone; one past its deadline is dropped.
    assert [len(u.events) for u in take(queue, cap=3, now=0)] == [4]
    assert [len(u.events) for u in take(queue, cap=3, now=0)] == [1]
    assert take(queue, cap=3, now=0) == []


async def test_take_ends_a_group_before_a_unit_sharing_an_ordering_key_with_a_batch() -> None:
    """A group stores its singles before its batches, and its batches
    sorted: two units of one key are grouped only when both are singles
    (stored in the order taken)."""
    queue = deque(
        [
            unit(1, ordering_key="k"),
            unit(1, ordering_key="k"),
            unit(1),
            unit(2, ordering_key="other"),
            unit(2, ordering_key="k"),
            unit(1, ordering_key="k"),
            unit(2, ordering_key="k"),
            unit(1, ordering_key="other"),
        ]
    )
    groups = [[len(u.events) for u in take(queue, cap=100, now=0)] for _ in range(4)]
    assert groups == [[1, 1, 1, 2], [2], [1], [2, 1]]
    assert not queue


# --------------------------------------------------------------------------
# The database slow, down or away: 503 with Retry-After in bounded time


async def expect_unavailable(client: TestClient, event: dict, within: float) -> None:  # type: ignore[type-arg]
    started = time.monotonic()
    async with client.post("/v1/events", json=event, headers=AUTH) as response:
        assert response.status == 503
        assert int(response.headers["Retry-After"]) > 0
        assert (await response.json())["error"] == "unavailable"
    # The bound of the contract, with room for a loaded machine.
    assert time.monotonic() - started < within


async def test_a_slow_database_gets_503_within_the_ack_timeout_and_nothing_stored(
    make_client: MakeClient, dsn: str, db: asyncpg.Connection
) -> None:
    client = await make_client(api_ack_timeout_seconds=1.0, api_pool_size=2)  # one committer
    committer: GroupCommitter = client.app[COMMITTER]
    refused = sample("hooklane_api_events_refused_total", {"reason": "unavailable"})
    lock, tx = await lock_events(dsn)
    try:
        # One request waits in a transaction, the other in the queue behind it.
        in_transaction = asyncio.create_task(expect_unavailable(client, {**EVENT, "id": "slow-1"}, within=5))
        await wait_for(lambda: committer.committing == 1)
        await expect_unavailable(client, {**EVENT, "id": "slow-2"}, within=5)
        await in_transaction
    finally:
        await tx.rollback()
        await lock.close()
    assert sample("hooklane_api_events_refused_total", {"reason": "unavailable"}) == refused + 2
    # The transaction that waited was rolled back, the queued request that
    # gave up was skipped, and the next one goes through.
    assert (await post(client, "/v1/events", {**EVENT, "id": "after"}))[0] == 202
    assert [r["id"] for r in await stored(db)] == ["after"]


async def test_stopping_commits_what_is_queued(dsn: str, db: asyncpg.Connection) -> None:
    pool = await store.create_pool(dsn, min_size=0, max_size=2)
    committer = GroupCommitter(functools.partial(store.acquire, pool), committers=1, max_events=1000)
    committer.start()
    try:
        lock, tx = await lock_events(dsn)
        events = [Event(f"q-{i}", "acme", "a.b", "{}", None) for i in range(5)]
        deadline = asyncio.get_running_loop().time() + 30
        waiting = [asyncio.create_task(committer.commit([event], deadline)) for event in events]
        await wait_for(lambda: committer.queued + committer.committing == 5)
        stopping = asyncio.create_task(committer.stop())
        await tx.rollback()
        await lock.close()
        await stopping
        assert await asyncio.gather(*waiting) == [None] * 5
        assert [r["id"] for r in await stored(db)] == [f"q-{i}" for i in range(5)]
        with pytest.raises(TransientStoreError):
            await committer.commit(events[:1], deadline)
    finally:
        await pool.close()


async def test_a_database_outage_gets_503_and_the_api_recovers_without_restart(
    make_client: MakeClient, dsn: str, database_outage: Callable[[], Any]
) -> None:
    client = await make_client(api_ack_timeout_seconds=2.0)
    assert (await post(client, "/v1/events", {**EVENT, "id": "before"}))[0] == 202
    with database_outage():
        await expect_unavailable(client, {**EVENT, "id": "during"}, within=10)

    async def accepted() -> bool:
        return (await post(client, "/v1/events", {**EVENT, "id": "after"}))[0] == 202

    await wait_for(accepted, timeout=30, interval=0.2)
    conn = await asyncpg.connect(dsn)
    try:
        assert [r["id"] for r in await stored(conn)] == ["after", "before"]
    finally:
        await conn.close()


async def test_a_database_out_of_reach_gets_503(make_client: MakeClient) -> None:
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/hooklane"
    client = await make_client(database_url=closed, api_ack_timeout_seconds=2.0)
    await expect_unavailable(client, EVENT, within=10)


# --------------------------------------------------------------------------
# A 503 tells what is known: nothing stored, or maybe stored (issue 18)


async def hold_event(dsn: str, event_id: str) -> tuple[asyncpg.Connection, asyncpg.transaction.Transaction]:
    """Hold up every publish of (acme, ``event_id``): an uncommitted insert
    of the same event, which a publish waits on until it ends."""
    conn = await asyncpg.connect(dsn)
    tx = conn.transaction()
    await tx.start()
    await store.insert_events(conn, [event(event_id)])
    return conn, tx


async def settled(db: asyncpg.Connection) -> None:
    """Wait until no other session of the test's database is inside a
    transaction: whatever the API's backends were doing has committed or
    rolled back."""

    async def quiet() -> bool:
        busy = await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
        )
        return busy == 0

    await wait_for(quiet)


async def test_a_request_that_gave_up_is_not_committed_with_the_rest_of_its_group(
    make_client: MakeClient, dsn: str, db: asyncpg.Connection
) -> None:
    client = await make_client(api_ack_timeout_seconds=1.0, api_pool_size=2)  # one committer
    committer: GroupCommitter = client.app[COMMITTER]
    later = asyncio.get_running_loop().time() + 60
    first, first_tx = await hold_event(dsn, "w")
    second, second_tx = await hold_event(dsn, "a")
    try:
        # The committer waits on "w" while "a" (over HTTP, 1 s to go) and
        # "b" (a minute to go) queue behind it: those two make one group,
        # which then waits on "a" past the first one's deadline.
        busy = asyncio.create_task(committer.commit([event("w")], later))
        await wait_for(lambda: committer.committing == 1)
        gives_up = asyncio.create_task(post(client, "/v1/events", {**EVENT, "id": "a"}))
        await wait_for(lambda: committer.queued == 1)
        patient = asyncio.create_task(committer.commit([event("b")], later))
        await wait_for(lambda: committer.queued == 2)
        await first_tx.rollback()
        await busy
        status, answer = await gives_up
        assert (status, answer["error"]) == (503, "unavailable")
        assert "nothing was stored" in answer["detail"]
    finally:
        await second_tx.rollback()
        await first.close()
        await second.close()
    [outcome] = await asyncio.gather(patient, return_exceptions=True)
    await settled(db)
    ids = [r["id"] for r in await stored(db)]
    # Told that nothing was stored: so it is not.
    assert "a" not in ids
    # The group was abandoned at the earliest deadline: nothing of it stored.
    assert ids == ["w"]
    assert isinstance(outcome, TransientStoreError) and not isinstance(outcome, OutcomeUnknown)


HOLD_COMMIT = """
CREATE FUNCTION test_hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(18);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER test_hold_commit AFTER INSERT ON events
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_hold_commit();
"""


async def test_a_commit_unanswered_by_the_deadline_is_an_unknown_outcome_with_the_ids(
    make_client: MakeClient, db: asyncpg.Connection
) -> None:
    # A trigger run at COMMIT waits for a lock the test holds: the COMMIT
    # is sent and not answered, as when the server stalls in the middle of it.
    await db.execute(HOLD_COMMIT)
    client = await make_client(api_ack_timeout_seconds=1.0)
    unknown = sample("hooklane_api_events_refused_total", {"reason": "outcome_unknown"})
    events = [{**EVENT, "id": "u-1"}, {**EVENT, "data": {"generated": True}}]
    await db.execute("SELECT pg_advisory_lock(18)")
    try:
        async with client.post("/v1/events/batch", json={"events": events}, headers=AUTH) as response:
            status, retry_after, answer = (
                response.status,
                response.headers.get("Retry-After"),
                await response.json(),
            )
    finally:
        await db.execute("SELECT pg_advisory_unlock(18)")

    assert (status, answer["error"]) == (503, "outcome_unknown")
    assert int(retry_after or 0) > 0
    assert "may have been stored" in answer["detail"]
    assert answer["ids"][0] == "u-1" and answer["ids"][1].startswith("msg_")
    assert sample("hooklane_api_events_refused_total", {"reason": "outcome_unknown"}) == unknown + 1
    doc = json.loads(resources.files("hooklane.api").joinpath("openapi.json").read_text())
    described = doc["paths"][ingest.BATCH_PATH]["post"]["responses"]["503"]["content"]["application/json"]
    OAS31Validator({**described["schema"], "components": doc["components"]}).validate(answer)
    await settled(db)
    # Published again under the ids the answer gave: stored once, whatever
    # became of the first COMMIT.
    events[1]["id"] = answer["ids"][1]
    assert await post(client, "/v1/events/batch", {"events": events}) == (202, {"ids": answer["ids"]})
    assert sorted(r["id"] for r in await stored(db)) == sorted(answer["ids"])


# --------------------------------------------------------------------------
# Batches sharing ids: one lock order, and a deadlock tried again (issue 18)


async def test_a_group_aborted_by_a_deadlock_is_tried_again(
    make_client: MakeClient, dsn: str, db: asyncpg.Connection
) -> None:
    client = await make_client(api_ack_timeout_seconds=10.0)
    retries = sample("hooklane_api_commit_retries_total", {"reason": "deadlock"})
    other = await asyncpg.connect(dsn)
    try:
        # The other transaction holds "y" and then wants "x", which the
        # batch took first: a lock cycle, which the API's backend detects
        # (this one would wait a minute before looking) and breaks by
        # aborting its own transaction.
        await other.execute("SET deadlock_timeout = '60s'")
        tx = other.transaction()
        await tx.start()
        await store.insert_events(other, [event("y")])
        sent = asyncio.create_task(
            post(client, "/v1/events/batch", {"events": [{**EVENT, "id": "y"}, {**EVENT, "id": "x"}]})
        )

        async def waiting() -> bool:
            return bool(await db.fetchval("SELECT count(*) FROM pg_locks WHERE NOT granted"))

        await wait_for(waiting)
        await store.insert_events(other, [event("x")])
        await tx.commit()
    finally:
        await other.close()
    assert await sent == (202, {"ids": ["y", "x"]})
    assert sorted(r["id"] for r in await stored(db)) == ["x", "y"]
    # At least once: a busy machine may wake the other transaction after the
    # retry's pause, and the retry then closes the same cycle again.
    assert sample("hooklane_api_commit_retries_total", {"reason": "deadlock"}) >= retries + 1


def test_the_pause_before_a_retry_doubles_up_to_its_cap_and_is_drawn_at_random() -> None:
    rng = random.Random(19)
    for tries, bound in (
        (1, RETRY_PAUSE_SECONDS),
        (2, 2 * RETRY_PAUSE_SECONDS),
        (40, RETRY_PAUSE_CAP_SECONDS),
    ):
        pauses = {retry_pause(tries, rng) for _ in range(200)}
        assert all(bound / 2 <= p <= bound for p in pauses)
        assert len(pauses) > 100


async def test_concurrent_batches_sharing_ids_in_different_orders_are_all_accepted(
    make_client: MakeClient, db: asyncpg.Connection
) -> None:
    client = await make_client(api_ack_timeout_seconds=20.0, api_pool_size=5)  # four committers
    # Published before: a batch reusing one of these with other content is a
    # conflict whatever the order the others commit in.
    earlier = [f"earlier-{i}" for i in range(12)]
    async with db.transaction():
        await store.insert_events(db, [event(i) for i in earlier])
    shuffle = random.Random(18)
    ids = [f"shared-{i:02d}" for i in range(40)]
    batches = []
    for n in range(120):
        events = [{**EVENT, "id": i, "data": {"id": i}} for i in shuffle.sample(ids, 20)]
        if n % 10 == 9:
            events.insert(7, {**EVENT, "id": earlier[n // 10], "data": {"other": n}})
        batches.append({"events": events})

    answers = await asyncio.gather(*(post(client, "/v1/events/batch", body) for body in batches))

    assert [a for a in answers if a[0] == 503] == []
    for n, (status, answer) in enumerate(answers):
        assert (status, answer.get("field")) == ((409, "events[7].id") if n % 10 == 9 else (202, None))
    rows = await stored(db)
    assert sorted(r["id"] for r in rows) == sorted(earlier + ids)
    assert all(json.loads(r["data"]) == {"id": r["id"]} for r in rows if r["id"] in ids)


# --------------------------------------------------------------------------
# Pure checks


# --------------------------------------------------------------------------
# End to end: the real `hooklane api` process, a worker, a receiver
