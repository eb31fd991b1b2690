"""The tenant portal (``/portal``) in a real browser: Debian's chromium
driven by Playwright, the real ``hooklane api`` application on loopback,
real Postgres, a real worker and real receivers.

With ``HOOKLANE_SCREENSHOTS`` set to a directory, the tests also write the
README's pictures there (``portal-*.png``):

    HOOKLANE_SCREENSHOTS=docs/img hack/test tests/browser/test_portal_browser.py
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import asyncpg
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Page
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane.api.auth import PORTAL_COOKIE
from hooklane.policies import CircuitPolicy
from hooklane.selfservice import resource_name
from testsupport import dashboard
from testsupport.dashboard import ADMIN_TOKEN, StartServer, cells, dead_ids, dead_until_fixed, webhook_ids
from testsupport.fixtures import add_endpoint, flaky_history, wait_for
from testsupport.receivers import Answer, Receiver

# The dashboard's fixtures: chromium, a fresh context's page, the real API.

SCREENSHOTS = os.environ.get("HOOKLANE_SCREENSHOTS")


async def start(start_dashboard: StartServer, **overrides: Any) -> str:
    """The API's base URL, with self-service in Postgres (local mode) and
    loopback receivers allowed as endpoints."""
    return await start_dashboard(**{"portal_endpoints": "local", "portal_https_only": False, **overrides})


async def link(base: str, tenant: str, access: str = "read") -> str:
    """A portal link, as the platform's backend asks the admin API for one."""
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http,
        http.post(f"{base}/v1/admin/portal-sessions", json={"tenant": tenant, "access": access}) as answer,
    ):
        body = await answer.json()
        assert answer.status == 201, body
    url: str = body["url"]
    return url


async def enter(page: Page, base: str, tenant: str, access: str = "read") -> None:
    await page.goto(await link(base, tenant, access))
    # portal.js posts the link's form at once.
    await page.wait_for_url(f"{base}/portal")


async def shoot(page: Page, name: str) -> None:
    """Write the README's picture ``name``, when asked to."""
    if SCREENSHOTS:
        await page.screenshot(path=Path(SCREENSHOTS) / name)


async def rows(page: Page, table: str) -> list[str]:
    found: list[str] = await page.locator(f"table.{table} tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.endpoint || r.dataset.delivery)"
    )
    return found


# --------------------------------------------------------------------------
# Entering, reading, leaving
async def test_enter_by_link_then_see_the_endpoints_a_delivery_and_its_attempts(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    delivery = await flaky_history(db, receiver, start_worker)
    await add_endpoint(db, "theirs", "http://127.0.0.1:9/theirs", tenant="globex")
    base = await start(start_dashboard)
    url = await link(base, "acme")

    await page.goto(url)
    await page.wait_for_url(f"{base}/portal")
    [cookie] = await page.context.cookies()
    assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (
        PORTAL_COOKIE,
        True,
        "Strict",
        "/portal",
    )
    assert await page.evaluate("document.cookie") == ""
    assert await rows(page, "endpoints") == ["default/flaky"]
    assert await page.text_content(".top .who") == "acme read"

    await page.click("a[href='/portal/endpoints/default/flaky']")
    assert await rows(page, "deliveries") == [str(delivery)]
    # A read grant: no button.
    assert await page.locator("main button[type=submit]:not(.search button)").count() == 0
    await page.click(f"a[href='/portal/endpoints/default/flaky/deliveries/{delivery}']")
    assert await cells(page, "attempts", 5) == ["503", "500", "204"]
    assert await cells(page, "attempts", 4) == ["retry", "retry", "delivered"]

    # The link was good once.
    await page.goto(url)
    await page.wait_for_selector("h1:text-is('This link cannot be used')")

    await page.goto(f"{base}/portal")
    await page.click("form.logout button")
    await page.wait_for_selector("h1:text-is('Logged out')")
    assert await page.context.cookies() == []
    response = await page.goto(f"{base}/portal")
    assert response is not None and response.status == 401
    assert await page.text_content("h1") == "Session ended"


# --------------------------------------------------------------------------
# Repairs, with a worker delivering for real
async def test_resend_one_dead_delivery_then_all_of_them(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    events = await dead_until_fixed(db, receiver, start_worker, 2)
    first, second = await dead_ids(db)
    base = await start(start_dashboard)
    await enter(page, base, "acme", "resend")

    await page.click("a[href='/portal/endpoints/default/orders']")
    await page.click(f"tr[data-delivery='{first}'] button:text-is('Resend')")
    await page.wait_for_selector(f".flash:text-is('Delivery {first} queued again.')")
    event = await db.fetchval("SELECT event_id FROM deliveries WHERE id = $1", first)
    await wait_for(lambda: webhook_ids(receiver, "orders").count(event) == 2)

    await page.click("button:text-is('Resend all 1 dead')")
    await page.wait_for_selector(".flash:text-is('1 dead delivery queued again.')")
    await wait_for(lambda: sorted(set(webhook_ids(receiver, "orders"))) == sorted(events))
    await wait_for(lambda: db.fetchval("SELECT count(*) = 2 FROM deliveries WHERE state = 'delivered'"))
    await page.reload()
    assert await page.locator(f"tr[data-delivery='{second}'].state-delivered").count() == 1
    assert await page.locator("button:has-text('Resend')").count() == 0


async def test_create_an_endpoint_send_it_a_test_event_pause_resume_and_rotate_its_secret(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    url = receiver.on("mine", Answer(204))
    start_worker()
    base = await start(start_dashboard)
    await enter(page, base, "acme", "manage")

    await page.click("a:text-is('New endpoint')")
    await page.fill("#name", "orders")
    await page.fill("#url", url)
    await page.fill("#event_types", "order.*")
    assert await page.input_value("#ordering_on_dead") == "Hold"
    await page.select_option("#ordering_on_dead", "Skip")
    await page.click("button:text-is('Create')")
    await page.wait_for_selector("h1:text-is('Endpoint created')")
    secret = await page.text_content("#secret")
    assert secret is not None and secret.startswith("whsec_")
    name = resource_name("acme", "orders")
    stored = await db.fetchrow("SELECT tenant, ordering_on_dead FROM endpoints WHERE name = $1", name)
    assert tuple(stored) == ("acme", "skip")

    # An event of the tenant's arrives, signed with the secret shown.
    event = await hooklane.publish(db, tenant="acme", type="order.paid", data={"n": 1})
    await wait_for(lambda: webhook_ids(receiver, "mine") == [event])
    assert Webhook(secret).verify(receiver.at("mine")[0].body, receiver.at("mine")[0].headers)["id"] == event

    await page.click("a:text-is('Go to the endpoint')")
    assert await page.text_content("h1") == "orders Active"
    await page.click("button:text-is('Send a test event')")
    await page.wait_for_selector(".flash:text-is('Test event queued: it goes out like any other delivery.')")
    await wait_for(lambda: len(receiver.at("mine")) == 2)
    test = Webhook(secret).verify(receiver.at("mine")[1].body, receiver.at("mine")[1].headers)
    assert test["type"] == "hooklane.test" and test["data"]["tenant"] == "acme"
    await wait_for(lambda: db.fetchval("SELECT count(*) = 2 FROM deliveries WHERE state = 'delivered'"))
    await page.reload()
    assert await page.text_content("h1 .state") == "delivered"

    await page.click("p.crumbs a:nth-child(2)")
    await page.click("button:text-is('Pause')")
    await page.wait_for_selector(
        ".flash:text-is('Paused: nothing is sent to this endpoint until you resume it.')"
    )
    assert await page.text_content("h1 .phase") == "Paused (manual)"
    assert await db.fetchval("SELECT paused FROM endpoints WHERE name = $1", name)
    await page.click("button:text-is('Resume')")
    await page.wait_for_selector(".flash:text-is('Resumed: its waiting deliveries go out again.')")
    assert await page.text_content("h1 .phase") == "Active"

    await page.click("button:text-is('Rotate the signing secret')")
    await page.wait_for_selector("h1:text-is('Signing secret rotated')")
    assert "For the next 1 d, every delivery is signed with both" in (
        await page.text_content(".warning") or ""
    )
    rotated = await page.text_content("#secret")
    assert rotated is not None and rotated != secret
    await page.click("a:text-is('Go to the endpoint')")
    await page.click("button:text-is('Send a test event')")
    await wait_for(lambda: len(receiver.at("mine")) == 3)
    # During the overlap a receiver with either secret accepts it.
    for key in (secret, rotated):
        assert (
            Webhook(key).verify(receiver.at("mine")[2].body, receiver.at("mine")[2].headers)["type"]
            == "hooklane.test"
        )


# --------------------------------------------------------------------------
# Embedding and branding


async def platform_page() -> TestServer:
    """The platform's own pages, on another origin: ``/?src=URL`` frames URL."""
    app = web.Application()

    async def show(request: web.Request) -> web.Response:
        src = html.escape(request.query["src"])
        return web.Response(
            text=f'<!doctype html><h1>Platform</h1><iframe src="{src}" width="900" height="500"></iframe>',
            content_type="text/html",
        )

    app.router.add_get("/", show)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def test_the_portal_is_framed_only_by_the_pages_the_platform_names(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection
) -> None:
    await add_endpoint(db, "orders", "http://127.0.0.1:9/orders", tenant="acme")
    platform = await platform_page()
    origin = str(platform.make_url("")).rstrip("/")
    try:
        # Not named: the browser refuses to show the portal in the frame, so
        # its script never runs and the link stays unused.
        url = await link(await start(start_dashboard), "acme")
        async with page.expect_response(url) as answered:
            await page.goto(f"{origin}/?{urlencode({'src': url})}")
        assert (await answered.value).status == 200
        await wait_for(lambda: [f.url for f in page.frames[1:]] == ["chrome-error://chromewebdata/"])
        assert await db.fetchval("SELECT count(*) FROM portal_grants WHERE kind = 'link'") == 1

        framed = await start(start_dashboard, portal_frame_ancestors=(origin,), portal_name="Shipfast")
        await page.goto(f"{origin}/?{urlencode({'src': await link(framed, 'acme')})}")
        inside = page.frame_locator("iframe")
        await inside.locator("table.endpoints").wait_for()
        assert await inside.locator("a.brand").text_content() == "Shipfast"
        assert await inside.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.endpoint)") == [
            "default/orders"
        ]
        # The session works within the frame: a page further in.
        await inside.locator("a[href='/portal/endpoints/default/orders']").click()
        await inside.locator("dl.facts").wait_for()
        assert await inside.locator("h1").text_content() == "orders Active"
    finally:
        await platform.close()


async def test_a_tenant_sees_its_own_endpoints_in_the_platforms_name_and_colour(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    """Also the README's pictures: a small tenant's endpoints, one of them
    refusing some payloads, one paused by hand, one failing."""
    answers = {
        "orders": Answer(204),
        "billing": lambda n: Answer(413 if n % 3 == 2 else 204),
        "warehouse": Answer(204),
        "partner-sync": Answer(503),
    }
    for path, answer in answers.items():
        await add_endpoint(
            db,
            resource_name("acme", path),
            receiver.on(path, answer),
            tenant="acme",
            paused=path == "warehouse",
            event_types=("order.*", "invoice.*"),
        )
    await add_endpoint(db, "theirs", receiver.on("theirs", Answer(204)), tenant="globex")
    start_worker(circuit=CircuitPolicy(threshold=3, step_seconds=60, cap_seconds=60))
    for i in range(12):
        await hooklane.publish(
            db, tenant="acme", type=("order.created", "invoice.paid")[i % 2], data={"n": i}
        )
    await hooklane.publish(db, tenant="globex", type="order.created", data={})
    await wait_for(lambda: len(receiver.at("orders")) == 12 and len(receiver.at("billing")) == 12)
    # partner-sync's circuit opens.
    await wait_for(lambda: db.fetchval("SELECT count(*) = 1 FROM endpoints WHERE paused_until IS NOT NULL"))

    base = await start(start_dashboard, portal_name="Shipfast Webhooks", portal_colour="#0f766e")
    await enter(page, base, "acme", "manage")
    assert sorted(await rows(page, "endpoints")) == sorted(
        f"default/{resource_name('acme', path)}" for path in answers
    )
    assert await page.title() == "Endpoints · Shipfast Webhooks"
    header = await page.locator("header.top").evaluate(
        "e => [getComputedStyle(e).backgroundColor, getComputedStyle(e).color]"
    )
    assert header == ["rgb(15, 118, 110)", "rgb(255, 255, 255)"]
    await shoot(page, "portal-endpoints.png")

    await page.click("a:text-is('billing')")
    await page.wait_for_selector("button:text-is('Resend all 4 dead')")
    await shoot(page, "portal-endpoint.png")


# --------------------------------------------------------------------------
# On a phone


PHONE = {"width": 390, "height": 844}


async def widths(page: Page) -> dict[str, float]:
    """How wide the document, the screen and the header bar are, and the
    widest table's box and its content: a table wider than the screen must
    scroll in its own box, not widen the page."""
    found: dict[str, float] = await page.evaluate(
        """() => {
          const doc = document.documentElement;
          const boxes = [...document.querySelectorAll("table")].map(t => t.parentElement);
          return {
            document: doc.scrollWidth,
            screen: doc.clientWidth,
            header: document.querySelector("header.top").getBoundingClientRect().width,
            table: Math.max(0, ...boxes.map(b => b.scrollWidth)),
            box: Math.max(0, ...boxes.map(b => b.clientWidth)),
          };
        }"""
    )
    return found


async def test_at_phone_width_tables_scroll_in_their_box_and_the_header_spans_the_page(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    delivery = await flaky_history(db, receiver, start_worker)
    base = await start(start_dashboard)
    await page.set_viewport_size(PHONE)
    await dashboard.log_in(page, base)
    await enter(page, base, "acme")
    endpoint = "endpoints/default/flaky"
    pages = [
        f"{home}{path}"
        for home in ("/dashboard", "/portal")
        for path in ("", f"/{endpoint}", f"/{endpoint}/deliveries/{delivery}")
    ] + [f"/dashboard/{endpoint}/attempts"]
    for path in pages:
        await page.goto(base + path)
        shown = await widths(page)
        assert shown["document"] == shown["screen"] == round(shown["header"]), (path, shown)
        # The test would see nothing if the tables fitted anyway.
        assert shown["table"] > shown["box"] > 0, (path, shown)
