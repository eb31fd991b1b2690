"""The dashboard (``/dashboard``) in a real browser: Debian's chromium driven
by Playwright, the real ``hooklane api`` application on loopback, real
Postgres, a real worker and real receivers. Its answers without a browser
are tests/db/test_dashboard.py's."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Page

import hooklane
from hooklane import store
from hooklane.api import pages
from hooklane.api.auth import SESSION_COOKIE
from hooklane.checks import check_url
from hooklane.delivery import DeliverySpec
from hooklane.policies import CircuitPolicy
from hooklane.results import Result
from hooklane.spec import EndpointSpec
from testsupport.dashboard import (
    ADMIN_TOKEN,
    WAIT_MS,
    _count,
    cells,
    dead_ids,
    dead_until_fixed,
    endpoint_rows,
    log_in,
    publish,
    shown,
    webhook_ids,
)
from testsupport.fixtures import SECRET, add_endpoint, flaky_history, reserve_round, wait_for
from testsupport.receivers import Answer, Receiver


async def test_login_refuses_a_wrong_token_and_keeps_the_right_one_in_a_strict_cookie(
    base: str, page: Page
) -> None:
    # Unauthenticated, a page sends the browser to the login form.
    await page.goto(f"{base}/dashboard")
    assert page.url == f"{base}/dashboard/login"

    await page.fill("#token", "not-the-admin-token-at-all")
    async with page.expect_response(f"{base}/dashboard/login") as answer:
        await page.click("button[type=submit]")
    assert (await answer.value).status == 401
    assert await page.text_content("[role=alert]") == "That token is not valid."
    assert await page.context.cookies() == []

    await page.fill("#token", ADMIN_TOKEN)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{base}/dashboard")
    [cookie] = await page.context.cookies()
    assert cookie["name"] == SESSION_COOKIE
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"], cookie["secure"]) == (
        True,
        "Strict",
        "/dashboard",
        False,
    )
    # HttpOnly: the page's own scripts cannot read the token.
    assert await page.evaluate("document.cookie") == ""

    await page.click("form.logout button")
    await page.wait_for_url(f"{base}/dashboard/login")
    assert await page.text_content(".flash") == "Logged out."
    assert [c["name"] for c in await page.context.cookies()] == []
    await page.goto(f"{base}/dashboard")
    assert page.url == f"{base}/dashboard/login"


async def test_endpoints_are_listed_by_oldest_pending_age_with_their_phase(
    base: str, page: Page, db: asyncpg.Connection
) -> None:
    await add_endpoint(db, "idle", "http://127.0.0.1:9/idle", event_types=("nothing.matches",))
    await add_endpoint(db, "lagging", "http://127.0.0.1:9/lagging", event_types=("order.created",))
    await add_endpoint(db, "held", "http://127.0.0.1:9/held", event_types=("order.paid",), paused=True)
    # No worker runs: every delivery stays pending; lagging's is the oldest.
    for kind in ("order.created", "order.paid", "order.paid"):
        await hooklane.publish(db, tenant="acme", type=kind, data={})

    await log_in(page, base)

    rows = endpoint_rows(page)
    assert await rows.evaluate_all("rows => rows.map(r => r.dataset.endpoint)") == [
        "default/lagging",
        "default/held",
        "default/idle",
    ]
    phases = await page.locator("table.endpoints .phase").all_text_contents()
    assert phases == ["Active", "Paused (manual)", "Active"]
    pending = await page.locator("table.endpoints tbody tr td:nth-child(4)").all_text_contents()
    assert pending == ["1", "2", "0"]
    assert await page.locator("table.endpoints tbody tr td.age").nth(2).text_content() == "-"

    await page.click("a[href='/dashboard/endpoints/default/held']")
    await page.wait_for_url(f"{base}/dashboard/endpoints/default/held")
    assert await page.locator("h1 .phase").text_content() == "Paused (manual)"
    types = await page.locator("table.deliveries tbody tr .quiet").all_text_contents()
    assert types == ["order.paid", "order.paid"]


async def _sixty_endpoints(db: asyncpg.Connection) -> list[str]:
    """Sixty endpoints of three tenants, the first forty with one pending
    delivery each, older the lower the number; a few paused by hand. Their
    names, in the listing's order."""
    for i in range(60):
        await add_endpoint(
            db,
            f"ep-{i:02d}",
            f"http://127.0.0.1:9/{i}",
            tenant=("acme", "globex", "initech")[i % 3],
            paused=i % 7 == 0,
        )
    for tenant in ("acme", "globex", "initech"):
        await publish(db, 1, tenant)
    await db.execute(
        "DELETE FROM deliveries d USING endpoints ep WHERE ep.id = d.endpoint_id AND ep.name >= 'ep-40'"
    )
    await db.execute(
        """UPDATE deliveries d SET created_at = now() - (100 - substr(ep.name, 4)::int) * interval '1 minute'
           FROM endpoints ep WHERE ep.id = d.endpoint_id"""
    )
    return [h.name for h in await store.endpoint_health(db)]


async def test_the_endpoints_page_shows_the_most_delayed_fifty_and_pages_on(
    base: str, page: Page, db: asyncpg.Connection
) -> None:
    order = await _sixty_endpoints(db)
    assert order[:3] == ["ep-00", "ep-01", "ep-02"]
    await log_in(page, base)
    assert await shown(page) == order[:50]
    assert "60" in (await page.locator(".totals li").first.text_content() or "")
    assert await page.locator("a.first").count() == 0

    await page.click("a.next")
    await page.wait_for_url(re.compile(r".*/dashboard\?after="))
    assert await shown(page) == order[50:]
    assert await page.locator("a.next").count() == 0
    await page.click("a.first")
    await page.wait_for_url(f"{base}/dashboard")
    assert await shown(page) == order[:50]


async def test_search_by_tenant_name_and_phase_keeps_the_order_and_pages_within(
    base: str, page: Page, db: asyncpg.Connection
) -> None:
    order = await _sixty_endpoints(db)
    healths = {h.name: h for h in await store.endpoint_health(db)}
    await log_in(page, base)

    await page.fill("input[name=tenant]", "acme")
    await page.fill("input[name=name_prefix]", "ep-1")
    await page.click("form.search button[type=submit]")
    await page.wait_for_url(re.compile(r".*tenant=acme&name_prefix=ep-1.*"))
    expected = [n for n in order if healths[n].tenant == "acme" and n.startswith("ep-1")]
    assert await shown(page) == expected and expected
    assert await page.input_value("input[name=tenant]") == "acme"
    # The page refreshes itself with the same search.
    await page.wait_for_selector("#refresh-status:has-text('updated')")
    assert await shown(page) == expected

    await page.goto(f"{base}/dashboard")
    await page.select_option("select[name=phase]", "Paused")
    await page.click("form.search button[type=submit]")
    await page.wait_for_url(re.compile(r".*phase=Paused.*"))
    assert await shown(page) == [n for n in order if healths[n].standing.state == "Paused"]

    await page.goto(f"{base}/dashboard")
    await page.check("input[name=not_delivering]")
    await page.click("form.search button[type=submit]")
    await page.wait_for_url(re.compile(r".*not_delivering=true.*"))
    assert await shown(page) == [n for n in order if healths[n].paused]
    totals = await page.locator(".totals li").all_text_contents()
    assert totals[0].split()[0] == str(sum(1 for h in healths.values() if h.paused))

    # Fifty of the forty-odd active ones, then the next page keeps the search.
    await page.goto(f"{base}/dashboard?phase=Active")
    active = [n for n in order if healths[n].standing.state == "Active"]
    assert len(active) > 50
    assert await shown(page) == active[:50]
    await page.click("a.next")
    await page.wait_for_url(re.compile(r".*phase=Active&after=.*"))
    assert await shown(page) == active[50:]

    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        async with http.get(f"{base}/dashboard?phase=Sleeping") as answer:
            assert answer.status == 422 and "phase must be one of" in await answer.text()
        async with http.get(f"{base}/dashboard?after=nope") as answer:
            assert answer.status == 422 and "after is not a cursor" in await answer.text()


async def test_an_open_circuit_shows_its_failures_and_next_probe(
    base: str, page: Page, db: asyncpg.Connection
) -> None:
    upserted = await store.upsert_endpoint(
        db,
        EndpointSpec(namespace="default", name="down", url="http://127.0.0.1:9/down", tenant="acme"),
        SECRET,
    )
    await publish(db, 2)
    # Two failures the way the worker records them, against a threshold of
    # two: their retries are due long before the circuit's pause ends.
    reserved = await reserve_round(db, 2, partitions=[upserted.partition])
    failed = [Result.retry(r.id, r.attempts, retry_in=30, status=503, error="HTTP 503") for r in reserved]
    await store.complete(
        db, failed, CircuitPolicy(threshold=2, step_seconds=600, cap_seconds=600), [upserted.partition]
    )

    await log_in(page, base)
    assert await page.locator("table.endpoints .phase").text_content() == "Paused (circuit)"
    circuit = await page.locator("table.endpoints tbody td:nth-child(7)").text_content()
    assert re.fullmatch(r"\s*2 failures; next probe\s+in (9|10) min( \d+ s)?\s*", circuit or ""), circuit
    # Each delivery goes when the pause ends, not when its own retry was due.
    held = r"\s*after the circuit's pause,\s+in (9|10) min( \d+ s)?\s*"
    await page.goto(f"{base}/dashboard/endpoints/default/down")
    cells = await page.locator("table.deliveries tbody td:nth-child(6)").all_text_contents()
    assert len(cells) == 2 and all(re.fullmatch(held, cell) for cell in cells), cells
    await page.goto(f"{base}/dashboard/endpoints/default/down/deliveries/{reserved[0].id}")
    fact = await page.locator("dl.facts div", has_text="Next attempt").locator("dd").text_content()
    assert re.fullmatch(held, fact or ""), fact


async def test_an_overloaded_adaptive_endpoint_shows_its_limit_and_rate(
    base: str, page: Page, db: asyncpg.Connection
) -> None:
    """The limit in force, what it may rise to, the Retry-After's hold and
    the rate limit, as the receiver's 503s with Retry-After left them."""
    delivery = DeliverySpec(rate_per_second=20, burst=5, adaptive=True)
    upserted = await store.upsert_endpoint(
        db,
        EndpointSpec(
            namespace="default",
            name="busy",
            url="http://127.0.0.1:9/busy",
            tenant="acme",
            max_concurrency=8,
            delivery=delivery,
        ),
        SECRET,
    )
    await publish(db, 1)
    reserved = await reserve_round(db, 1, partitions=[upserted.partition])
    overloaded = [
        Result.retry(r.id, r.attempts, retry_in=600, status=503, error="HTTP 503", retry_after=300)
        for r in reserved
    ]
    await store.complete(db, overloaded, CircuitPolicy(), [upserted.partition])

    await log_in(page, base)
    await page.goto(f"{base}/dashboard/endpoints/default/busy")
    facts = await page.locator("dl.facts").text_content() or ""
    assert re.search(r"In flight\s*0 of 5", facts), facts
    assert re.search(
        r"adaptive: 5 of at most 8; held by the receiver's Retry-After or an overload at a limit of 1,"
        r" in [45] min",
        facts,
    ), facts
    assert re.search(r"Rate limit\s*20 starts/s, bursts of 5", facts), facts


async def test_the_page_says_so_while_the_database_is_away_and_recovers(
    base: str, page: Page, db: asyncpg.Connection, database_outage: Callable[[], Any]
) -> None:
    await add_endpoint(db, "orders", "http://127.0.0.1:9/orders")
    await log_in(page, base)
    with database_outage():
        await page.wait_for_selector("#refresh-status:has-text('database unavailable, retrying')")
        # The table stays as it was last seen.
        assert await endpoint_rows(page).count() == 1
    await page.wait_for_selector("#refresh-status:has-text('updated')")


async def test_hostile_text_is_shown_as_text(base: str, page: Page, db: asyncpg.Connection) -> None:
    # A tenant writes its endpoint's URL; a receiver's failure ends up in
    # last_error. Neither may run in the operator's browser.
    url = "http://127.0.0.1:9/hook?x=\"><script>window.pwned='url'</script>"
    hostile = "<script>window.pwned='error'</script><img src=x onerror=\"window.pwned='img'\">"
    assert check_url(url) == url
    upserted = await store.upsert_endpoint(
        db, EndpointSpec(namespace="default", name="hostile", url=url, tenant="acme"), SECRET
    )
    await publish(db)
    [reserved] = await reserve_round(db, 1, partitions=[upserted.partition])
    await store.complete(
        db,
        [Result.dead(reserved.id, reserved.attempts, status=None, error=hostile)],
        CircuitPolicy(),
        [upserted.partition],
    )

    await log_in(page, base)
    assert await page.locator("table.endpoints .error").text_content() == pages.short_text(hostile)
    assert await page.locator("table.endpoints .error").get_attribute("title") == hostile
    await page.click("a[href='/dashboard/endpoints/default/hostile']")
    await page.wait_for_selector("table.deliveries")
    assert await page.locator("dl.facts code").text_content() == url
    assert await page.locator("table.deliveries .error").get_attribute("title") == hostile
    assert await page.evaluate("window.pwned") is None
    assert await page.locator("#live script, #live img").count() == 0

    # The delivery's own page, and its attempt, show the whole error as text.
    await page.click(f"tr[data-delivery='{reserved.id}'] a")
    await page.wait_for_selector("table.attempts")
    assert await page.locator("dl.facts .error").text_content() == hostile
    assert await page.locator("table.attempts .error").get_attribute("title") == hostile
    await page.goto(f"{base}/dashboard/endpoints/default/hostile/attempts?status=%3Cscript%3E")
    assert "<script>" in (await page.text_content("[role=alert]") or "")
    assert await page.input_value("input[name=status]") == "<script>"
    assert await page.evaluate("window.pwned") is None
    assert await page.locator("main script, main img").count() == 0


async def test_a_delivery_shows_its_attempts_and_the_last_hours_5xx_leave_out_the_success(
    base: str, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    delivery = await flaky_history(db, receiver, start_worker)
    await log_in(page, base)
    await page.click("a[href='/dashboard/endpoints/default/flaky']")
    await page.click(f"tr[data-delivery='{delivery}'] a")
    await page.wait_for_url(f"{base}/dashboard/endpoints/default/flaky/deliveries/{delivery}")

    facts = await page.locator("dl.facts").inner_text()
    assert "evt-flaky" in facts and "order.created" in facts and "acme" in facts and "204" in facts
    assert await page.locator("h1 .state").text_content() == "delivered"
    assert await cells(page, "attempts", 1) == ["1", "2", "3"]
    assert await cells(page, "attempts", 4) == ["retry", "retry", "delivered"]
    assert await cells(page, "attempts", 5) == ["503", "500", "204"]
    # Each attempt says when it started, how long it took and which worker made it.
    started = await page.locator("table.attempts tbody td:nth-child(2) time").evaluate_all(
        "times => times.map(t => t.dateTime)"
    )
    assert started == sorted(started) and len(started) == 3
    assert all(re.fullmatch(r"\d+ ms|\d+ s", d) for d in await cells(page, "attempts", 3))
    workers = await cells(page, "attempts", 9)
    assert len(set(workers)) == 1 and workers[0]
    # The retries say when the next attempt was due; the success does not.
    assert [bool(n) for n in await cells(page, "attempts", 8)] == [True, True, False]
    assert await page.locator("button:text-is('Resend')").count() == 0

    await page.click(".crumbs a:text-is('default/flaky')")
    await page.click("a:text-is('5xx in the last hour')")
    await page.wait_for_url(f"{base}/dashboard/endpoints/default/flaky/attempts?status=5xx")
    assert await page.input_value("input[name=status]") == "5xx"
    # Newest first: the 500, then the 503; no 204.
    assert await cells(page, "attempts", 6) == ["500", "503"]
    assert await cells(page, "attempts", 5) == ["retry", "retry"]
    await page.click(f"tr[data-attempt='2'] a[href$='/deliveries/{delivery}']")
    await page.wait_for_url(f"{base}/dashboard/endpoints/default/flaky/deliveries/{delivery}")

    # A status that is none is said on the page, with the form as it was typed.
    await page.goto(f"{base}/dashboard/endpoints/default/flaky/attempts")
    assert await cells(page, "attempts", 6) == ["204", "500", "503"]
    await page.fill("input[name=status]", "5x")
    async with page.expect_response(re.compile(r".*/attempts\?.*status=5x&.*")) as answer:
        await page.click("form.search button[type=submit]")
    assert (await answer.value).status == 422
    assert await page.text_content("[role=alert]") == (
        "status must be an HTTP status (503) or a class of them (5xx), not '5x'"
    )
    assert await page.input_value("input[name=status]") == "5x"
    assert await page.locator("table.attempts").count() == 0

    # The deliveries list filters on the last attempt: 204 now, no 5xx.
    await page.goto(f"{base}/dashboard/endpoints/default/flaky")
    await page.fill("input[name=status]", "5xx")
    await page.click("form.search button[type=submit]")
    await page.wait_for_selector("p.empty:text-is('No deliveries match the filter.')")
    await page.fill("input[name=status]", "204")
    await page.click("form.search button[type=submit]")
    await page.wait_for_selector(f"tr[data-delivery='{delivery}']")


async def test_resend_one_dead_delivery_then_all_of_them_from_the_browser(
    base: str, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    events = await dead_until_fixed(db, receiver, start_worker, 3)
    first, *rest = await dead_ids(db)

    await log_in(page, base)
    assert await page.locator("table.endpoints tbody tr td:nth-child(6)").text_content() == "3"
    await page.click("a[href='/dashboard/endpoints/default/orders']")
    await page.select_option("select[name=state]", "dead")
    await page.click("form.search button[type=submit]")
    await page.wait_for_url(re.compile(r".*\?state=dead&.*"))
    assert await page.locator("table.deliveries tbody tr").count() == 3

    await page.click(f"tr[data-delivery='{first}'] button:text-is('Resend')")
    await page.wait_for_selector(f".flash:text-is('Delivery {first} queued again.')")
    event = await db.fetchval("SELECT event_id FROM deliveries WHERE id = $1", first)
    await wait_for(lambda: webhook_ids(receiver, "orders").count(event) == 2)
    # The redirect kept the filter; the page refreshes itself: unfiltered,
    # the delivery shows delivered.
    assert await page.input_value("select[name=state]") == "dead"
    await page.click("form.search a:text-is('all deliveries')")
    await page.wait_for_selector(f"tr[data-delivery='{first}'].state-delivered", timeout=WAIT_MS)

    await page.click("button:text-is('Resend all 2 dead')")
    await page.wait_for_selector(".flash:text-is('2 dead deliveries queued again.')")
    await wait_for(lambda: sorted(set(webhook_ids(receiver, "orders"))) == sorted(events))
    for delivery in rest:
        await page.wait_for_selector(f"tr[data-delivery='{delivery}'].state-delivered")
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'delivered'") == 3
    # Nothing left to resend: the button is gone.
    assert await page.locator("button:has-text('Resend all')").count() == 0


async def test_resend_a_dead_delivery_from_its_own_page(
    base: str, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    await dead_until_fixed(db, receiver, start_worker, 1)
    [dead] = await dead_ids(db)

    await log_in(page, base)
    await page.goto(f"{base}/dashboard/endpoints/default/orders/deliveries/{dead}")
    assert await cells(page, "attempts", 5) == ["413"]
    assert await cells(page, "attempts", 4) == ["dead"]
    await page.click("button:text-is('Resend')")
    await page.wait_for_selector(f".flash:text-is('Delivery {dead} queued again.')")
    assert page.url == f"{base}/dashboard/endpoints/default/orders/deliveries/{dead}"
    # A resend counts its attempts from 1 again; the page refreshes itself.
    await page.wait_for_selector("h1 .state:text-is('delivered')")
    assert await cells(page, "attempts", 1) == ["1", "1"]
    assert await cells(page, "attempts", 5) == ["413", "200"]


async def test_reactivate_a_deactivated_endpoint_from_the_browser(
    base: str, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    # 410 Gone deactivates the endpoint, for real, and kills the delivery.
    back = asyncio.Event()
    url = receiver.on("gone", lambda _n: Answer(200 if back.is_set() else 410))
    await add_endpoint(db, "gone", url)
    [event] = await publish(db)
    start_worker()
    await wait_for(lambda: db.fetchval("SELECT state = 'deactivated' FROM endpoints"))
    back.set()

    await log_in(page, base)
    assert await page.locator("table.endpoints .phase").text_content() == "Deactivated"
    await page.click("a[href='/dashboard/endpoints/default/gone']")
    assert "410" in (await page.locator("dl.facts").text_content() or "")

    await page.click("button:text-is('Reactivate')")
    await page.wait_for_selector(
        ".flash:text-is('Endpoint reactivated: its pending deliveries go out again.')"
    )
    assert await page.locator("h1 .phase").text_content() == "Active"
    assert await page.locator("button:text-is('Reactivate')").count() == 0
    assert await db.fetchval("SELECT state FROM endpoints") == "active"

    await page.click("button:text-is('Resend all 1 dead')")
    await wait_for(lambda: webhook_ids(receiver, "gone") == [event, event])
    await page.wait_for_selector("table.deliveries tr.state-delivered")


async def test_a_change_posted_from_another_site_with_the_cookie_is_refused(
    base: str, page: Page, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    url = receiver.on("orders", Answer(413))
    await add_endpoint(db, "orders", url)
    await publish(db)
    worker = start_worker()
    await wait_for(lambda: _count(dead_ids(db), 1))
    await worker.stop()
    await log_in(page, base)

    # Another origin on the same host: the same *site*, so SameSite=Strict
    # lets the cookie ride along; only the origin check stands in the way.
    hostile = web.Application()
    form = (
        f'<form method="post" action="{base}/dashboard/endpoints/default/orders/resend">'
        '<button type="submit">win a prize</button></form>'
    )

    async def hostile_page(_request: web.Request) -> web.Response:
        return web.Response(text=form, content_type="text/html")

    hostile.router.add_get("/", hostile_page)
    server = TestServer(hostile, host="127.0.0.1")
    await server.start_server()
    try:
        await page.goto(str(server.make_url("/")))
        async with page.expect_response(f"{base}/dashboard/endpoints/default/orders/resend") as answer:
            await page.click("button")
        refused = await answer.value
        assert refused.status == 403
        assert (await refused.json())["error"] == "cross_origin"
        # Refused for its origin, not for a missing cookie (that is a 401).
        assert (await refused.request.all_headers())["cookie"].startswith(SESSION_COOKIE)
    finally:
        await server.close()
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'dead'") == 1
