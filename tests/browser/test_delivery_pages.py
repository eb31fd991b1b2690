"""A delivery's request in the dashboard and the portal, and the
dashboard's event types, in a real browser: Debian's chromium driven by
Playwright, the real API application on loopback, real Postgres, a real
worker and a real receiver. Over plain HTTP: tests/db/test_delivery_pages.py.

With ``HOOKLANE_SCREENSHOTS`` set to a directory, the tests also write the
docs' pictures there (``dashboard-delivery.png``, ``portal-delivery.png``):

    HOOKLANE_SCREENSHOTS=docs/img hack/test tests/browser/test_delivery_pages.py
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from playwright.async_api import ConsoleMessage, Page

import hooklane
from hooklane.api.pages import HIDDEN, pretty_json
from hooklane.delivery import DeliverySpec, HeaderSpec, SecretKeyRef, resolve
from testsupport.dashboard import ADMIN_TOKEN, StartServer, cells, log_in
from testsupport.fixtures import add_endpoint, wait_for
from testsupport.receivers import Answer, Received, Receiver

SCREENSHOTS = os.environ.get("HOOKLANE_SCREENSHOTS")
API_KEY = "key-read-from-a-secret-0123"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ORDER = {
    "order": {
        "id": "ord_8412",
        "customer": {"id": "cus_193", "email": "ada@example.com"},
        "lines": [
            {"sku": "KB-01", "quantity": 2, "price": 49.5},
            {"sku": "MS-07", "quantity": 1, "price": 19.9},
        ],
        "total": 118.9,
        "currency": "EUR",
    }
}


async def shoot(page: Page, name: str) -> None:
    """Write the docs' picture ``name``, when asked to."""
    if SCREENSHOTS:
        await page.screenshot(path=Path(SCREENSHOTS) / name, full_page=True)


def refusals_of_the_policy(page: Page) -> list[str]:
    """What the browser reports of the CSP refusing something: kept as the
    page runs, so that an inline style or script would fail the test."""
    said: list[str] = []

    def heard(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            said.append(message.text)

    page.on("console", heard)
    return said


async def delivered(db: asyncpg.Connection, receiver: Receiver, start_worker: Any) -> tuple[int, Received]:
    url = receiver.on("orders", lambda _n: Answer(204))
    delivery = DeliverySpec(
        headers=(
            HeaderSpec("X-Api-Key", secret=SecretKeyRef("receiver", "key")),
            HeaderSpec("X-Team", "payments"),
        )
    )
    terms = resolve(delivery, "default", {"receiver": {"key": API_KEY}}.get)
    await add_endpoint(db, "orders", url, terms=terms)
    await hooklane.publish(
        db, tenant="acme", type="order.created", data=ORDER, id="evt-8412", traceparent=TRACEPARENT
    )
    start_worker()
    await wait_for(lambda: db.fetchval("SELECT state = 'delivered' FROM deliveries"))
    [got] = receiver.at("orders")
    return await db.fetchval("SELECT id FROM deliveries"), got


async def check_sent(page: Page, got: Received) -> None:
    """The page shows the body the receiver got and its headers, without
    the secrets, styled by its own stylesheet (the CSP let it load)."""
    assert await page.locator("pre.payload").inner_text() == pretty_json(got.body.decode())
    names = await cells(page, "headers", 1)
    values = dict(zip(names, await cells(page, "headers", 2), strict=True))
    sent = {name.lower(): value for name, value in got.headers.items()}
    assert values["webhook-id"] == sent["webhook-id"] == "evt-8412"
    assert values["traceparent"] == sent["traceparent"] == TRACEPARENT
    assert values["webhook-signature"] == values["X-Api-Key"] == HIDDEN
    assert values["X-Team"] == sent["x-team"] == "payments"
    assert API_KEY not in await page.content()
    assert await page.locator("pre.payload").evaluate("e => getComputedStyle(e).overflow") == "auto"
    link = page.locator("a.download")
    async with page.expect_download() as download:
        await link.click()
    saved = await (await download.value).path()
    assert Path(saved).read_bytes() == got.body


async def test_the_dashboard_shows_what_a_delivery_sent(
    base: str, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    refused = refusals_of_the_policy(page)
    delivery, got = await delivered(db, receiver, start_worker)
    await log_in(page, base)
    await page.click("a[href='/dashboard/endpoints/default/orders']")
    await page.click(f"tr[data-delivery='{delivery}'] a")
    await page.wait_for_url(f"{base}/dashboard/endpoints/default/orders/deliveries/{delivery}")
    await check_sent(page, got)
    await shoot(page, "dashboard-delivery.png")
    assert refused == []


async def test_the_portal_shows_what_its_delivery_sent(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    refused = refusals_of_the_policy(page)
    delivery, got = await delivered(db, receiver, start_worker)
    base = await start_dashboard(portal_endpoints="local", portal_https_only=False)
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http,
        http.post(f"{base}/v1/admin/portal-sessions", json={"tenant": "acme", "access": "read"}) as answer,
    ):
        link = (await answer.json())["url"]
    await page.goto(link)
    await page.wait_for_url(f"{base}/portal")
    await page.click("a[href='/portal/endpoints/default/orders']")
    await page.click(f"a[href='/portal/endpoints/default/orders/deliveries/{delivery}']")
    await check_sent(page, got)
    await shoot(page, "portal-delivery.png")
    assert refused == []


async def test_the_dashboard_counts_what_reached_no_receiver_per_type(
    base: str, page: Page, db: asyncpg.Connection
) -> None:
    refused = refusals_of_the_policy(page)
    for i in range(3):
        await hooklane.publish(db, tenant="acme", type="order.payed", data={}, id=f"typo-{i}")
    await db.execute(
        """INSERT INTO catalogue_refusals (tenant, type, reason, message)
           VALUES ('acme', 'order.shipped', 'schema', 'm'), ('acme', 'order.shipped', 'archived', 'm')"""
    )
    await log_in(page, base)
    await page.click(".top a:text-is('Event types')")
    await page.wait_for_url(f"{base}/dashboard/event-types")
    assert await cells(page, "event-types", 1) == ["order.payed", "order.shipped"]
    # Unrouted in the day and retained, refused in the day, by reason.
    assert [await cells(page, "event-types", n) for n in range(2, 8)] == [
        ["3", "0"],
        ["3", "0"],
        ["0", "2"],
        ["0", "0"],
        ["0", "1"],
        ["0", "1"],
    ]
    assert refused == []
