"""The dashboard (``/dashboard``) in a real browser: Debian's chromium driven
by Playwright, the real ``hooklane api`` application on loopback, real
Postgres, a real worker and real receivers."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Page

import hooklane
from hooklane import store
from hooklane.api import dashboard, inputs, pages
from hooklane.api.app import make_app
from hooklane.api.auth import SESSION_COOKIE
from hooklane.api.tokens import TokenSource
from hooklane.checks import check_url
from hooklane.delivery import DeliverySpec
from hooklane.dev.postgres import free_port
from hooklane.errors import InvalidInput
from hooklane.health import EndpointHealth
from hooklane.policies import CircuitPolicy
from hooklane.results import Result
from hooklane.settings import Settings
from hooklane.spec import EndpointSpec
from hooklane.tokens import Tokens
from testsupport.dashboard import (
    ADMIN_TOKEN,
    INGEST_TOKEN,
    WAIT_MS,
    StartServer,
    _count,
    cells,
    dead_ids,
    dead_until_fixed,
    log_in,
    publish,
    webhook_ids,
)
from testsupport.fixtures import SECRET, add_endpoint, flaky_history, reserve_round, wait_for
from testsupport.receivers import Answer, Receiver


@pytest.fixture
async def base(start_dashboard: StartServer) -> str:
    return await start_dashboard()


def endpoint_rows(page: Page) -> Any:
    return page.locator("table.endpoints tbody tr")


# --------------------------------------------------------------------------
# Logging in and out


@pytest.mark.browser
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


@pytest.mark.db
async def test_the_cookie_is_secure_behind_an_ingress_that_terminated_tls(base: str) -> None:
    async with aiohttp.ClientSession() as http:
        answer = await http.post(
            f"{base}/dashboard/login",
            data={"token": ADMIN_TOKEN},
            headers={"Origin": base, "X-Forwarded-Proto": "https"},
            allow_redirects=False,
        )
    assert answer.status == 303
    cookie = answer.cookies[SESSION_COOKIE]
    assert cookie["secure"] and cookie["httponly"] and cookie["samesite"] == "Strict"


@pytest.mark.db
async def test_a_login_from_another_site_is_refused(base: str) -> None:
    async with aiohttp.ClientSession() as http:
        for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}, {}):
            answer = await http.post(
                f"{base}/dashboard/login", data={"token": ADMIN_TOKEN}, headers=headers, allow_redirects=False
            )
            assert answer.status == 403, headers
            assert SESSION_COOKIE not in answer.cookies


@pytest.mark.db
async def test_without_admin_tokens_the_dashboard_is_off(settings: Settings) -> None:
    pool = await store.create_pool(settings.database_url, min_size=0, max_size=1)
    app = make_app(
        settings,
        pool,
        TokenSource(Tokens.parse(INGEST_TOKEN, "test"), None, "test"),
        TokenSource(Tokens(), None, "test"),
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            for path in ("/dashboard", "/dashboard/login"):
                async with http.get(server.make_url(path), allow_redirects=False) as answer:
                    assert answer.status == 404, path
    finally:
        await server.close()
        await pool.close()


# --------------------------------------------------------------------------
# What the pages show


@pytest.mark.browser
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


async def shown(page: Page) -> list[str]:
    names = await endpoint_rows(page).evaluate_all("rows => rows.map(r => r.dataset.endpoint)")
    return [n.removeprefix("default/") for n in names]


@pytest.mark.browser
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


@pytest.mark.browser
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


@pytest.mark.browser
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


@pytest.mark.browser
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


@pytest.mark.db
async def test_an_unknown_endpoint_or_filter_is_answered_in_html(base: str, db: asyncpg.Connection) -> None:
    await add_endpoint(db, "orders", "http://127.0.0.1:9/orders")
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession(headers=auth) as http:
        for path in ("", "/attempts", "/deliveries/1", "?state=lost"):
            async with http.get(f"{base}/dashboard/endpoints/default/nowhere{path}") as answer:
                assert answer.status == 404, path
                assert answer.content_type == "text/html"
                assert "There is no endpoint default/nowhere." in await answer.text()
        for query, said in (
            ("?state=lost", "state must be among"),
            (
                "?status=6xx",
                "status must be an HTTP status (503) or a class of them (5xx), not &#39;6xx&#39;",
            ),
            ("?failure=sad", "failure must be among timeout"),
            ("?before=nope", "before is not a cursor"),
            ("/attempts?outcome=won", "outcome must be among delivered"),
            ("/attempts?since=yesterday", "since must be an RFC 3339 time"),
            ("/attempts?until=2026-03-01T12:00:00", "until needs a timezone"),
            ("/attempts?since=2026-03-01T13:00:00Z&until=2026-03-01T12:00:00Z", "since must be before until"),
            ("/attempts?after=nope", "after is not a cursor"),
        ):
            async with http.get(f"{base}/dashboard/endpoints/default/orders{query}") as answer:
                body = await answer.text()
            # The endpoint's page, its form as sent and what is wrong with
            # it; it does not refresh itself.
            assert answer.status == 422, query
            assert said in body, (query, body)
            assert "<h1>" in body and "dashboard.js" not in body and "Traceback" not in body


@pytest.mark.db
async def test_a_database_out_of_reach_is_a_page_that_retries(start_dashboard: StartServer) -> None:
    base = await start_dashboard(database_url=f"postgresql://postgres@127.0.0.1:{free_port()}/hooklane")
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession(headers=auth) as http, http.get(f"{base}/dashboard") as answer:
        body = await answer.text()
    assert answer.status == 503
    assert answer.headers["Retry-After"] == str(pages.REFRESH_SECONDS)
    assert "Database unavailable" in body and 'http-equiv="refresh"' in body
    assert "Traceback" not in body


@pytest.mark.browser
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


@pytest.mark.browser
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


# --------------------------------------------------------------------------
# Attempts: a delivery's timeline, an endpoint's over a time window


@pytest.mark.browser
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


@pytest.mark.db
async def test_a_delivery_of_another_endpoint_or_a_malformed_id_is_not_found(
    base: str, db: asyncpg.Connection
) -> None:
    await add_endpoint(db, "orders", "http://127.0.0.1:9/orders")
    await add_endpoint(db, "billing", "http://127.0.0.1:9/billing", event_types=("invoice.paid",))
    await publish(db)
    delivery = await db.fetchval("SELECT id FROM deliveries")
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession(headers=auth) as http:
        async with http.get(f"{base}/dashboard/endpoints/default/orders/deliveries/{delivery}") as answer:
            assert answer.status == 200
            assert "No attempt recorded yet." in await answer.text()
        # An attempt whose lease ran out, traced: its failure class and trace id.
        await db.execute(
            """INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,
                                              started_at, outcome, failure, error, trace_id)
               SELECT id, 1, endpoint_id, event_tenant, event_id, now(), 'retry', 'lease_expired',
                      'the lease ran out', '4bf92f3577b34da6a3ce929d0e0e4736'
               FROM deliveries""",
        )
        async with http.get(f"{base}/dashboard/endpoints/default/orders/deliveries/{delivery}") as answer:
            body = await answer.text()
        assert "lease_expired" in body and "lease ran out" in body
        assert '<code class="trace">4bf92f3577b34da6a3ce929d0e0e4736</code>' in body
        for path in (f"billing/deliveries/{delivery}", f"orders/deliveries/{delivery + 1}"):
            async with http.get(f"{base}/dashboard/endpoints/default/{path}") as answer:
                assert answer.status == 404, path
                assert "No such delivery" in await answer.text()
        for malformed in ("abc", "-1", "0", "9" * 30):
            async with http.get(
                f"{base}/dashboard/endpoints/default/orders/deliveries/{malformed}"
            ) as answer:
                body = await answer.text()
                assert answer.status == 404, malformed
                assert "No such delivery" in body and "Traceback" not in body


# --------------------------------------------------------------------------
# Repairing, with a worker delivering for real


@pytest.mark.browser
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


@pytest.mark.browser
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


@pytest.mark.db
async def test_reactivating_an_active_endpoint_resets_nothing(base: str, db: asyncpg.Connection) -> None:
    await add_endpoint(db, "failing", "http://127.0.0.1:9/failing")
    await db.execute(
        "UPDATE endpoints SET consecutive_failures = 4, failing_since = now() - interval '1 hour'"
    )
    circuit = "SELECT state, consecutive_failures, failing_since, updated_at FROM endpoints"
    before = await db.fetchrow(circuit)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        aiohttp.ClientSession(headers=auth) as http,
        http.post(f"{base}/dashboard/endpoints/default/failing/reactivate", allow_redirects=False) as answer,
    ):
        assert answer.status == 303
        flash = answer.cookies[dashboard.FLASH_COOKIE].value
    assert dashboard.flash_message(flash) == (
        "The endpoint is not deactivated: nothing to reactivate, its circuit is left as it is."
    )
    assert await db.fetchrow(circuit) == before


@pytest.mark.browser
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


@pytest.mark.browser
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


# --------------------------------------------------------------------------
# Pure helpers


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (-3, "0 ms"),
        (0.25, "250 ms"),
        (42.9, "42 s"),
        (60, "1 min"),
        (243, "4 min 3 s"),
        (7500, "2 h 5 min"),
        (3 * 86400 + 4 * 3600 + 59, "3 d 4 h"),
    ],
)
def test_age_text(seconds: float | None, shown: str) -> None:
    assert pages.age_text(seconds) == shown


def test_relative_text() -> None:
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert pages.relative_text(None, now) == "-"
    assert pages.relative_text(now + timedelta(seconds=12), now) == "in 12 s"
    assert pages.relative_text(now - timedelta(minutes=3), now) == "3 min ago"
    assert pages.relative_text(now + timedelta(milliseconds=300), now) == "now"


NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


def health(**row: Any) -> EndpointHealth:
    """An endpoint's health at NOW, active and signed unless ``row`` says."""
    base = dict.fromkeys(
        (
            "sending_on",
            "paused_until",
            "last_error",
            "last_delivered_at",
            "deactivated_reason",
            "throttled_until",
            "rate_per_second",
            "oldest_pending_age",
        ),
    )
    base.update(id=1, namespace="default", name="orders", tenant="acme", url="https://x.example/h")
    base.update(state="active", paused=False, signed=True, max_concurrency=4, effective_concurrency=4)
    base.update(adaptive_concurrency=False, rate_burst=1, pending=1, in_flight=0, dead=0)
    base.update(consecutive_failures=0, observed_at=NOW, counted_at=NOW)
    return EndpointHealth.from_row({**base, **row})


@pytest.mark.parametrize(
    ("due", "row", "held", "at", "text"),
    [
        (-21, {}, None, -21, "due 21 s ago"),
        (-0.5, {}, None, -0.5, "due now"),
        (40, {}, None, 40, "in 40 s"),
        # The report's: due 21 s ago, the circuit's next probe in 36 s.
        (
            -21,
            {"paused_until": NOW + timedelta(seconds=36), "consecutive_failures": 20},
            "after the circuit's pause",
            36,
            "in 36 s",
        ),
        # A retry later than the pause's end keeps its own time.
        (90, {"paused_until": NOW + timedelta(seconds=36)}, None, 90, "in 1 min 30 s"),
        # Probing: the pause is over, the delivery goes as it is due.
        (-5, {"paused_until": NOW - timedelta(seconds=1)}, None, -5, "due 5 s ago"),
        (
            -3,
            {"throttled_until": NOW + timedelta(seconds=8)},
            "after the receiver's hold (its Retry-After, or an overload)",
            8,
            "in 8 s",
        ),
        (-3, {"state": "deactivated"}, "once the endpoint is reactivated", None, ""),
        (
            -3,
            {"paused": True, "paused_until": NOW + timedelta(seconds=36)},
            "once the endpoint is resumed",
            None,
            "",
        ),
        (-3, {"signed": False}, "once the endpoint has a signing secret", None, ""),
    ],
)
def test_a_pending_deliverys_next_attempt_is_when_its_endpoint_lets_it_go(
    due: float, row: dict[str, Any], held: str | None, at: float | None, text: str
) -> None:
    shown = pages.next_attempt(NOW + timedelta(seconds=due), health(**row))
    assert shown == pages.NextAttempt(None if at is None else NOW + timedelta(seconds=at), held, text)
    assert pages.next_attempt(None, health(**row)) is None


def test_short_text_cuts_with_an_ellipsis() -> None:
    assert pages.short_text(None) == ""
    assert pages.short_text("x" * 80) == "x" * 80
    assert pages.short_text("x" * 81) == "x" * 79 + "\u2026"


def test_flash_messages_come_only_from_known_values() -> None:
    assert dashboard.flash_message(pages.flash_value("resent", 3)) == "3 dead deliveries queued again."
    assert dashboard.flash_message(pages.flash_value("resent", 1)) == "1 dead delivery queued again."
    assert dashboard.flash_message(pages.flash_value("resent", 0)) == "No dead deliveries to resend."
    assert dashboard.flash_message(pages.flash_value("resent-one", 7)) == "Delivery 7 queued again."
    assert dashboard.flash_message("not-dead.7").startswith("Delivery 7 is not dead any more")
    for forged in (None, "", "you have been hacked", "resent.1 <b>", "resent." + "9" * 40):
        assert dashboard.flash_message(forged) is None


@pytest.mark.parametrize(
    ("scheme", "forwarded", "secure"),
    [
        ("https", None, True),
        ("http", None, False),
        ("http", "https", True),
        ("http", "HTTPS, http", True),
        ("http", "http", False),
        ("http", "", False),
    ],
)
def test_is_https(scheme: str, forwarded: str | None, secure: bool) -> None:
    assert pages.is_https(scheme, forwarded) is secure


def test_the_filters_keep_what_was_chosen_and_default_to_the_last_hour() -> None:
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    chosen = dashboard.attempt_filter({"status": "5xx", "failure": "", "outcome": ""}, now)
    assert (chosen.since, chosen.until) == (now - timedelta(hours=1), now)
    assert chosen.query() == [
        ("since", "2026-03-01T11:00:00Z"),
        ("until", "2026-03-01T12:00:00Z"),
        ("status", "5xx"),
    ]
    later = dashboard.attempt_filter({"until": "2026-03-02T00:00:00+02:00", "outcome": "retry"}, now)
    assert later.since == datetime(2026, 3, 1, 21, tzinfo=UTC) and later.outcome == "retry"
    assert dashboard.delivery_filter({"state": "", "status": "503", "failure": "timeout"}).query() == [
        ("status", "503"),
        ("failure", "timeout"),
    ]
    assert dashboard.delivery_filter({}).query() == []
    for bad in ({"status": "5"}, {"failure": "sad"}, {"state": "lost"}):
        with pytest.raises(InvalidInput):
            dashboard.delivery_filter(bad)
    with pytest.raises(InvalidInput, match="before until"):
        dashboard.attempt_filter({"since": "2026-03-01T12:00:00Z"}, now)
    # The range bounds the walk over the history, as in the admin API.
    with pytest.raises(InvalidInput, match="at most 31 days"):
        dashboard.attempt_filter({"since": "2026-01-01T00:00:00Z"}, now)
    # An hour before the first hour of year 1 does not exist: clamped.
    earliest = dashboard.attempt_filter({"until": "0001-01-01T00:10:00Z"}, now)
    assert earliest.since < earliest.until


def test_form_and_query_inputs_are_checked() -> None:
    # The dashboard's delivery ids are the API's and the CLI's (store.check_delivery_id).
    assert inputs.delivery_id("42") == 42
    for bad in ("", "-1", "4.2", "1" * 20, "9223372036854775808", "٣"):
        with pytest.raises(InvalidInput, match="delivery id"):
            inputs.delivery_id(bad)
    assert pages.state_filter(None) is None
    assert pages.state_filter("dead") == "dead"
    with pytest.raises(InvalidInput, match=re.escape("must be among")):
        pages.state_filter("lost")
