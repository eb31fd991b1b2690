"""The tenant API over real HTTP on a real Postgres: grants issued by the
admin API, their rights and expiry, and the rule every route keeps: another
tenant's endpoint, delivery or event answers exactly as one that does not
exist."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient

from hooklane.api.auth import Audience
from hooklane.settings import Settings
from hooklane.store import grants
from testsupport.api import ADMIN, ADMIN_AUTH, INGEST, NOWHERE, dead_delivery, filled, grant
from testsupport.fixtures import add_endpoint, in_process_api


@pytest.fixture
async def api(dsn: str, settings: Settings) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    configured = replace(settings, portal_endpoints="local", portal_https_only=False)
    async with in_process_api(dsn, configured, INGEST, ADMIN) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def two_tenants(api: TestClient, db: asyncpg.Connection) -> dict[str, dict[str, Any]]:
    """acme and globex, each with an endpoint of its own making, an event
    and a dead delivery."""
    found: dict[str, dict[str, Any]] = {}
    for tenant in ("acme", "globex"):
        token = (await grant(api, tenant, "manage"))["token"]
        response = await api.post(
            "/v1/tenant/endpoints", headers=bearer(token), json={"name": "orders", "url": NOWHERE}
        )
        created = await response.json()
        assert response.status == 201, created
        delivery = await dead_delivery(db, tenant, created["name"])
        found[tenant] = {"namespace": created["namespace"], "name": created["name"], "id": delivery}
    return found


# --- grants --------------------------------------------------------------------


async def test_only_an_admin_token_issues_grants(api):
    token = (await grant(api, "acme"))["token"]
    for headers in ({}, bearer(INGEST), bearer(token)):
        response = await api.post("/v1/admin/portal-sessions", headers=headers, json={"tenant": "acme"})
        assert response.status == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "tenant"),
        ({"tenant": ""}, "tenant"),
        ({"tenant": "acme", "access": "admin"}, "access"),
        ({"tenant": "acme", "kind": "cookie"}, "kind"),
        ({"tenant": "acme", "tenants": ["x"]}, "tenants"),
    ],
)
async def test_a_bad_grant_request_names_its_field(api, body, field):
    response = await api.post("/v1/admin/portal-sessions", headers=ADMIN_AUTH, json=body)
    assert response.status == 422
    assert (await response.json())["field"] == field


async def test_manage_is_refused_without_self_service(dsn, settings):
    async with in_process_api(dsn, settings, INGEST, ADMIN) as api:
        response = await api.post(
            "/v1/admin/portal-sessions", headers=ADMIN_AUTH, json={"tenant": "acme", "access": "manage"}
        )
        body = await response.json()
    assert response.status == 422
    assert body["field"] == "access" and "HOOKLANE_PORTAL_ENDPOINTS" in body["detail"]


async def test_a_link_is_good_once_and_only_its_digest_is_kept(api, db):
    link = await grant(api, "acme", "resend", kind="link")
    token = link["path"].rsplit("/", 1)[1]
    assert link["url"].endswith(link["path"]) and token.startswith(grants.LINK_PREFIX)
    assert await db.fetchval(
        "SELECT count(*) FROM portal_grants WHERE digest = sha256($1::bytea)", token.encode()
    )
    assert not await db.fetchval(
        "SELECT count(*) FROM portal_grants WHERE position($1::bytea IN digest) > 0", token.encode()
    )
    first = await grants.redeem(db, token, 60)
    assert first is not None
    session, found = first
    assert (found.tenant, str(found.access)) == ("acme", "resend")
    assert await grants.redeem(db, token, 60) is None
    assert (await grants.session_grant(db, session.token)) == found


async def test_an_expired_link_or_token_opens_nothing(api, db):
    link = (await grant(api, "acme", kind="link"))["path"].rsplit("/", 1)[1]
    token = (await grant(api, "acme"))["token"]
    await db.execute("UPDATE portal_grants SET expires_at = now() - interval '1 s'")
    assert await grants.redeem(db, link, 60) is None
    response = await api.get("/v1/tenant/session", headers=bearer(token))
    assert response.status == 401


async def test_a_token_says_its_grant_and_ends_when_asked(api):
    token = (await grant(api, "acme", "resend"))["token"]
    response = await api.get("/v1/tenant/session", headers=bearer(token))
    body = await response.json()
    assert (body["tenant"], body["access"]) == ("acme", "resend")
    assert (await api.delete("/v1/tenant/session", headers=bearer(token))).status == 204
    assert (await api.get("/v1/tenant/session", headers=bearer(token))).status == 401


async def test_other_credentials_are_no_tenant_token(api):
    for headers in ({}, ADMIN_AUTH, bearer(INGEST), bearer(grants.SESSION_PREFIX + "x" * 43)):
        response = await api.get("/v1/tenant/endpoints", headers=headers)
        assert response.status == 401, headers


async def test_a_read_grant_cannot_repair(api, db):
    ids = await two_tenants(api, db)
    token = (await grant(api, "acme", "read"))["token"]
    path = "/v1/tenant/endpoints/default/{name}".format(**ids["acme"])
    for suffix in ("/resend-dead", f"/deliveries/{ids['acme']['id']}/resend", "/test-event"):
        response = await api.post(path + suffix, headers=bearer(token))
        assert response.status == 403, suffix
        assert (await response.json())["error"] == "forbidden"
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'dead'") == 2


# --- one tenant's view ------------------------------------------------------------


def tenant_routes(api: TestClient) -> list[tuple[str, str]]:
    return sorted(
        {
            (route.method, route.resource.canonical)
            for route in api.server.app.router.routes()
            if route.method != "HEAD"
            and route.resource is not None
            and getattr(route.handler, "audience", None) is Audience.TENANT
        }
    )


# A body each kind of route takes: a replay's time, an endpoint's form.
_BODIES: dict[str, Any] = {
    "POST": {"since": "2020-01-01T00:00:00Z"},
    "PUT": {"name": "orders", "url": NOWHERE, "event_types": ["order.*"]},
}


async def answer(api: TestClient, method: str, path: str, token: str) -> tuple[int, Any]:
    response = await api.request(method, path, headers=bearer(token), json=_BODIES.get(method))
    return response.status, await response.json() if response.status != 204 else None


async def test_every_route_answers_another_tenants_ids_as_none_at_all(api, db):
    ids = await two_tenants(api, db)
    token = (await grant(api, "acme", "manage"))["token"]
    # Deleting last, so that the other routes still find the tenant's own.
    # The catalogue is the platform's, the same for every tenant: no id of
    # one tenant's in it.
    routes = sorted(
        ((m, p) for m, p in tenant_routes(api) if "{" in p and "/catalogue/" not in p),
        key=lambda r: r[0] == "DELETE",
    )
    assert len(routes) == 14, routes
    before = await db.fetch("SELECT id, state, attempts FROM deliveries ORDER BY id")
    globex = await db.fetchrow("SELECT * FROM endpoints WHERE tenant = 'globex'")
    for method, template in routes:
        theirs = await answer(api, method, filled(template, ids["globex"]), token)
        missing = {**ids["globex"], "name": "no-such-endpoint"}
        missing_name = ids["globex"]["name"]
        none = await answer(api, method, filled(template, missing), token)
        assert theirs[0] == 404, (method, template, theirs)
        assert theirs[1] == {
            **none[1],
            "detail": none[1]["detail"].replace("no-such-endpoint", missing_name),
        }, (
            method,
            template,
        )
        # The tenant's own endpoint with the other's delivery id: none either.
        if "{id}" in template:
            mixed = await answer(
                api, method, filled(template, {**ids["acme"], "id": ids["globex"]["id"]}), token
            )
            assert mixed[0] == 404, (method, template, mixed)
        mine = await answer(api, method, filled(template, ids["acme"]), token)
        assert mine[0] in (200, 202, 204), (method, template, mine)
    # Nothing of globex's was touched.
    after = await db.fetch(
        "SELECT d.id, d.state, d.attempts FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id "
        "WHERE ep.tenant = 'globex' ORDER BY d.id"
    )
    assert [tuple(r) for r in after] == [tuple(r) for r in before if r["id"] == int(ids["globex"]["id"])]
    assert await db.fetchrow("SELECT * FROM endpoints WHERE tenant = 'globex'") == globex


async def test_listings_hold_the_tenants_own_records_only(api, db):
    await two_tenants(api, db)
    token = (await grant(api, "acme"))["token"]
    status, body = await answer(api, "GET", "/v1/tenant/endpoints?tenant=globex", token)
    assert status == 200 and [e["tenant"] for e in body["endpoints"]] == ["acme"]
    status, body = await answer(api, "GET", "/v1/tenant/endpoints?name_prefix=orders", token)
    assert status == 200 and [e["tenant"] for e in body["endpoints"]] == ["acme"]
    status, body = await answer(api, "GET", "/v1/tenant/events?since=2020-01-01T00:00:00Z", token)
    assert status == 200 and [e["id"] for e in body["events"]] == ["acme-1"]
    status, body = await answer(
        api, "GET", "/v1/tenant/events?tenant=globex&since=2020-01-01T00:00:00Z", token
    )
    assert status == 422 and body["field"] == "tenant"


async def test_an_endpoint_moved_to_another_tenant_leaves_the_first_ones_view(api, db):
    await add_endpoint(db, "acme-orders", NOWHERE, tenant="acme")
    token = (await grant(api, "acme", "resend"))["token"]
    path = "/v1/tenant/endpoints/default/acme-orders"
    assert (await api.get(path, headers=bearer(token))).status == 200
    await add_endpoint(db, "acme-orders", NOWHERE, tenant="globex")
    assert (await api.get(path, headers=bearer(token))).status == 404
    assert (await api.post(path + "/resend-dead", headers=bearer(token))).status == 404


async def test_a_test_event_goes_to_the_one_endpoint_whatever_its_types(api, db):
    await add_endpoint(db, "first", NOWHERE, tenant="acme", event_types=("order.*",))
    await add_endpoint(db, "second", NOWHERE, tenant="acme")
    token = (await grant(api, "acme", "resend"))["token"]
    response = await api.post("/v1/tenant/endpoints/default/first/test-event", headers=bearer(token))
    body = await response.json()
    assert response.status == 202, body
    rows = await db.fetch(
        "SELECT d.id, ep.name, e.type FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id "
        "JOIN events e ON (e.tenant, e.id) = (d.event_tenant, d.event_id)"
    )
    assert [(r["id"], r["name"], r["type"]) for r in rows] == [
        (body["delivery_id"], "first", "hooklane.test")
    ]


# --- self-service ------------------------------------------------------------------


async def test_a_tenant_creates_edits_and_deletes_its_own_endpoint(api, db):
    token = (await grant(api, "acme", "manage"))["token"]
    response = await api.post(
        "/v1/tenant/endpoints", headers=bearer(token), json={"name": "orders", "url": NOWHERE}
    )
    created = await response.json()
    assert response.status == 201 and response.headers["Cache-Control"] == "no-store"
    assert created["secret"].startswith("whsec_") and created["name"].startswith("orders-")
    path = "/v1/tenant/endpoints/{namespace}/{name}".format(**created)
    again = await api.post(
        "/v1/tenant/endpoints", headers=bearer(token), json={"name": "orders", "url": NOWHERE}
    )
    assert again.status == 409
    assert (await (await api.get(path, headers=bearer(token))).json())["ordering_on_dead"] == "Hold"
    edited = await api.put(
        path,
        headers=bearer(token),
        json={"name": "orders", "url": NOWHERE + "/v2", "ordering_on_dead": "Skip"},
    )
    assert edited.status == 200, await edited.json()
    shown = await (await api.get(path, headers=bearer(token))).json()
    assert (shown["url"], shown["ordering_on_dead"]) == (NOWHERE + "/v2", "Skip")
    assert (
        await db.fetchval("SELECT ordering_on_dead FROM endpoints WHERE name = $1", created["name"]) == "skip"
    )
    assert (await api.post(path + "/pause", headers=bearer(token))).status == 200
    assert await db.fetchval("SELECT paused FROM endpoints WHERE name = $1", created["name"])
    rotated = await (await api.post(path + "/rotate-secret", headers=bearer(token))).json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != created["secret"]
    assert rotated["previous_signs_for_seconds"] == 86400
    assert (await api.delete(path, headers=bearer(token))).status == 204
    assert (await api.get(path, headers=bearer(token))).status == 404


@pytest.mark.parametrize(
    ("form", "field"),
    [
        ({"name": "Orders!", "url": NOWHERE}, "name"),
        ({"name": "orders", "url": "ftp://example.com/"}, "url"),
        ({"name": "orders", "url": "http://169.254.169.254/latest"}, "url"),
        ({"name": "orders", "url": NOWHERE, "event_types": ["a b"]}, "event_types"),
        ({"name": "orders", "url": NOWHERE, "tenant": "globex"}, "body"),
        ({"name": "orders", "url": NOWHERE, "ordering_on_dead": "Drop"}, "ordering_on_dead"),
        ({"name": "orders", "url": NOWHERE, "ordering_on_dead": 1}, "ordering_on_dead"),
    ],
)
async def test_a_bad_form_names_its_field_and_creates_nothing(api, db, form, field):
    token = (await grant(api, "acme", "manage"))["token"]
    response = await api.post("/v1/tenant/endpoints", headers=bearer(token), json=form)
    body = await response.json()
    assert response.status == 422, body
    assert body["field"] == field, body
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 0


@pytest.mark.parametrize(("field", "bound"), [("max_concurrency", 4), ("timeout_seconds", 5)])
async def test_a_tenant_may_not_choose_beyond_the_platforms_bound(api, db, field, bound):
    token = (await grant(api, "acme", "manage"))["token"]
    asked = {"name": "orders", "url": NOWHERE}
    for value in (bound + 1, 60):
        response = await api.post("/v1/tenant/endpoints", headers=bearer(token), json={**asked, field: value})
        body = await response.json()
        assert response.status == 422, body
        assert body["field"] == field and f"must be at most {bound}" in body["detail"], body
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 0
    response = await api.post("/v1/tenant/endpoints", headers=bearer(token), json={**asked, field: bound})
    created = await response.json()
    assert response.status == 201, created
    assert await db.fetchval(f"SELECT {field} FROM endpoints") == bound
    path = "/v1/tenant/endpoints/{namespace}/{name}".format(**created)
    edited = await api.put(path, headers=bearer(token), json={**asked, field: bound + 1})
    assert edited.status == 422 and (await edited.json())["field"] == field
    shown = await (await api.get(path, headers=bearer(token))).json()
    assert shown["over_bounds"] == [] and shown["max_concurrency"] == 4


async def test_an_endpoint_beyond_a_lowered_bound_is_reported_and_kept(dsn, settings, db):
    configured = replace(settings, portal_endpoints="local", portal_https_only=False)
    asked = {"name": "orders", "url": NOWHERE, "max_concurrency": 16, "timeout_seconds": 30}
    wider = replace(configured, portal_max_concurrency=16, portal_max_timeout_seconds=30)
    async with in_process_api(dsn, wider, INGEST, ADMIN) as before:
        token = (await grant(before, "acme", "manage"))["token"]
        response = await before.post("/v1/tenant/endpoints", headers=bearer(token), json=asked)
        created = await response.json()
        assert response.status == 201, created
    path = "/v1/tenant/endpoints/{namespace}/{name}".format(**created)
    # The platform lowers its bounds to the defaults (4, 5) and restarts.
    async with in_process_api(dsn, configured, INGEST, ADMIN) as api:
        shown = await (await api.get(path, headers=bearer(token))).json()
        assert shown["over_bounds"] == [
            {"field": "max_concurrency", "value": 16, "bound": 4},
            {"field": "timeout_seconds", "value": 30, "bound": 5},
        ]
        kept = {**asked, "url": NOWHERE + "/v2"}
        edited = await api.put(path, headers=bearer(token), json=kept)
        assert edited.status == 200, await edited.json()
        raised = await api.put(path, headers=bearer(token), json={**kept, "max_concurrency": 17})
        body = await raised.json()
        assert raised.status == 422 and body["field"] == "max_concurrency", body
        assert "at most 4" in body["detail"] and "at most 16" in body["detail"]
        lowered = await api.put(path, headers=bearer(token), json={**kept, "timeout_seconds": 10})
        assert lowered.status == 200, await lowered.json()
        again = await api.put(path, headers=bearer(token), json={**kept, "timeout_seconds": 30})
        assert again.status == 422 and (await again.json())["field"] == "timeout_seconds"
    stored = await db.fetchrow("SELECT url, max_concurrency, timeout_seconds FROM endpoints")
    assert tuple(stored) == (NOWHERE + "/v2", 16, 10)


# What docs/portal.md says the manage routes answer on an endpoint the
# platform set up.
PLATFORMS_ANSWER = re.compile(r"the tenant\s+API's manage routes answer `(\d{3})`")


async def test_manage_routes_answer_a_platform_made_endpoint_as_documented_and_as_none_at_all(api, db):
    portal_doc = (Path(__file__).resolve().parents[2] / "docs" / "portal.md").read_text()
    (documented,) = PLATFORMS_ANSWER.findall(portal_doc)
    await add_endpoint(db, "orders", NOWHERE, tenant="acme")
    before = await db.fetchrow("SELECT url, paused, secret, updated_at FROM endpoints")
    token = (await grant(api, "acme", "manage"))["token"]
    ours, missing = "/v1/tenant/endpoints/default/orders", "/v1/tenant/endpoints/default/missing"
    assert (await api.get(ours, headers=bearer(token))).status == 200
    for method, suffix in (
        ("PUT", ""),
        ("DELETE", ""),
        ("POST", "/pause"),
        ("POST", "/resume"),
        ("POST", "/rotate-secret"),
    ):
        answers = []
        for path in (ours, missing):
            response = await api.request(
                method, path + suffix, headers=bearer(token), json={"name": "orders", "url": NOWHERE}
            )
            answers.append((response.status, (await response.text()).replace("missing", "orders")))
        assert answers[0] == answers[1], (method, suffix, answers)
        assert str(answers[0][0]) == documented, (method, suffix, answers)
    assert await db.fetchrow("SELECT url, paused, secret, updated_at FROM endpoints") == before


async def test_only_a_manage_grant_changes_endpoints(api, db):
    token = (await grant(api, "acme", "resend"))["token"]
    response = await api.post(
        "/v1/tenant/endpoints", headers=bearer(token), json={"name": "orders", "url": NOWHERE}
    )
    assert response.status == 403
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 0
