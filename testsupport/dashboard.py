"""The dashboard in this process and a chromium driving it (Playwright),
for the dashboard's and the portal's browser tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, Page, async_playwright

import hooklane
from hooklane import store
from hooklane.api.app import make_app
from hooklane.api.tokens import TokenSource
from hooklane.settings import Settings
from hooklane.tokens import Tokens
from testsupport.fixtures import add_endpoint, wait_for
from testsupport.receivers import Answer, Receiver

# Characters a cookie value must carry through quoting ("/", "+", "=").
ADMIN_TOKEN = "dash/admin+token=0123456789"


CHROMIUM = "/usr/bin/chromium"


# Without the background-networking flags Chromium's own connections to the
# outside are refused by these closed machines, many at a time.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Playwright's waits, in ms: a refresh every 5 s, a worker polling every 0.1 s.
WAIT_MS = 20_000


StartServer = Callable[..., Awaitable[str]]


@pytest.fixture
async def start_dashboard(settings: Settings) -> AsyncIterator[StartServer]:
    """``await start_dashboard(**settings overrides)``: the base URL of the
    real API application on loopback, with an admin token."""
    started: list[tuple[TestServer, asyncpg.Pool]] = []

    async def start(**overrides: Any) -> str:
        cfg = replace(settings, **{"api_ack_timeout_seconds": 2.0, **overrides})
        pool = await store.create_pool(
            cfg.database_url, min_size=0, max_size=4, server_settings=store.API_SESSION
        )
        ingest = TokenSource(Tokens.parse(INGEST_TOKEN, "test"), None, "test")
        admin = TokenSource(Tokens.parse(ADMIN_TOKEN, "test"), None, "test")
        server = TestServer(make_app(cfg, pool, ingest, admin), host="127.0.0.1")
        await server.start_server()
        started.append((server, pool))
        return str(server.make_url("")).rstrip("/")

    yield start
    for server, pool in started:
        await server.close()
        await pool.close()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        # Playwright gives each launch a new, empty profile of its own.
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context()
    opened = await context.new_page()
    opened.set_default_timeout(WAIT_MS)
    yield opened
    await context.close()


async def log_in(page: Page, base: str) -> None:
    await page.goto(f"{base}/dashboard/login")
    await page.fill("#token", ADMIN_TOKEN)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{base}/dashboard")


async def dead_ids(db: asyncpg.Connection) -> list[int]:
    return [r["id"] for r in await db.fetch("SELECT id FROM deliveries WHERE state = 'dead' ORDER BY id")]


async def dead_until_fixed(
    db: asyncpg.Connection, receiver: Receiver, start_worker: Any, n: int
) -> list[str]:
    """``n`` events to default/orders, refused as too large (413: dead at
    once) by its receiver, which then takes them; their ids."""
    fixed = asyncio.Event()
    url = receiver.on("orders", lambda _n: Answer(200 if fixed.is_set() else 413))
    await add_endpoint(db, "orders", url)
    events = await publish(db, n)
    start_worker()
    await wait_for(lambda: _count(dead_ids(db), n))
    fixed.set()
    return events


def webhook_ids(receiver: Receiver, path: str) -> list[str]:
    return [r.headers["webhook-id"] for r in receiver.at(path)]


def cells(page: Page, table: str, column: int) -> Awaitable[list[str]]:
    return page.locator(f"table.{table} tbody tr td:nth-child({column})").all_inner_texts()


INGEST_TOKEN = "ingest-token-0123456789"


async def publish(db: asyncpg.Connection, n: int = 1, tenant: str = "acme") -> list[str]:
    return [await hooklane.publish(db, tenant=tenant, type="order.created", data={"n": i}) for i in range(n)]


async def _count(values: Awaitable[list[int]], n: int) -> bool:
    return len(await values) == n


@pytest.fixture
async def base(start_dashboard: StartServer) -> str:
    return await start_dashboard()


def endpoint_rows(page: Page) -> Any:
    return page.locator("table.endpoints tbody tr")


async def shown(page: Page) -> list[str]:
    names = await endpoint_rows(page).evaluate_all("rows => rows.map(r => r.dataset.endpoint)")
    return [n.removeprefix("default/") for n in names]
