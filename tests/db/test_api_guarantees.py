"""What every route of the API guarantees, over real HTTP on a real
Postgres: an answer by the request's deadline, also while the server is
stalled (and a connection abandoned then is closed, not reset against it);
a caller's bad value is a 422 naming it, never a 503; ``Expect:
100-continue`` is answered only once the token and the announced length
pass."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import REGISTRY

from hooklane import store
from hooklane.settings import Settings
from testsupport.api_guarantees import NUL_CURSOR, OVERFLOWING_TIMES
from testsupport.fixtures import add_endpoint, in_process_api

ADMIN = "admin-token-0123456789"
INGEST = "ingest-token-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
EP = "/v1/admin/endpoints/default"
DEADLINE = 2.0
# Room for the answer past the deadline: scheduling on a busy machine, not
# a hang (a hang lasts as long as the stall).
SLACK = 3.0
# The admin API's body limit (hooklane.api.inputs.ADMIN_MAX_BODY_BYTES).
ADMIN_MAX_BODY_BYTES = 256 * 1024


@pytest.fixture
async def api(dsn: str, settings: Settings) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    async with in_process_api(dsn, settings, INGEST, ADMIN, api_ack_timeout_seconds=DEADLINE) as client:
        yield client


def requests_counted(route: str, method: str, status: int) -> float:
    labels = {"route": route, "method": method, "status": str(status)}
    return REGISTRY.get_sample_value("hooklane_api_requests_total", labels) or 0.0


# --- deadlines -------------------------------------------------------------------


async def answered_in_time(client: TestClient, method: str, path: str, **kwargs: Any) -> Any:  # type: ignore[type-arg]
    # Bounded here, so that a route that hangs fails instead of waiting out the stall.
    async with asyncio.timeout(DEADLINE + SLACK):
        response = await client.request(method, path, headers=AUTH, allow_redirects=False, **kwargs)
        await response.read()
    return response


async def test_a_stalled_database_gets_503_by_the_deadline_on_every_route(
    api: TestClient,  # type: ignore[type-arg]
    db: Any,
    database_stall: Callable[[], Any],
) -> None:
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    # Open connections first: the stall then catches statements in flight
    # on them (and new connections, once those are closed).
    for path in ("/v1/admin/endpoints", "/dashboard", f"{EP}/a"):
        assert (await answered_in_time(api, "GET", path)).status == 200
    with database_stall():
        for method, path in (
            ("GET", "/v1/admin/endpoints"),
            ("GET", f"{EP}/a/deliveries"),
            ("GET", "/dashboard"),
            ("GET", "/dashboard/endpoints/default/a"),
            ("POST", f"{EP}/a/resend-dead"),
            ("GET", "/v1/admin/endpoints"),
        ):
            response = await answered_in_time(api, method, path)
            assert response.status == 503, (method, path)
            assert response.headers["Retry-After"]
            if path.startswith("/dashboard"):
                assert response.content_type == "text/html"
                assert "Database unavailable" in await response.text()
            else:
                detail = (await response.json())["detail"]
                # A write that timed out may have been made: never "nothing changed".
                assert "nothing" not in detail
                if method == "POST":
                    assert "may or may not have been made" in detail and "repeating" in detail
        # The dashboard's form post too: a page, and no retry behind the person's back.
        response = await answered_in_time(api, "POST", "/dashboard/endpoints/default/a/resend")
        assert response.status == 503 and "Database unavailable" in await response.text()
        assert 'http-equiv="refresh"' not in await response.text()
    # Connections abandoned in the stall were closed, not left to the pool:
    # the API serves again at once, without a restart.
    for path in ("/v1/admin/endpoints", "/dashboard"):
        assert (await answered_in_time(api, "GET", path)).status == 200


async def test_a_connection_abandoned_mid_statement_is_closed_not_reset(
    dsn: str,
    database_stall: Callable[[], Any],
) -> None:
    """``store.acquire`` given up on (a deadline) closes its connection at
    once rather than resetting it against a server that does not answer."""
    pool = await store.create_pool(dsn, min_size=1, max_size=1)
    try:
        async with store.acquire(pool) as conn:
            await conn.fetchval("SELECT 1")
        with database_stall():
            async with asyncio.timeout(SLACK):
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.5), store.acquire(pool) as conn:
                        await conn.fetchval("SELECT 1")
        async with asyncio.timeout(SLACK), store.acquire(pool) as conn:
            assert await conn.fetchval("SELECT 2") == 2
    finally:
        await pool.close()


# --- a caller's bad values are 422, never an outage -----------------------------------


def bad_values() -> list[tuple[str, str, dict[str, Any], str]]:
    cases = []
    for text in OVERFLOWING_TIMES:
        for key in ("since", "until"):
            params = {"tenant": "acme", "since": "2026-01-01T00:00:00Z", key: text}
            cases.append(("GET", "/v1/admin/events", {"params": params}, key))
            cases.append(("GET", f"{EP}/a/deliveries", {"params": {key: text}}, key))
        cases.append(("POST", f"{EP}/a/replay", {"json": {"since": text}}, "since"))
    params = {"tenant": "acme", "since": "2026-01-01T00:00:00Z", "cursor": NUL_CURSOR}
    cases.append(("GET", "/v1/admin/events", {"params": params}, "cursor"))
    return cases


@pytest.mark.parametrize(("method", "path", "kwargs", "field"), bad_values())
async def test_a_value_no_database_can_hold_is_422_naming_it(
    api: TestClient,  # type: ignore[type-arg]
    db: Any,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    kwargs: dict[str, Any],
    field: str,
) -> None:
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    with caplog.at_level(logging.INFO):
        response = await api.request(method, path, headers=AUTH, **kwargs)
        body = await response.json()
    assert response.status == 422, body
    assert body["error"] == "invalid" and body["field"] == field
    assert "Retry-After" not in response.headers
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# --- Expect: 100-continue ----------------------------------------------------------------


async def first_answer(client: TestClient, head: str) -> bytes:  # type: ignore[type-arg]
    """Send a request's headers with ``Expect: 100-continue`` and no body;
    the status line of what comes back (100 would invite the body)."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(f"{head}Host: x\r\nExpect: 100-continue\r\n\r\n".encode())
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), timeout=10)
    finally:
        writer.close()


ROUTES = [
    ("/v1/events", "/v1/events", INGEST, 1024 * 1024),
    (f"{EP}/a/replay", "/v1/admin/endpoints/{namespace}/{name}/replay", ADMIN, ADMIN_MAX_BODY_BYTES),
    (
        "/dashboard/endpoints/default/a/resend",
        "/dashboard/endpoints/{namespace}/{name}/resend",
        ADMIN,
        1024 * 1024,
    ),
]


@pytest.mark.parametrize(("path", "route", "token", "limit"), ROUTES, ids=["ingest", "admin", "dashboard"])
async def test_expect_continue_is_answered_after_the_checks(
    api: TestClient,  # type: ignore[type-arg]
    path: str,
    route: str,
    token: str,
    limit: int,
) -> None:
    post = f"POST {path} HTTP/1.1\r\nContent-Type: application/json\r\n"
    for authorization, length, status in (
        ("", 10, b"401"),
        ("Authorization: Bearer wrong-token-0123456789\r\n", 10, b"401"),
        (f"Authorization: Bearer {token}\r\n", limit + 1, b"413"),
        (f"Authorization: Bearer {token}\r\n", 10, b"100"),
    ):
        before = requests_counted(route, "POST", int(status))
        line = await first_answer(api, f"{post}{authorization}Content-Length: {length}\r\n")
        assert line.split()[1] == status, (authorization, length, line)
        if status != b"100":
            assert requests_counted(route, "POST", int(status)) == before + 1


async def test_a_refused_expect_continue_is_the_apis_json(api: TestClient) -> None:  # type: ignore[type-arg]
    reader, writer = await asyncio.open_connection(api.host, api.port)
    try:
        writer.write(
            b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10\r\nExpect: 100-continue\r\n\r\n"
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        body = await asyncio.wait_for(reader.readexactly(length), timeout=10)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 401") and b"WWW-Authenticate: Bearer" in head
    assert json.loads(body)["error"] == "unauthorized"


async def test_a_body_still_arriving_at_the_deadline_is_408(api: TestClient) -> None:  # type: ignore[type-arg]
    reader, writer = await asyncio.open_connection(api.host, api.port)
    try:
        writer.write(
            f"POST {EP}/a/replay HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f'Authorization: Bearer {ADMIN}\r\nContent-Length: 100\r\n\r\n{{"since"'.encode()
        )
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout=DEADLINE + SLACK)
    finally:
        writer.close()
    assert line.split()[1] == b"408"
