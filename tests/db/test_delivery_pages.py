"""What the delivery pages of the dashboard and the portal show of a
delivery's request, over real HTTP on a real Postgres: the body a real
receiver on loopback got from a real worker, its headers without secrets,
the download of the whole body, one tenant's only; when a resent delivery
was first created; and the dashboard's counts per event type. In a
browser: tests/browser/test_delivery_pages.py."""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient

import hooklane
from hooklane.api import dashboard
from hooklane.api.auth import PORTAL_COOKIE
from hooklane.api.pages import HIDDEN, PAYLOAD_SHOWN_BYTES, pretty_json
from hooklane.delivery import DeliverySpec, HeaderSpec, SecretKeyRef, resolve
from hooklane.settings import Settings
from hooklane.times import rfc3339
from testsupport.api import ADMIN, ADMIN_AUTH, INGEST, NOWHERE, dead_delivery, grant
from testsupport.fixtures import add_endpoint, in_process_api, wait_for
from testsupport.receivers import Answer, Received, Receiver

# Credentials of the endpoint's own headers, which no page may show.
API_KEY = "key-read-from-a-secret-0123"
BEARER = "Bearer token-of-the-receiver-4567"
# One read from a Secret, one written in the manifest, and a credential
# written there: as the operator resolves them.
DELIVERY = DeliverySpec(
    headers=(
        HeaderSpec("X-Api-Key", secret=SecretKeyRef("receiver", "key")),
        HeaderSpec("X-Team", "payments"),
        HeaderSpec("Authorization", BEARER),
    )
)
TERMS = resolve(DELIVERY, "default", {"receiver": {"key": API_KEY}}.get)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
async def api(dsn: str, settings: Settings) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    configured = replace(settings, portal_endpoints="local", portal_https_only=False)
    async with in_process_api(dsn, configured, INGEST, ADMIN) as client:
        yield client


async def faces(api: TestClient, tenant: str = "acme") -> list[tuple[str, dict[str, str]]]:  # type: ignore[type-arg]
    """Each face's home and what authenticates it: the admin's token, and
    a session of ``tenant`` (a tenant token is one)."""
    session = (await grant(api, tenant))["token"]
    return [("/dashboard", ADMIN_AUTH), ("/portal", {"Cookie": f"{PORTAL_COOKIE}={session}"})]


async def get(api: TestClient, path: str, headers: dict[str, str]) -> tuple[int, str]:  # type: ignore[type-arg]
    response = await api.get(path, headers=headers, allow_redirects=False)
    body = await response.text()
    api.session.cookie_jar.clear()
    return response.status, body


def payload_shown(page: str) -> str:
    found = re.search(r'<pre class="payload"><code>(.*?)</code></pre>', page, re.S)
    assert found is not None, page
    return html.unescape(found[1])


def headers_shown(page: str) -> dict[str, str]:
    rows = re.findall(
        r'<tr data-header="([^"]+)">\s*<td><code>[^<]*</code></td>\s*<td><code class="value">([^<]*)</code>',
        page,
    )
    return {name: html.unescape(value) for name, value in rows}


async def delivered(
    db: asyncpg.Connection, receiver: Receiver, start_worker: Callable[..., Any], data: Any
) -> tuple[int, Received]:
    """``data`` published with a trace context to endpoint default/orders,
    whose own headers are ``TERMS``, and delivered by a real worker to a
    real receiver: the delivery's id and what the receiver got."""
    url = receiver.on("orders", lambda _n: Answer(204))
    await add_endpoint(db, "orders", url, terms=TERMS)
    await hooklane.publish(
        db, tenant="acme", type="order.created", data=data, id="evt-1", traceparent=TRACEPARENT
    )
    start_worker()
    await wait_for(lambda: db.fetchval("SELECT state = 'delivered' FROM deliveries"))
    [got] = receiver.at("orders")
    return await db.fetchval("SELECT id FROM deliveries"), got


async def test_the_payload_and_headers_shown_are_what_a_real_receiver_got(
    api: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
    receiver: Receiver,
    start_worker: Callable[..., Any],
) -> None:
    # What a second print would change: numeric digits, key order, an
    # escaped line separator, markup.
    data = {
        "order": {"total": 1.10, "big": 2**62, "tiny": 1e-7, "note": "é\u2028<b>&amp;"},
        "lines": [],
        "meta": {},
    }
    delivery, got = await delivered(db, receiver, start_worker, data)
    sent = {name.lower(): value for name, value in got.headers.items()}
    for home, auth in await faces(api):
        path = f"{home}/endpoints/default/orders/deliveries/{delivery}"
        status, page = await get(api, path, auth)
        assert status == 200, page
        assert payload_shown(page) == pretty_json(got.body.decode())
        assert json.loads(payload_shown(page)) == json.loads(got.body)
        assert f"{len(got.body)} bytes." in page
        shown = headers_shown(page)
        assert list(shown) == [
            "content-type",
            "user-agent",
            "x-api-key",
            "x-team",
            "authorization",
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
            "traceparent",
        ]
        for name in ("content-type", "user-agent", "x-team", "webhook-id", "traceparent"):
            assert shown[name] == sent[name], name
        # Set by the attempt as it started, within the same second or so.
        assert abs(int(shown["webhook-timestamp"]) - int(sent["webhook-timestamp"])) <= 1
        for name in ("x-api-key", "authorization", "webhook-signature"):
            assert shown[name] == HIDDEN, name
        for secret in (API_KEY, "token-of-the-receiver", sent["webhook-signature"].removeprefix("v1,")):
            assert secret not in page
        assert 'href="' + path + '/payload"' in page

        response = await api.get(path + "/payload", headers=auth)
        assert response.status == 200
        assert await response.read() == got.body
        assert response.headers["Content-Type"] == "application/json"
        assert response.headers["Content-Disposition"] == f'attachment; filename="delivery-{delivery}.json"'
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]


async def test_a_large_payload_is_shown_in_part_and_downloaded_whole(
    api: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
    receiver: Receiver,
    start_worker: Callable[..., Any],
) -> None:
    data = {"rows": [{"n": i, "text": "é" * 40} for i in range(1500)]}
    delivery, got = await delivered(db, receiver, start_worker, data)
    assert len(got.body) > 2 * PAYLOAD_SHOWN_BYTES
    for home, auth in await faces(api):
        path = f"{home}/endpoints/default/orders/deliveries/{delivery}"
        status, page = await get(api, path, auth)
        assert status == 200
        # Cut at a byte inside a two-byte character: that character is left out.
        head = got.body[:PAYLOAD_SHOWN_BYTES].decode(errors="ignore")
        assert payload_shown(page) == pretty_json(head)
        assert f"The first 64.0 KiB of {len(got.body) / 1024:.1f} KiB ({len(got.body)} bytes)." in page
        assert "Cut here: the rest is in the download." in page
        response = await api.get(path + "/payload", headers=auth)
        assert await response.read() == got.body


async def test_another_tenants_delivery_and_payload_are_not_found(
    api: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    ids = {}
    for tenant in ("acme", "globex"):
        await add_endpoint(db, f"{tenant}-orders", NOWHERE, tenant=tenant)
        ids[tenant] = await dead_delivery(db, tenant, f"{tenant}-orders")
    [_, (home, acme)] = await faces(api, "acme")
    for path in (
        f"/endpoints/default/globex-orders/deliveries/{ids['globex']}",
        f"/endpoints/default/globex-orders/deliveries/{ids['globex']}/payload",
        # Its own endpoint's path, another's delivery.
        f"/endpoints/default/acme-orders/deliveries/{ids['globex']}/payload",
        f"/endpoints/default/acme-orders/deliveries/{int(ids['acme']) + 99}/payload",
        "/endpoints/default/acme-orders/deliveries/nope/payload",
    ):
        status, page = await get(api, home + path, acme)
        assert status == 404, path
        assert "globex" not in page.replace("globex-orders", "") and "Traceback" not in page
    status, _ = await get(api, f"{home}/endpoints/default/acme-orders/deliveries/{ids['acme']}/payload", acme)
    assert status == 200
    # The admin reads every tenant's.
    status, body = await get(
        api, f"/dashboard/endpoints/default/globex-orders/deliveries/{ids['globex']}/payload", ADMIN_AUTH
    )
    assert (status, json.loads(body)["data"]) == (200, {"t": "globex"})


async def test_a_resent_delivery_shows_when_it_was_first_created(
    api: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    await add_endpoint(db, "orders", NOWHERE)
    delivery = await dead_delivery(db, "acme", "orders")
    made = await db.fetchval(
        "UPDATE deliveries SET created_at = created_at - interval '2 hours' RETURNING created_at"
    )
    for home, auth in await faces(api):
        status, page = await get(api, f"{home}/endpoints/default/orders/deliveries/{delivery}", auth)
        assert status == 200
        assert '<div class="created"><dt>Created</dt>' in page and "First created" not in page

    response = await api.post(
        f"/v1/admin/endpoints/default/orders/deliveries/{delivery}/resend", headers=ADMIN_AUTH
    )
    assert response.status == 200, await response.text()
    resent = await db.fetchval("SELECT created_at FROM deliveries")
    assert resent > made
    for home, auth in await faces(api):
        status, page = await get(api, f"{home}/endpoints/default/orders/deliveries/{delivery}", auth)
        assert (
            f'<div class="first-created"><dt>First created</dt><dd><time datetime="{rfc3339(made)}"' in page
        )
        assert f'<div class="resent"><dt>Resent</dt><dd><time datetime="{rfc3339(resent)}"' in page
    # The admin API's detail says the same: created_at the first creation.
    response = await api.get(f"/v1/admin/endpoints/default/orders/deliveries/{delivery}", headers=ADMIN_AUTH)
    shown = (await response.json())["delivery"]
    assert (shown["created_at"], shown["queued_at"]) == (rfc3339(made), rfc3339(resent))


def type_rows(page: str) -> list[tuple[str, ...]]:
    rows = re.findall(r'<tr data-type="([^"]+)">(.*?)</tr>', page, re.S)
    return [(name, *re.findall(r'<td class="num[^"]*">(\d+)</td>', cells)) for name, cells in rows]


async def test_the_dashboard_counts_unrouted_and_refused_events_per_type(
    api: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    await add_endpoint(db, "orders", NOWHERE, event_types=("order.created",))
    await hooklane.publish(db, tenant="acme", type="order.created", data={})
    for i, (tenant, kind) in enumerate(
        [("acme", "order.payed")] * 3 + [("globex", "order.payed"), ("acme", "x.y")]
    ):
        await hooklane.publish(db, tenant=tenant, type=kind, data={}, id=f"u{i}")
    # Kept from before the last day: counted in all, not in the day.
    await db.execute("UPDATE events SET created_at = now() - interval '3 days' WHERE id = 'u0'")
    now = datetime.now(UTC)
    refusals = [
        ("order.payed", "unknown", now - timedelta(hours=1)),
        ("order.payed", "unknown", now - timedelta(hours=2)),
        ("order.shipped", "archived", now - timedelta(minutes=5)),
        ("order.shipped", "schema", now - timedelta(minutes=5)),
        ("order.shipped", "schema", now - timedelta(minutes=6)),
        # Before the last day: not shown.
        ("old.type", "schema", now - timedelta(days=2)),
    ]
    await db.executemany(
        "INSERT INTO catalogue_refusals (tenant, type, reason, refused_at, message) VALUES ('acme', $1, $2, $3, 'm')",
        refusals,
    )
    status, page = await get(api, "/dashboard/event-types", ADMIN_AUTH)
    assert status == 200, page
    # type, unrouted in the day and retained, refused in the day and by
    # reason, warned and deprecated in the day.
    assert type_rows(page) == [
        ("order.payed", "3", "4", "2", "2", "0", "0", "0", "0"),
        ("order.shipped", "0", "0", "3", "0", "1", "2", "0", "0"),
        ("x.y", "1", "1", "0", "0", "0", "0", "0", "0"),
    ]
    assert "Types 1 to 3 of 3" in page and 'class="next"' not in page
    # Every dashboard page links to it.
    _, home = await get(api, "/dashboard", ADMIN_AUTH)
    assert 'href="/dashboard/event-types"' in home


async def test_the_event_types_are_paged(
    api: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    count = dashboard.TYPES_PER_PAGE + 5
    await db.execute(
        """INSERT INTO catalogue_refusals (tenant, type, reason, message)
           SELECT 'acme', format('type.%s', lpad(n::text, 3, '0')), 'unknown', 'm'
           FROM generate_series(1, $1) n, generate_series(1, n) times""",
        count,
    )
    status, first = await get(api, "/dashboard/event-types", ADMIN_AUTH)
    assert status == 200
    rows = type_rows(first)
    # The most refused first.
    assert [r[0] for r in rows[:2]] == [f"type.{count:03d}", f"type.{count - 1:03d}"]
    assert len(rows) == dashboard.TYPES_PER_PAGE
    assert f"Types 1 to {dashboard.TYPES_PER_PAGE} of {count}" in first
    assert 'href="/dashboard/event-types?page=2"' in first
    _, second = await get(api, "/dashboard/event-types?page=2", ADMIN_AUTH)
    assert [r[0] for r in type_rows(second)] == [f"type.{n:03d}" for n in range(5, 0, -1)]
    assert 'href="/dashboard/event-types?page=1"' in second and 'class="next"' not in second
    for bad in ("0", "x", "-1", "99999", str(dashboard.MAX_TYPE_PAGE + 1)):
        status, page = await get(api, f"/dashboard/event-types?page={bad}", ADMIN_AUTH)
        assert status == 422, bad
        assert "page must be a page number from 1 to" in page and "Traceback" not in page
    # A tenant's session is no admin's.
    [_, (_, acme)] = await faces(api)
    status, _ = await get(api, "/dashboard/event-types", acme)
    assert status in (401, 303)


async def test_the_values_of_terms_stored_before_secrets_were_marked_are_all_hidden(
    api: TestClient,  # type: ignore[type-arg]
    db: asyncpg.Connection,
) -> None:
    await add_endpoint(db, "orders", NOWHERE, terms=TERMS)
    delivery = await dead_delivery(db, "acme", "orders")
    # As a release before the mark wrote them (no key: no keyring either).
    assert TERMS is not None
    await db.execute(
        "UPDATE endpoints SET request_terms = $1",
        json.dumps({k: v for k, v in json.loads(TERMS.to_json()).items() if k != "secret_headers"}),
    )
    for home, auth in await faces(api):
        _, page = await get(api, f"{home}/endpoints/default/orders/deliveries/{delivery}", auth)
        shown = headers_shown(page)
        assert [shown[n] for n in ("x-api-key", "x-team", "authorization")] == [HIDDEN] * 3
        assert "payments" not in page
