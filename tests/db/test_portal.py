"""The tenant portal (``/portal``) over real HTTP on a real Postgres: its
single-use links, sessions and their cookies, the headers that let the
platform frame it (and no one else), the rights of each grant, and the rule
every route keeps: another tenant's endpoint or delivery renders exactly as
one that does not exist, and changes nothing."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestClient

import hooklane
from hooklane.api import browser
from hooklane.api import portal as pages
from hooklane.api.auth import PORTAL_COOKIE, Audience
from hooklane.selfservice import resource_name
from hooklane.settings import Settings
from hooklane.store import grants
from hooklane.times import rfc3339
from testsupport.api import ADMIN, ADMIN_AUTH, INGEST, NOWHERE, dead_delivery, filled, grant
from testsupport.fixtures import add_endpoint, in_process_api
from testsupport.portal import OWN_URL, PLATFORM


@pytest.fixture
async def api(dsn: str, settings: Settings) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    configured = replace(settings, portal_endpoints="local", portal_https_only=False)
    async with in_process_api(dsn, configured, INGEST, ADMIN) as client:
        yield client


async def call(
    api: TestClient,  # type: ignore[type-arg]
    method: str,
    path: str,
    session: str | None = None,
    *,
    data: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[aiohttp.ClientResponse, str]:
    """One request as a browser on the portal's own page sends it (unless
    ``headers`` say otherwise): with the session's cookie, a POST
    same-origin; redirects not followed. Cookies set by the answer are not
    kept: each call says its own."""
    if headers is None:
        headers = {"Sec-Fetch-Site": "same-origin"} if method == "POST" else {}
    if session is not None:
        headers = {**headers, "Cookie": f"{PORTAL_COOKIE}={session}"}
    response = await api.request(method, path, data=data, headers=headers, allow_redirects=False)
    body = await response.text()
    api.session.cookie_jar.clear()
    return response, body


async def session_of(api: TestClient, tenant: str, access: str = "read") -> str:  # type: ignore[type-arg]
    """A session of ``tenant``: a tenant token is one (the same grant)."""
    token: str = (await grant(api, tenant, access))["token"]
    return token


async def link_of(api: TestClient, tenant: str, access: str = "read") -> str:  # type: ignore[type-arg]
    path: str = (await grant(api, tenant, access, kind="link"))["path"]
    return path


async def two_tenants(db: asyncpg.Connection) -> dict[str, dict[str, str]]:
    """acme and globex, each with an endpoint the platform set up, an event
    and a dead delivery: their ids."""
    found: dict[str, dict[str, str]] = {}
    for tenant in ("acme", "globex"):
        name = f"{tenant}-orders"
        await add_endpoint(db, name, NOWHERE, tenant=tenant)
        found[tenant] = {"namespace": "default", "name": name, "id": await dead_delivery(db, tenant, name)}
    return found


def set_cookies(response: aiohttp.ClientResponse) -> dict[str, str]:
    """The Set-Cookie headers of an answer, by cookie name."""
    return {value.split("=", 1)[0]: value for value in response.headers.getall("Set-Cookie", [])}


def token_of(path: str) -> str:
    return path.rsplit("/", 1)[1]


async def enter(
    api: TestClient,  # type: ignore[type-arg]
    path: str,
    headers: dict[str, str] | None = None,
) -> tuple[aiohttp.ClientResponse, str]:
    return await call(api, "POST", pages.ENTER, data={"token": token_of(path)}, headers=headers)


# --- entering --------------------------------------------------------------------


async def test_a_get_of_the_link_uses_nothing_and_the_form_redeems_it_once(api, db):
    await add_endpoint(db, "orders", NOWHERE, tenant="acme")
    path = await link_of(api, "acme", "resend")
    for _ in range(3):
        # A prefetcher, a mail scanner, a chat preview.
        response, body = await call(api, "GET", path)
        assert response.status == 200
        assert response.headers["Referrer-Policy"] == "no-referrer"
        assert f'value="{token_of(path)}"' in body and 'action="/portal/enter"' in body
        assert "Set-Cookie" not in response.headers
    assert await db.fetchval("SELECT count(*) FROM portal_grants WHERE kind = 'link'") == 1

    response, _ = await enter(api, path)
    assert response.status == 303 and response.headers["Location"] == "/portal"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    cookie = set_cookies(response)[PORTAL_COOKIE]
    session = cookie.split(";")[0].split("=", 1)[1]
    assert session.startswith(grants.SESSION_PREFIX)
    assert await db.fetchval("SELECT count(*) FROM portal_grants WHERE kind = 'link'") == 0

    response, body = await call(api, "GET", "/portal", session)
    assert response.status == 200
    assert 'data-endpoint="default/orders"' in body and "acme" in body

    # The same link again, an unknown one and an expired one: one page.
    used, used_body = await enter(api, path)
    unknown, unknown_body = await enter(api, "/portal/enter/" + grants.LINK_PREFIX + "x" * 43)
    expired = await link_of(api, "acme")
    await db.execute("UPDATE portal_grants SET expires_at = now() - interval '1 s' WHERE kind = 'link'")
    late, late_body = await enter(api, expired)
    assert used.status == unknown.status == late.status == 404
    assert used_body == unknown_body == late_body
    assert "This link cannot be used" in used_body
    assert not any(PORTAL_COOKIE in set_cookies(r) for r in (used, unknown, late))


async def test_a_malformed_link_is_refused_on_sight(api):
    for token in ("x", grants.LINK_PREFIX, grants.LINK_PREFIX + "<script>" * 3, "hlps_" + "a" * 43):
        response, body = await call(api, "GET", "/portal/enter/" + token)
        assert response.status == 404, token
        assert "This link cannot be used" in body and "<script>" not in body


async def test_an_entry_posted_from_another_site_is_refused_and_leaves_the_link(api, db):
    path = await link_of(api, "acme")
    for headers in (
        {"Origin": "http://evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {},
    ):
        response, body = await enter(api, path, headers)
        assert response.status == 403, headers
        assert PORTAL_COOKIE not in set_cookies(response)
        assert "Open the portal through the link your platform gives you." in body
    response, _ = await enter(api, path)
    assert response.status == 303


async def test_entering_again_ends_the_session_the_browser_had(api, db):
    first = await session_of(api, "acme")
    response, _ = await call(
        api, "POST", pages.ENTER, first, data={"token": token_of(await link_of(api, "globex"))}
    )
    assert response.status == 303
    assert await grants.session_grant(db, first) is None


@pytest.mark.parametrize(
    ("ancestors", "forwarded", "attributes"),
    [
        ((), None, ["HttpOnly", "SameSite=Strict"]),
        ((), "https", ["HttpOnly", "SameSite=Strict", "Secure"]),
        # Framed over http: the platform's frame is on the same site or gets nothing anyway.
        ((PLATFORM,), None, ["HttpOnly", "SameSite=Strict"]),
        ((PLATFORM,), "https", ["HttpOnly", "SameSite=None", "Secure", "Partitioned"]),
    ],
)
async def test_the_session_cookie(dsn, settings, ancestors, forwarded, attributes):
    configured = replace(settings, portal_frame_ancestors=ancestors, portal_session_seconds=900)
    async with in_process_api(dsn, configured, INGEST, ADMIN) as api:
        headers = {"Sec-Fetch-Site": "same-origin"}
        if forwarded is not None:
            headers["X-Forwarded-Proto"] = forwarded
        response, _ = await enter(api, await link_of(api, "acme"), headers)
    assert response.status == 303
    name, *rest = [part.strip() for part in set_cookies(response)[PORTAL_COOKIE].split(";")]
    assert name.startswith(PORTAL_COOKIE + "=" + grants.SESSION_PREFIX)
    assert sorted(rest) == sorted(["Path=/portal", "Max-Age=900", *attributes])


async def test_log_out_ends_the_session_in_postgres(api, db):
    session = await session_of(api, "acme")
    response, body = await call(api, "POST", "/portal/logout", session)
    assert response.status == 200 and "Logged out" in body
    assert "Max-Age=0" in set_cookies(response)[PORTAL_COOKIE]
    assert await grants.session_grant(db, session) is None
    response, body = await call(api, "GET", "/portal", session)
    assert response.status == 401
    assert "open the portal from your platform again" in body


async def test_without_a_live_session_the_portal_says_so_in_html(api, db):
    expired = await session_of(api, "acme")
    await db.execute("UPDATE portal_grants SET expires_at = now() - interval '1 s'")
    for cookie in (None, "hlps_" + "x" * 43, expired, "something"):
        for method, path in (("GET", "/portal"), ("POST", "/portal/endpoints/default/x/resend")):
            response, body = await call(api, method, path, cookie)
            assert response.status == 401, (cookie, method)
            assert response.headers["Content-Type"].startswith("text/html")
            assert "Session ended" in body and "your platform" in body
            assert ("Max-Age=0" in set_cookies(response).get(PORTAL_COOKIE, "")) == (cookie is not None)
    # The tenant API keeps answering in JSON.
    response = await api.get("/v1/tenant/endpoints")
    assert response.status == 401 and (await response.json())["error"] == "unauthorized"


async def test_a_change_from_another_site_is_refused_in_html(api, db):
    ids = await two_tenants(db)
    session = await session_of(api, "acme", "resend")
    for headers in (
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {},
    ):
        response, body = await call(
            api, "POST", "/portal/endpoints/default/acme-orders/resend", session, headers=headers
        )
        assert response.status == 403, headers
        assert "a change must come from the page" in body.lower()
    assert await db.fetchval("SELECT state FROM deliveries WHERE id = $1", int(ids["acme"]["id"])) == "dead"


# --- headers and branding ----------------------------------------------------------


def directives(csp: str) -> dict[str, str]:
    return dict(part.strip().split(" ", 1) for part in csp.split(";"))


@pytest.mark.parametrize("ancestors", [(), (PLATFORM, "https://*.example.net:8443")])
async def test_the_dashboards_strict_headers_but_who_may_frame(dsn, settings, ancestors):
    configured = replace(settings, portal_frame_ancestors=ancestors)
    async with in_process_api(dsn, configured, INGEST, ADMIN) as api:
        session = await session_of(api, "acme")
        dashboard, _ = await call(api, "GET", "/dashboard/login")
        pages_seen = [
            await call(api, "GET", "/portal", session),
            await call(api, "GET", await link_of(api, "acme")),
            await call(api, "GET", "/portal"),
        ]
    strict = directives(dashboard.headers["Content-Security-Policy"])
    for response, _ in pages_seen:
        csp = directives(response.headers["Content-Security-Policy"])
        assert csp == {**strict, "frame-ancestors": " ".join(ancestors) or "'none'"}
        assert ("X-Frame-Options" in response.headers) == (not ancestors)
        assert response.headers["Cache-Control"] == "no-store"
        assert response.headers["X-Content-Type-Options"] == "nosniff"


async def test_the_platforms_name_and_colour(dsn, settings):
    configured = replace(settings, portal_name="Acme Cloud", portal_colour="#ffd500")
    async with in_process_api(dsn, configured, INGEST, ADMIN) as api:
        session = await session_of(api, "acme")
        _, body = await call(api, "GET", "/portal", session)
        style, css = await call(api, "GET", "/portal/brand.css")
        sheet, _ = await call(api, "GET", "/portal/static/portal.css")
    assert (
        "<title>Endpoints · Acme Cloud</title>" in body and 'class="brand" href="/portal">Acme Cloud<' in body
    )
    assert '<link rel="stylesheet" href="/portal/brand.css">' in body
    assert style.headers["Content-Type"].startswith("text/css")
    # Yellow: black text reads better on it.
    assert css == ":root { --brand: #ffd500; --brand-ink: #000000; }\n"
    assert sheet.status == 200


# --- rights --------------------------------------------------------------------------


BUTTONS = {
    "resend": "/resend",
    "test": "/test-event",
    "replay": "/replay",
    "pause": "/pause",
    "rotate": "/rotate-secret",
    "edit": "/edit",
    "delete": "/delete",
}


def buttons(body: str, path: str) -> set[str]:
    return {what for what, suffix in BUTTONS.items() if f'"{path}{suffix}"' in body}


async def test_each_grant_shows_its_buttons_and_the_routes_refuse_the_rest(api, db):
    await two_tenants(db)
    own = resource_name("acme", "mine")
    await add_endpoint(db, own, NOWHERE, tenant="acme")
    platform = "/portal/endpoints/default/acme-orders"
    mine = f"/portal/endpoints/default/{own}"
    shown = {}
    for access in ("read", "resend", "manage"):
        session = await session_of(api, "acme", access)
        _, body = await call(api, "GET", platform, session)
        _, own_body = await call(api, "GET", mine, session)
        _, listing = await call(api, "GET", "/portal", session)
        shown[access] = (buttons(body, platform), buttons(own_body, mine), 'href="/portal/new"' in listing)
    assert shown["read"] == (set(), set(), False)
    assert shown["resend"] == ({"resend", "test", "replay"}, {"test", "replay"}, False)
    # One the platform set up is the platform's to change, even with manage.
    assert shown["manage"] == (
        {"resend", "test", "replay"},
        {"test", "replay", "pause", "rotate", "edit", "delete"},
        True,
    )

    before = await db.fetch("SELECT id, state, attempts FROM deliveries ORDER BY id")
    endpoints = await db.fetch("SELECT name, paused, secret FROM endpoints ORDER BY name")
    for access, refused in (
        ("read", ["/resend", "/replay", "/test-event", "/pause", "/rotate-secret", "/edit", "/delete"]),
        ("resend", ["/pause", "/resume", "/rotate-secret", "/edit", "/delete"]),
    ):
        session = await session_of(api, "acme", access)
        for suffix in refused:
            response, body = await call(api, "POST", mine + suffix, session, data=FORM)
            assert response.status == 403, (access, suffix)
            assert "Not allowed" in body and f"session may {access} only" in body
        for path in ("/portal/new", mine + "/edit"):
            response, _ = await call(api, "GET", path, session)
            assert response.status == 403, (access, path)
    assert await db.fetch("SELECT id, state, attempts FROM deliveries ORDER BY id") == before
    assert await db.fetch("SELECT name, paused, secret FROM endpoints ORDER BY name") == endpoints

    session = await session_of(api, "acme", "manage")
    response, body = await call(api, "POST", platform + "/pause", session)
    assert response.status == 409 and "Set up by the platform" in body
    assert not await db.fetchval("SELECT paused FROM endpoints WHERE name = 'acme-orders'")


# --- one tenant's view --------------------------------------------------------------------


def portal_routes(api: TestClient) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return sorted(
        {
            (route.method, route.resource.canonical)
            for route in api.server.app.router.routes()
            if route.method != "HEAD"
            and route.resource is not None
            and getattr(route.handler, "audience", None) is Audience.PORTAL
        }
    )


# What every POST form of the portal may want: a replay's time, a whole
# endpoint form, the delete's tick.
FORM = {
    "since": "2020-01-01T00:00:00Z",
    "url": OWN_URL,
    "event_types": "order.*",
    "max_concurrency": "2",
    "timeout_seconds": "5",
    "confirm": "yes",
}
# The names a page says: each of globex's endpoints against a missing one
# of the same kind (the portal's names for acme are another path).
THEIRS_AND_MISSING = (
    ("globex-orders", "no-such-endpoint"),
    (resource_name("acme", "globex"), resource_name("acme", "absent")),
)
_NAME = re.compile("|".join(name for pair in THEIRS_AND_MISSING for name in pair))


async def test_every_route_renders_another_tenants_ids_as_none_at_all(api, db):
    ids = await two_tenants(db)
    # acme may change an endpoint the portal made for it: one name of each
    # kind, so that every route gets past its own checks to the tenant's.
    mine = resource_name("acme", "mine")
    await add_endpoint(db, mine, NOWHERE, tenant="acme")
    ids["mine"] = {**ids["acme"], "name": mine}
    # globex's own, named as the portal would name it for acme: still none.
    await add_endpoint(db, THEIRS_AND_MISSING[1][0], NOWHERE, tenant="globex")
    session = await session_of(api, "acme", "manage")
    # The delete last: acme's own endpoint goes with it.
    routes = sorted(
        ((m, p) for m, p in portal_routes(api) if "{" in p), key=lambda r: r[1].endswith("/delete")
    )
    assert len(routes) >= 11, routes
    watched = (
        "SELECT ep.name, ep.paused, ep.secret, ep.url, d.id, d.state, d.attempts FROM endpoints ep "
        "LEFT JOIN deliveries d ON d.endpoint_id = ep.id WHERE ep.tenant = 'globex' ORDER BY ep.name, d.id"
    )
    before = await db.fetch(watched)
    for method, template in routes:
        for their_name, no_name in THEIRS_AND_MISSING:
            theirs = await call(
                api, method, filled(template, {**ids["globex"], "name": their_name}), session, data=FORM
            )
            missing = await call(
                api, method, filled(template, {**ids["globex"], "name": no_name}), session, data=FORM
            )
            assert theirs[0].status == missing[0].status == 404, (
                method,
                template,
                their_name,
                theirs[0].status,
            )
            assert _NAME.sub("", theirs[1]) == _NAME.sub("", missing[1]), (method, template, their_name)
        if "{id}" in template:
            # The tenant's own endpoint with the other's delivery id: none either.
            mixed = await call(
                api, method, filled(template, {**ids["acme"], "id": ids["globex"]["id"]}), session
            )
            assert mixed[0].status == 404, (method, template)
            assert "No such delivery" in mixed[1]
        own = (
            "acme"
            if template.endswith(("/resend", "/replay", "/test-event", "{id}", "/payload", "{name}"))
            else "mine"
        )
        mine_answer = await call(api, method, filled(template, ids[own]), session, data=FORM)
        assert mine_answer[0].status in (200, 303), (
            method,
            template,
            mine_answer[0].status,
            mine_answer[1][:300],
        )
    assert await db.fetch(watched) == before


async def test_a_tenant_lists_its_own_endpoints_only_and_a_page_is_bounded(api, db):
    await add_endpoint(db, "theirs", NOWHERE, tenant="globex")
    await add_endpoint(db, "ep-00000", NOWHERE, tenant="acme")
    # Ten thousand more endpoints of acme's, as the one above (its partition
    # and secret): a listing of them all must not be one page.
    await db.execute(
        """INSERT INTO endpoints (namespace, name, tenant, url, partition, secret)
           SELECT namespace, 'ep-' || lpad(n::text, 5, '0'), tenant, url, partition, secret
           FROM endpoints, generate_series(1, 10000) n WHERE name = 'ep-00000'"""
    )
    session = await session_of(api, "acme")
    seen: list[str] = []
    path: str | None = "/portal?tenant=globex"
    for _ in range(3):
        assert path is not None
        response, body = await call(api, "GET", path, session)
        assert response.status == 200
        assert len(body) < 100_000
        rows = re.findall(r'data-endpoint="default/([^"]+)"', body)
        assert len(rows) == browser.ENDPOINTS_PER_PAGE
        seen += rows
        assert "<b>10001</b>" in body
        found = re.search(r'href="([^"]+)" class="next"', body)
        path = None if found is None else found[1].replace("&amp;", "&")
    assert len(set(seen)) == 3 * browser.ENDPOINTS_PER_PAGE
    assert "theirs" not in seen
    _, body = await call(api, "GET", "/portal?name_prefix=ep-0999", session)
    assert len(re.findall(r'data-endpoint="default/([^"]+)"', body)) == 10


async def test_a_replay_and_a_bad_input_are_pages(api, db):
    await two_tenants(db)
    session = await session_of(api, "acme", "resend")
    path = "/portal/endpoints/default/acme-orders"
    response, body = await call(api, "POST", path + "/replay", session, data={"since": "yesterday"})
    assert response.status == 422
    assert "since must be an RFC 3339 time" in body and "Traceback" not in body
    response, _ = await call(api, "POST", path + "/replay", session, data={"since": "2020-01-01T00:00:00Z"})
    assert response.status == 303
    assert pages.flash_message(set_cookies(response)[pages.FLASH_COOKIE].split(";")[0].split("=")[1]) == (
        "1 event queued to be sent again."
    )
    for bad in ("?state=gone", "?before=xyz"):
        response, body = await call(api, "GET", path + bad, session)
        assert response.status == 422, bad
        assert "Not understood" in body


async def test_a_delivery_held_by_the_circuit_shows_when_the_pause_lets_it_go(api, db):
    """Its retry was due 21 s ago, the circuit's next probe is in 36 s: the
    tenant sees the probe's time, never a next attempt in the past."""
    await add_endpoint(db, "held", NOWHERE, tenant="acme")
    await hooklane.publish(db, tenant="acme", type="order.paid", data={})
    await db.execute("UPDATE endpoints SET consecutive_failures = 20, paused_until = now() + interval '36 s'")
    delivery = await db.fetchval(
        "UPDATE deliveries SET attempts = 3, next_attempt_at = now() - interval '21 s' RETURNING id"
    )
    session = await session_of(api, "acme")
    path = "/portal/endpoints/default/held"
    for page, cell in (
        (path, r'<tr data-delivery="\d+".*?</tr>'),
        (f"{path}/deliveries/{delivery}", r"<dt>Next attempt</dt>.*?</dd>"),
    ):
        response, body = await call(api, "GET", page, session)
        assert response.status == 200
        shown = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", re.search(cell, body, re.S)[0])).split())
        assert re.search(r"after the circuit's pause ?, in 3\d s", shown), shown
        assert " ago" not in shown, shown


def created_and_queued(body: str, pattern: str) -> tuple[list[str], str]:
    """The times of the part of a page ``pattern`` finds (a delivery's row,
    or its facts), and its text as a person reads it."""
    found = re.search(pattern, body, re.S)
    assert found is not None, pattern
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", found[0])).split())
    return re.findall(r'<time datetime="([^"]+)"', found[0]), text


async def test_a_resent_delivery_shows_when_it_was_created_and_queued_again(api, db):
    """Dead deliveries made days ago, resent from the portal and the tenant
    API: the portal, the dashboard and the tenant API show each created
    when it was made, and queued again at its resend."""
    ids = await two_tenants(db)
    await db.execute("UPDATE deliveries SET created_at = now() - interval '3 days'")
    made = {
        str(r["id"]): rfc3339(r["created_at"])
        for r in await db.fetch("SELECT id, created_at FROM deliveries")
    }

    session = await session_of(api, "acme", "resend")
    path = "/portal/endpoints/default/acme-orders"
    response, _ = await call(api, "POST", path + "/resend", session, data={"id": ids["acme"]["id"]})
    assert response.status == 303
    globex = (await grant(api, "globex", "resend"))["token"]
    resent = await api.post(
        f"/v1/tenant/endpoints/default/globex-orders/deliveries/{ids['globex']['id']}/resend",
        headers={"Authorization": f"Bearer {globex}"},
    )
    assert resent.status == 200 and await resent.json() == {"resent": 1}
    queued = {
        str(r["id"]): rfc3339(r["created_at"])
        for r in await db.fetch("SELECT id, created_at FROM deliveries")
    }
    assert all(queued[d] > made[d] for d in made)

    for tenant in ("acme", "globex"):
        delivery = ids[tenant]["id"]
        token = await session_of(api, tenant)
        detail = await api.get(
            f"/v1/tenant/endpoints/default/{tenant}-orders/deliveries/{delivery}",
            headers={"Authorization": f"Bearer {token}"},
        )
        shown = (await detail.json())["delivery"]
        assert (shown["created_at"], shown["queued_at"]) == (made[delivery], queued[delivery])

        endpoint = f"/endpoints/default/{tenant}-orders"
        row = rf'<tr data-delivery="{delivery}".*?</tr>'
        facts = r"<dt>First created</dt>.*?</dl>"
        for page, auth in (("/portal", {"Cookie": f"{PORTAL_COOKIE}={token}"}), ("/dashboard", ADMIN_AUTH)):
            for url, part, again in (
                (page + endpoint, row, "queued again"),
                (f"{page}{endpoint}/deliveries/{delivery}", facts, "Resent"),
            ):
                response = await api.get(url, headers=auth, allow_redirects=False)
                assert response.status == 200, url
                times, text = created_and_queued(await response.text(), part)
                # Created, then queued again (the next attempt is the row's first).
                assert [made[delivery], queued[delivery]] in (times[:2], times[1:3]), (url, times)
                assert re.search(rf"\b3 ?d(ays?)? ago .*{again} (now|\d+ s ago)", text, re.I), (url, text)
                api.session.cookie_jar.clear()


# --- self-service, over HTTP (the browser test walks it too) ------------------------------


async def test_create_edit_rotate_and_delete_an_endpoint(api, db):
    session = await session_of(api, "acme", "manage")
    response, body = await call(api, "GET", "/portal/new", session)
    assert response.status == 200 and 'action="/portal/endpoints"' in body

    response, body = await call(api, "POST", "/portal/endpoints", session, data={**FORM, "name": "Bad Name"})
    assert response.status == 422
    assert 'role="alert">name ' in body and 'value="Bad Name"' in body
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 0

    response, body = await call(
        api,
        "POST",
        "/portal/endpoints",
        session,
        data={**FORM, "name": "orders", "ordering_on_dead": "Later"},
    )
    assert response.status == 422
    assert 'role="alert">ordering_on_dead must be one of Hold, Skip' in html.unescape(body)
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 0

    skip = {**FORM, "name": "orders", "ordering_on_dead": "Skip"}
    response, body = await call(api, "POST", "/portal/endpoints", session, data=skip)
    assert response.status == 200 and response.headers["Cache-Control"] == "no-store"
    name = resource_name("acme", "orders")
    secret = re.search(r'<code class="secret" id="secret">([^<]+)</code>', body)
    assert secret is not None
    row = await db.fetchrow(
        "SELECT tenant, url, event_types, max_concurrency, ordering_on_dead FROM endpoints WHERE name = $1",
        name,
    )
    assert tuple(row) == ("acme", OWN_URL, ["order.*"], 2, "skip")
    response, body = await call(api, "POST", "/portal/endpoints", session, data={**FORM, "name": "orders"})
    assert response.status == 409 and "You have an endpoint named 'orders' already" in html.unescape(body)

    path = f"/portal/endpoints/default/{name}"
    response, body = await call(api, "GET", path + "/edit", session)
    assert response.status == 200
    assert 'value="orders" maxlength="63" required readonly' in body and 'value="order.*"' in body
    assert '<option value="Skip" selected>' in body and '<option value="Hold">' in body
    edited = {**FORM, "name": "renamed", "event_types": "order.paid, invoice.*", "ordering_on_dead": "Hold"}
    response, _ = await call(api, "POST", path + "/edit", session, data=edited)
    assert response.status == 303 and response.headers["Location"] == path
    assert tuple(
        await db.fetchrow("SELECT event_types, ordering_on_dead FROM endpoints WHERE name = $1", name)
    ) == (["order.paid", "invoice.*"], "hold")
    response, body = await call(api, "GET", path, session)
    assert "<dt>Ordered, when one dies</dt><dd>hold its key</dd>" in body

    response, body = await call(api, "POST", path + "/rotate-secret", session)
    assert response.status == 200 and response.headers["Cache-Control"] == "no-store"
    assert "Signing secret rotated" in body and "For the next 1 d" in body
    assert secret[1] not in body

    response, body = await call(api, "POST", path + "/delete", session, data={})
    assert response.status == 422 and "confirm must be ticked" in body
    response, _ = await call(api, "POST", path + "/delete", session, data={"confirm": "yes"})
    assert response.status == 303 and response.headers["Location"] == "/portal"
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 0


async def test_the_form_keeps_within_the_platforms_bounds(dsn, settings, db):
    configured = replace(settings, portal_endpoints="local", portal_https_only=False)
    wider = replace(configured, portal_max_concurrency=16, portal_max_timeout_seconds=30)
    name = resource_name("acme", "orders")
    path = f"/portal/endpoints/default/{name}"
    async with in_process_api(dsn, wider, INGEST, ADMIN) as before:
        session = await session_of(before, "acme", "manage")
        response, _ = await call(
            before,
            "POST",
            "/portal/endpoints",
            session,
            data={**FORM, "name": "orders", "max_concurrency": "16", "timeout_seconds": "30"},
        )
        assert response.status == 200
    # The platform lowers its bounds to the defaults (4, 5) and restarts.
    async with in_process_api(dsn, configured, INGEST, ADMIN) as api:
        response, body = await call(api, "GET", "/portal/new", session)
        assert "at most 4; empty: the default" in body and "at most 5; empty: the default" in body
        response, body = await call(
            api, "POST", "/portal/endpoints", session, data={**FORM, "name": "big", "max_concurrency": "256"}
        )
        assert response.status == 422
        assert 'role="alert">max_concurrency must be at most 4, the most this platform lets' in body
        response, _ = await call(
            api, "POST", "/portal/endpoints", session, data={**FORM, "name": "small", "max_concurrency": "4"}
        )
        assert response.status == 200

        response, body = await call(api, "GET", path + "/edit", session)
        assert response.status == 200
        assert "16 is above this platform's limit of 4" in body and 'value="16"' in body
        assert "30 is above this platform's limit of 5" in body
        kept = {**FORM, "url": OWN_URL + "/v2", "max_concurrency": "16", "timeout_seconds": "30"}
        response, _ = await call(api, "POST", path + "/edit", session, data=kept)
        assert response.status == 303
        response, body = await call(
            api, "POST", path + "/edit", session, data={**kept, "max_concurrency": "17"}
        )
        assert response.status == 422
        assert 'role="alert">max_concurrency must be at most 4, ' in body and "or at most 16" in body
    stored = await db.fetchrow(
        "SELECT url, max_concurrency, timeout_seconds FROM endpoints WHERE name = $1", name
    )
    assert tuple(stored) == (OWN_URL + "/v2", 16, 30)


async def test_without_self_service_no_page_changes_endpoints(dsn, settings, db):
    async with in_process_api(dsn, settings, INGEST, ADMIN) as api:
        await add_endpoint(db, resource_name("acme", "mine"), NOWHERE, tenant="acme")
        # A manage grant issued while self-service was on outlives it.
        session = (await grants.issue(db, "acme", grants.Access.MANAGE, 60, link=False)).token
        _, body = await call(
            api, "GET", f"/portal/endpoints/default/{resource_name('acme', 'mine')}", session
        )
        assert "/pause" not in body and "/delete" not in body
        response, body = await call(api, "GET", "/portal/new", session)
    assert response.status == 409 and "does not let tenants manage endpoints" in body


# --- pure rules ------------------------------------------------------------------------------
