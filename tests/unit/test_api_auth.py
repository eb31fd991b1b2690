"""The API's tokens (hooklane/api/tokens.py) and the check that runs before
any body is read or any database is touched (hooklane/api/auth.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from hooklane import store
from hooklane.api.app import make_app
from hooklane.api.auth import token_sources
from hooklane.api.tokens import TokenSource, bearer
from hooklane.dev.postgres import free_port
from hooklane.errors import InvalidInput
from hooklane.settings import Settings
from hooklane.tokens import Grant, Tokens

TOKEN = "9tq0oZ7qkY8v1H5XyV4m2sT3bQ0cR6eJ"
LIMITED = "Q1w2E3r4T5y6U7i8O9p0A1s2D3f4G5h6"
ADMIN = "admin-token-0123456789abcdef"
EVENT = {"type": "order.created", "tenant": "acme", "data": {}}

# --------------------------------------------------------------------------
# Tokens: parsing, checking, grants


def test_parse_reads_tokens_grants_and_comments() -> None:
    tokens = Tokens.parse(
        f"# producers\n{TOKEN}\n\n  # scoped\n{LIMITED}   tenants=acme,globex\r\n", "HOOKLANE_API_TOKENS"
    )
    assert len(tokens) == 2
    assert tokens.check(TOKEN) == Grant(None)
    assert tokens.check(LIMITED) == Grant(frozenset({"acme", "globex"}))
    assert tokens.check("not-a-valid-token-at-all") is None
    assert tokens.check(TOKEN[:-1]) is None
    assert tokens.check("") is None


def test_grants_limit_tenants() -> None:
    assert Grant(None).allows("anyone")
    limited = Grant(frozenset({"acme"}))
    assert limited.allows("acme")
    assert not limited.allows("globex")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("short", 1),
        (f"{TOKEN}\né-é-é-é-é-é-é-é-é-é-é-é", 2),
        (f"{TOKEN}\n{LIMITED} tenants=acme,\x01bad", 2),
    ],
)
def test_parse_refuses_bad_entries_without_quoting_the_token(text: str, line: int) -> None:
    with pytest.raises(InvalidInput) as refused:
        Tokens.parse(text, "HOOKLANE_API_TOKENS")
    assert refused.value.field == "HOOKLANE_API_TOKENS"
    assert refused.value.message.startswith(f"line {line}: ")
    for secret in (TOKEN, LIMITED, "short"):
        assert secret not in str(refused.value)


def test_repr_never_shows_a_token() -> None:
    assert TOKEN not in repr(Tokens.parse(TOKEN, "x"))


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (f"Bearer {TOKEN}", TOKEN),
        (f"bearer   {TOKEN}  ", TOKEN),
        (f"Basic {TOKEN}", None),
        ("Bearer", None),
        ("Bearer ", None),
        (None, None),
    ],
)
def test_bearer(header: str | None, token: str | None) -> None:
    assert bearer(header) == token


def test_a_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN}\n")
    source = TokenSource(Tokens.parse(ADMIN, "inline"), str(path), "HOOKLANE_API_TOKENS_FILE")
    assert source.current().check(TOKEN) is not None
    assert source.current().check(ADMIN) is not None

    # A rotation: the Secret's file is replaced by one with the new token.
    replacement = tmp_path / "tokens.new"
    replacement.write_text(f"{LIMITED} tenants=acme\n")
    os.replace(replacement, path)
    assert source.current().check(TOKEN) is None
    assert source.current().check(LIMITED) == Grant(frozenset({"acme"}))
    # The inline tokens stay.
    assert source.current().check(ADMIN) is not None


def test_a_token_file_turning_bad_keeps_the_tokens_read_before(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN}\n")
    source = TokenSource(Tokens(), str(path), "HOOKLANE_API_TOKENS_FILE")
    path.write_text("too short\n")
    assert source.current().check(TOKEN) is not None
    path.unlink()
    assert source.current().check(TOKEN) is not None
    path.write_text(f"{LIMITED}\n")
    assert source.current().check(LIMITED) is not None
    assert source.current().check(TOKEN) is None


def test_a_token_file_unreadable_at_start_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as refused:
        TokenSource(Tokens(), str(tmp_path / "missing"), "HOOKLANE_API_TOKENS_FILE")
    assert refused.value.field == "HOOKLANE_API_TOKENS_FILE"


def test_the_api_needs_an_ingest_token() -> None:
    with pytest.raises(InvalidInput) as refused:
        token_sources(Settings(database_url="postgresql://x/y"))
    assert refused.value.field == "HOOKLANE_API_TOKENS"
    ingest, admin = token_sources(
        Settings(database_url="postgresql://x/y", api_tokens=Tokens.parse(TOKEN, "t"))
    )
    assert ingest.configured and not admin.configured


# --------------------------------------------------------------------------
# Over HTTP, with the database out of reach: a refusal needs neither the
# body nor a database round trip (a request that got past the check would
# be answered 503 here).


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


@pytest.mark.db
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


@pytest.mark.db
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


@pytest.mark.db
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


@pytest.mark.db
async def test_a_limited_token_is_checked_against_the_tenant(client: TestClient) -> None:  # type: ignore[type-arg]
    headers = {"Authorization": f"Bearer {LIMITED}"}
    async with client.post("/v1/events", json={**EVENT, "tenant": "globex"}, headers=headers) as response:
        assert response.status == 403
        assert (await response.json())["field"] == "tenant"
