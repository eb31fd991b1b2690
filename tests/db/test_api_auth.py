"""The API's token check (hooklane/api/auth.py) on a real application and
Postgres: a request without a valid token is refused before its body is
read or the database touched; a limited token only for its tenants."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from hooklane import store
from hooklane.api.app import make_app
from hooklane.api.tokens import TokenSource
from hooklane.dev.postgres import free_port
from hooklane.settings import Settings
from hooklane.tokens import Tokens
from testsupport.api_auth import ADMIN, LIMITED, TOKEN

EVENT = {"type": "order.created", "tenant": "acme", "data": {}}


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/hooklane"
    settings = replace(Settings(database_url=closed), api_ack_timeout_seconds=2.0)
    pool = await store.create_pool(closed, min_size=0, max_size=settings.api_pool_size)
    ingest = TokenSource(Tokens.parse(f"{TOKEN}\n{LIMITED} tenants=acme", "test"), None, "test")
    admin = TokenSource(Tokens.parse(ADMIN, "test"), None, "test")
    client = TestClient(TestServer(make_app(settings, pool, ingest, admin)))
    await client.start_server()
    yield client
    await client.close()
    await pool.close()


def refused_unauthorized() -> float:
    return REGISTRY.get_sample_value("hooklane_api_events_refused_total", {"reason": "unauthorized"}) or 0.0


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token-0123456789", f"Basic {TOKEN}", f"Bearer {ADMIN}", f"Bearer {TOKEN}x"],
    ids=["missing", "wrong", "other scheme", "admin token", "longer"],
)
async def test_publishing_without_a_valid_ingest_token_is_401(
    client: TestClient,  # type: ignore[type-arg]
    authorization: str | None,
) -> None:
    before = refused_unauthorized()
    headers = {} if authorization is None else {"Authorization": authorization}
    async with client.post("/v1/events", json=EVENT, headers=headers) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await response.json())["error"] == "unauthorized"
    assert refused_unauthorized() == before + 1


async def test_a_valid_token_gets_past_the_check(client: TestClient) -> None:  # type: ignore[type-arg]
    # The control of the test above: past the check, the database is needed.
    async with client.post(
        "/v1/events", json=EVENT, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as response:
        assert response.status == 503


async def raw_request(client: TestClient, headers: str) -> bytes:  # type: ignore[type-arg]
    """Send a request's headers only, announcing a body that never comes;
    return the answer's status line."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(headers.encode())
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), timeout=10)
    finally:
        writer.close()


@pytest.mark.parametrize("path", ["/v1/events", "/v1/events/batch"])
async def test_a_wrong_token_is_refused_before_the_body_is_read(
    client: TestClient,  # type: ignore[type-arg]
    path: str,
) -> None:
    status = await raw_request(
        client,
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Authorization: Bearer wrong-token-0123456789\r\nContent-Length: 1000000000\r\n\r\n",
    )
    assert status.split()[1] == b"401"


async def test_a_limited_token_is_checked_against_the_tenant(client: TestClient) -> None:  # type: ignore[type-arg]
    headers = {"Authorization": f"Bearer {LIMITED}"}
    async with client.post("/v1/events", json={**EVENT, "tenant": "globex"}, headers=headers) as response:
        assert response.status == 403
        assert (await response.json())["field"] == "tenant"
