"""The portal's event catalogue in a real browser: Debian's chromium
driven by Playwright, the real ``hooklane api`` application on loopback
and real Postgres. The catalogue page (a type, its schema as a table, its
example), its width on a phone, and the type picker of the endpoint form,
which subscribes an endpoint to the ticked types and a typed pattern.

With ``HOOKLANE_SCREENSHOTS`` set to a directory, the tests also write
docs/catalogue.md's pictures there (``portal-catalogue.png``,
``portal-catalogue-phone.png``, ``portal-type-picker.png``):

    HOOKLANE_SCREENSHOTS=docs/img hack/test tests/browser/test_catalogue_browser.py
"""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import asyncpg
from playwright.async_api import Page

from hooklane.selfservice import resource_name
from testsupport.catalogue import add_order_types
from testsupport.dashboard import ADMIN_TOKEN, StartServer
from testsupport.receivers import Answer, Receiver

SCREENSHOTS = os.environ.get("HOOKLANE_SCREENSHOTS")
PHONE = {"width": 390, "height": 844}


async def enter(page: Page, start_dashboard: StartServer, access: str) -> str:
    """The API's base URL, the page in a portal session of acme: a link
    from the admin API, redeemed as a browser does (portal.js)."""
    base = await start_dashboard(portal_endpoints="local", portal_https_only=False, portal_name="Acme")
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http,
        http.post(f"{base}/v1/admin/portal-sessions", json={"tenant": "acme", "access": access}) as answer,
    ):
        body = await answer.json()
        assert answer.status == 201, body
    await page.goto(body["url"])
    await page.wait_for_url(f"{base}/portal")
    return base


async def shoot(page: Page, name: str) -> None:
    if SCREENSHOTS:
        await page.screenshot(path=Path(SCREENSHOTS) / name)


async def test_the_catalogue_page_shows_a_type_its_schema_and_example(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection
) -> None:
    await add_order_types(db)
    base = await enter(page, start_dashboard, "read")
    await page.click(".top a.nav-link:text-is('Event types')")
    await page.wait_for_url(f"{base}/portal/catalogue")
    paid = page.locator("article[data-type='order.paid']")
    assert await paid.locator("h3 code").text_content() == "order.paid"
    assert await paid.locator(".description").text_content() == "An order was paid in full."
    latest = paid.locator("section.version[data-version='2']")
    city = latest.locator("table.schema tr[data-path='customer.address.city'] td")
    assert await city.all_text_contents() == ["city", "string", "required", ""]
    # Nested: indented under its parent, farther than a top-level property.
    indents = await latest.locator("table.schema td:first-child").evaluate_all(
        "cells => cells.map(c => [c.parentElement.dataset.path, parseFloat(getComputedStyle(c).paddingLeft)])"
    )
    by_path = dict(indents)
    assert by_path["customer.address.city"] > by_path["customer.address"] > by_path["customer"]
    example = await latest.locator("pre.example").text_content()
    assert example is not None and '"email": "ana@example.com"' in example
    # The raw schema is folded away until asked for.
    raw = latest.locator("details.raw")
    assert not await raw.locator("pre").is_visible()
    await raw.locator("summary").click()
    assert '"$defs"' in (await raw.locator("pre").text_content() or "")
    # The older version is folded too; deprecation and archiving show.
    assert await paid.locator("details.version[data-version='1'] > summary").text_content() == "Version 1"
    badge = page.locator("article[data-type='order.refunded'] .badge.deprecated")
    assert await badge.text_content() == "deprecated since 2026-06-01"
    assert await page.locator("article[data-type='invoice.sent'] .badge.archived").is_visible()
    await raw.locator("summary").click()
    await page.set_viewport_size({"width": 1100, "height": 1500})
    await page.evaluate("window.scrollTo(0, 0)")
    await shoot(page, "portal-catalogue.png")


async def test_the_catalogue_page_fits_a_phone(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection
) -> None:
    await add_order_types(db)
    base = await enter(page, start_dashboard, "manage")
    await page.set_viewport_size(PHONE)
    for path in ("/portal/catalogue", "/portal/new"):
        await page.goto(base + path)
        # Everything unfolded: the widest the page can be.
        await page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
        wide = await page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
        assert wide[0] <= wide[1], (path, wide)
    await page.goto(base + "/portal/catalogue#type-order.paid")
    await shoot(page, "portal-catalogue-phone.png")


async def test_the_picker_subscribes_an_endpoint_to_ticked_types_and_a_typed_pattern(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection, receiver: Receiver
) -> None:
    await add_order_types(db)
    url = receiver.on("picked", Answer(204))
    await enter(page, start_dashboard, "manage")
    await page.click("a:text-is('New endpoint')")
    await page.fill("#name", "picked")
    await page.fill("#url", url)
    picker = page.locator("fieldset.type-picker")
    # Archived types are not offered; deprecated ones are, marked.
    offered = await picker.locator("input[name=event_type]").evaluate_all("boxes => boxes.map(b => b.value)")
    assert offered == ["order.paid", "order.refunded", "user.created"]
    assert await picker.locator("label:has(input[value='order.refunded']) .badge.deprecated").is_visible()
    await picker.locator("input[value='order.paid']").check()
    await picker.locator("input[value='user.created']").check()
    await page.fill("#event_types", "billing.*")
    await page.set_viewport_size({"width": 900, "height": 900})
    await shoot(page, "portal-type-picker.png")
    await page.click("button:text-is('Create')")
    await page.wait_for_selector("h1:text-is('Endpoint created')")
    name = resource_name("acme", "picked")
    stored = await db.fetchval("SELECT event_types FROM endpoints WHERE name = $1", name)
    assert list(stored) == ["order.paid", "user.created", "billing.*"]

    # Editing shows the same choice: ticked types, the pattern typed.
    await page.goto(page.url.split("/portal")[0] + f"/portal/endpoints/default/{name}/edit")
    ticked = await picker.locator("input[name=event_type]:checked").evaluate_all(
        "boxes => boxes.map(b => b.value)"
    )
    assert ticked == ["order.paid", "user.created"]
    assert await page.input_value("#event_types") == "billing.*"
    await picker.locator("input[value='user.created']").uncheck()
    await page.click("button:text-is('Save')")
    await page.wait_for_selector(".flash:text-is('Endpoint saved.')")
    stored = await db.fetchval("SELECT event_types FROM endpoints WHERE name = $1", name)
    assert list(stored) == ["order.paid", "billing.*"]
