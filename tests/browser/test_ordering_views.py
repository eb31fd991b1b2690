"""An endpoint's keys held back, and why, in a real browser: Debian's
chromium driven by Playwright, the real API application on loopback, real
Postgres. The dashboard's endpoint page lists each held key with the dead
delivery that holds it, whose page shows its key and number and has the
resend that releases it. Over plain HTTP: tests/db/test_ordering_views.py."""

from __future__ import annotations

import asyncpg
from playwright.async_api import ConsoleMessage, Page

from testsupport.dashboard import StartServer, cells, log_in
from testsupport.fixtures import add_endpoint
from testsupport.held_keys import kill_head, publish_ordered


def refusals_of_the_policy(page: Page) -> list[str]:
    """What the browser reports of the CSP refusing something."""
    said: list[str] = []

    def heard(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            said.append(message.text)

    page.on("console", heard)
    return said


async def test_the_dashboard_leads_from_a_held_key_to_the_delivery_holding_it(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection
) -> None:
    base = await start_dashboard()
    refused = refusals_of_the_policy(page)
    await add_endpoint(db, "orders", "http://127.0.0.1:9/hook")
    await publish_ordered(db, "order-7", ["o7-created", "o7-paid", "o7-shipped"])
    await publish_ordered(db, "order-8", ["o8-created"])
    head = await kill_head(db, "orders", "order-7", "HTTP 410: gone for good")

    await log_in(page, base)
    await page.click("a[href='/dashboard/endpoints/default/orders']")
    state = page.locator("section.ordering-state")
    held = await state.locator(".keys-held dd").inner_text()
    assert held.startswith("1 the oldest since "), held
    assert await state.locator(".waiting dd").inner_text() == "2"
    assert await cells(page, "held-keys", 1) == ["order-7"]
    assert await cells(page, "held-keys", 5) == ["2"]
    assert "HTTP 410: gone for good" in (await cells(page, "held-keys", 4))[0]

    await page.click(f"table.held-keys tr[data-key='order-7'] a[href$='/deliveries/{head}']")
    await page.wait_for_url(f"{base}/dashboard/endpoints/default/orders/deliveries/{head}")
    ordering = await page.locator("dl.facts .ordering dd").inner_text()
    assert ordering.startswith("order-7 number 1 of its key")
    # Its resend, which releases the key.
    assert await page.locator(f"form:has(input[name='id'][value='{head}']) button").inner_text() == "Resend"
    assert refused == []
