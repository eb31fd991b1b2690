"""The dashboard (``/dashboard``) over plain HTTP, on a real Postgres: its
cookie and login checks, its pages when off or when the database is out of
reach, and what it answers for what is not there. In a browser:
tests/browser/test_dashboard.py."""

from __future__ import annotations

import aiohttp
import asyncpg
from aiohttp.test_utils import TestServer

from hooklane import store
from hooklane.api import dashboard, pages
from hooklane.api.app import make_app
from hooklane.api.auth import SESSION_COOKIE
from hooklane.api.tokens import TokenSource
from hooklane.dev.postgres import free_port
from hooklane.settings import Settings
from hooklane.tokens import Tokens
from testsupport.dashboard import (
    ADMIN_TOKEN,
    INGEST_TOKEN,
    StartServer,
    publish,
)
from testsupport.fixtures import add_endpoint


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


async def test_a_login_from_another_site_is_refused(base: str) -> None:
    async with aiohttp.ClientSession() as http:
        for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}, {}):
            answer = await http.post(
                f"{base}/dashboard/login", data={"token": ADMIN_TOKEN}, headers=headers, allow_redirects=False
            )
            assert answer.status == 403, headers
            assert SESSION_COOKIE not in answer.cookies


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


async def test_a_database_out_of_reach_is_a_page_that_retries(start_dashboard: StartServer) -> None:
    base = await start_dashboard(database_url=f"postgresql://postgres@127.0.0.1:{free_port()}/hooklane")
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession(headers=auth) as http, http.get(f"{base}/dashboard") as answer:
        body = await answer.text()
    assert answer.status == 503
    assert answer.headers["Retry-After"] == str(pages.REFRESH_SECONDS)
    assert "Database unavailable" in body and 'http-equiv="refresh"' in body
    assert "Traceback" not in body


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
