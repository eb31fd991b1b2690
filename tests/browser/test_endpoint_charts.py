"""The endpoint charts (issue 41) and both faces at a phone's width, in a
real browser: Debian's chromium driven by Playwright, the real API on
loopback, real Postgres, a real worker against a real receiver, and a
week of history written as the worker writes it.

With ``HOOKLANE_SCREENSHOTS`` set to a directory, the tests also write the
docs' pictures there (``dashboard-endpoint-charts.png``,
``portal-endpoint-phone.png``):

    HOOKLANE_SCREENSHOTS=docs/img hack/test tests/browser/test_endpoint_charts.py
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from playwright.async_api import ConsoleMessage, Page

from testsupport import dashboard
from testsupport.attempts import a_week_of_attempts
from testsupport.dashboard import ADMIN_TOKEN, StartServer
from testsupport.fixtures import flaky_history

SCREENSHOTS = os.environ.get("HOOKLANE_SCREENSHOTS")
PHONE = {"width": 390, "height": 844}
ENDPOINT = "endpoints/default/flaky"


async def shoot(page: Page, name: str) -> None:
    """Write the docs' picture ``name``, when asked to."""
    if SCREENSHOTS:
        await page.screenshot(path=Path(SCREENSHOTS) / name)


async def start(start_dashboard: StartServer) -> str:
    return await start_dashboard(portal_endpoints="local", portal_https_only=False)


async def enter(page: Page, base: str, tenant: str = "acme", access: str = "manage") -> None:
    """A portal session, as the platform's backend hands out its link."""
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http,
        http.post(f"{base}/v1/admin/portal-sessions", json={"tenant": tenant, "access": access}) as answer,
    ):
        body = await answer.json()
        assert answer.status == 201, body
    await page.goto(body["url"])
    await page.wait_for_url(f"{base}/portal")


def refusals(page: Page) -> list[str]:
    """What the browser refuses under the pages' CSP, as it happens."""
    seen: list[str] = []

    def heard(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            seen.append(message.text)

    page.on("console", heard)
    return seen


async def history(db: asyncpg.Connection, receiver: Any, start_worker: Any) -> int:
    """Endpoint default/flaky of acme: a delivery a real worker made (two
    failures, then delivered) and a week of attempts before it; the
    delivery's id."""
    delivery = await flaky_history(db, receiver, start_worker)
    await a_week_of_attempts(db, await db.fetchval("SELECT id FROM endpoints WHERE name = 'flaky'"))
    return delivery


async def test_both_faces_chart_the_history_and_switch_between_a_day_and_a_week(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection, receiver: Any, start_worker: Any
) -> None:
    await history(db, receiver, start_worker)
    delivered, retried = await db.fetchrow(
        "SELECT count(*) FILTER (WHERE outcome = 'delivered'), count(*) FILTER (WHERE outcome = 'retry')"
        " FROM delivery_attempts WHERE recorded_at >= date_bin('1 hour', now(), 'epoch'::timestamptz)"
    )
    base = await start(start_dashboard)
    refused = refusals(page)
    await page.set_viewport_size({"width": 1280, "height": 900})
    await dashboard.log_in(page, base)
    await page.goto(f"{base}/dashboard/{ENDPOINT}")

    for face in ("dashboard", "portal"):
        if face == "portal":
            await enter(page, base)
            await page.goto(f"{base}/portal/{ENDPOINT}")
        outcomes = page.locator("svg.chart-outcomes")
        latency = page.locator("svg.chart-latency")
        await outcomes.wait_for()
        box = await outcomes.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 100
        assert await latency.is_visible()
        # 24 hours: a column a hour, the last one this hour's, the worker's
        # attempts among them.
        hits = outcomes.locator("rect.hit title")
        assert await hits.count() == 24
        assert (await hits.last.text_content() or "").endswith(
            f": {delivered} delivered, {retried} failed and retried"
        )
        assert await outcomes.locator("rect.bar").count() > 8
        assert await latency.locator("polyline.p99").count() >= 1
        assert [t.strip() for t in await page.locator(".charts .legend li").all_text_contents()] == [
            "delivered",
            "failed and retried",
            "failed for good (dead)",
            "discarded",
            "median (p50)",
            "99th percentile (p99)",
        ]
        # The bars are coloured by the stylesheet: the CSP allows no inline style.
        fill = await outcomes.locator("rect.bar.delivered").first.evaluate("e => getComputedStyle(e).fill")
        assert fill == "rgb(29, 122, 70)"
        if face == "dashboard":
            await shoot(page, "dashboard-endpoint-charts.png")

        await page.click(".spans a:text-is('7 days')")
        await page.wait_for_url(f"{base}/{face}/{ENDPOINT}?span=7d")
        assert await page.locator(".charts figcaption").first.text_content() == "Attempts per day"
        assert await page.locator("svg.chart-outcomes rect.hit").count() == 7
        assert await page.locator(".spans a.current").text_content() == "7 days"
        # The numbers, for whoever cannot see the drawing.
        await page.click(".chart-numbers summary")
        assert await page.locator("table.chart-table tbody tr").count() == 7
        if face == "dashboard":
            # The page's refresh swaps the charts for fresh ones: what was
            # opened stays open.
            await page.locator("#refresh-status").evaluate("e => { e.textContent = ''; }")
            await page.locator("main h1").click()
            await page.wait_for_selector("#refresh-status:has-text('updated')")
            assert await page.locator("#chart-numbers").evaluate("d => d.open")
            assert await page.locator("table.chart-table").is_visible()
    assert refused == []


async def widths(page: Page) -> dict[str, float]:
    found: dict[str, float] = await page.evaluate(
        """() => ({
          scrolled: document.scrollingElement.scrollWidth,
          screen: window.innerWidth,
          header: document.querySelector("header.top").getBoundingClientRect().width,
          charts: Math.max(0, ...[...document.querySelectorAll("svg.chart")]
                                  .map(s => s.getBoundingClientRect().right)),
        })"""
    )
    return found


async def test_no_page_of_either_face_is_wider_than_a_phone(
    start_dashboard: StartServer, page: Page, db: asyncpg.Connection, receiver: Any, start_worker: Any
) -> None:
    delivery = await history(db, receiver, start_worker)
    base = await start(start_dashboard)
    await page.set_viewport_size(PHONE)
    await page.goto(f"{base}/dashboard/login")
    pages = ["/dashboard/login"]
    await dashboard.log_in(page, base)
    await enter(page, base)
    pages += [
        f"{home}{path}"
        for home in ("/dashboard", "/portal")
        for path in (
            "",
            f"/{ENDPOINT}",
            f"/{ENDPOINT}?span=7d",
            f"/{ENDPOINT}/deliveries/{delivery}",
        )
    ]
    pages += [f"/dashboard/{ENDPOINT}/attempts", "/portal/new", "/dashboard/endpoints/default/nothing"]
    for path in pages:
        await page.goto(base + path)
        shown = await widths(page)
        assert shown["scrolled"] <= shown["screen"], (path, shown)
        assert round(shown["header"]) == shown["screen"], (path, shown)
        assert shown["charts"] <= shown["screen"], (path, shown)
    await page.goto(f"{base}/portal/{ENDPOINT}")
    await page.locator(".charts").scroll_into_view_if_needed()
    await shoot(page, "portal-endpoint-phone.png")
