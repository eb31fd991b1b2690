"""Every route of ``hooklane api`` for every caller: each is listed here
with the one audience it admits (and the tenant's grant it needs), the
routes that several audiences share once for each, and each is called by
every kind of caller: admitted by its audience, refused (401, 403, or the
dashboard's login page) for every other. A route added to the app but not
to this table fails the first test."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from aiohttp.test_utils import TestClient

from hooklane.api.auth import LOGIN_PATH, PORTAL_COOKIE, SESSION_COOKIE, Audience
from hooklane.settings import Settings
from hooklane.store.grants import Access
from testsupport.fixtures import in_process_api

ADMIN = "admin-token-0123456789"
INGEST = "ingest-token-0123456789"
OPEN, INGESTERS, ADMINS, DASHBOARD, TENANT, PORTAL = (
    Audience.OPEN,
    Audience.INGEST,
    Audience.ADMIN,
    Audience.DASHBOARD,
    Audience.TENANT,
    Audience.PORTAL,
)
READ, RESEND, MANAGE = Access.READ, Access.RESEND, Access.MANAGE
_ENDPOINT = "/endpoints/{namespace}/{name}"

# The JSON routes the admin API and the tenant API share, one handler each
# (hooklane/api/endpoints.py), with what a tenant's grant must allow.
_SHARED_JSON = [
    ("GET", "/endpoints", READ),
    ("GET", _ENDPOINT, READ),
    ("GET", _ENDPOINT + "/deliveries", READ),
    ("GET", _ENDPOINT + "/deliveries/{id}", READ),
    ("GET", _ENDPOINT + "/attempts", READ),
    ("GET", _ENDPOINT + "/ordering", READ),
    ("POST", _ENDPOINT + "/deliveries/{id}/resend", RESEND),
    ("POST", _ENDPOINT + "/resend-dead", RESEND),
    ("POST", _ENDPOINT + "/replay", RESEND),
    ("GET", "/events", READ),
]
# The pages the dashboard and the portal share (hooklane/api/browser.py).
_SHARED_PAGES = [
    ("GET", "", READ),
    ("GET", _ENDPOINT + "/deliveries/{id}", READ),
    ("GET", _ENDPOINT + "/deliveries/{id}/payload", READ),
    ("POST", _ENDPOINT + "/resend", RESEND),
]

ROUTES: dict[tuple[str, str], tuple[Audience, Access]] = {
    ("GET", "/openapi.json"): (OPEN, READ),
    ("GET", "/healthz"): (OPEN, READ),
    ("GET", "/readyz"): (OPEN, READ),
    ("POST", "/v1/events"): (INGESTERS, READ),
    ("POST", "/v1/events/batch"): (INGESTERS, READ),
    **{(m, "/v1/admin" + p): (ADMINS, READ) for m, p, _ in _SHARED_JSON},
    ("POST", "/v1/admin" + _ENDPOINT + "/discard-dead"): (ADMINS, READ),
    ("POST", "/v1/admin" + _ENDPOINT + "/reactivate"): (ADMINS, READ),
    ("GET", "/v1/admin/unrouted"): (ADMINS, READ),
    ("GET", "/v1/admin/catalogue"): (ADMINS, READ),
    ("GET", "/v1/admin/catalogue/{type}"): (ADMINS, READ),
    ("GET", "/v1/catalogue/openapi.json"): (ADMINS, READ),
    ("POST", "/v1/admin/portal-sessions"): (ADMINS, READ),
    **{(m, "/v1/tenant" + p): (TENANT, access) for m, p, access in _SHARED_JSON},
    ("GET", "/v1/tenant/catalogue"): (TENANT, READ),
    ("GET", "/v1/tenant/catalogue/{type}"): (TENANT, READ),
    ("GET", "/v1/tenant/session"): (TENANT, READ),
    ("DELETE", "/v1/tenant/session"): (TENANT, READ),
    ("POST", "/v1/tenant" + _ENDPOINT + "/test-event"): (TENANT, RESEND),
    ("POST", "/v1/tenant/endpoints"): (TENANT, MANAGE),
    ("PUT", "/v1/tenant" + _ENDPOINT): (TENANT, MANAGE),
    ("DELETE", "/v1/tenant" + _ENDPOINT): (TENANT, MANAGE),
    ("POST", "/v1/tenant" + _ENDPOINT + "/pause"): (TENANT, MANAGE),
    ("POST", "/v1/tenant" + _ENDPOINT + "/resume"): (TENANT, MANAGE),
    ("POST", "/v1/tenant" + _ENDPOINT + "/rotate-secret"): (TENANT, MANAGE),
    **{(m, "/dashboard" + p): (DASHBOARD, READ) for m, p, _ in _SHARED_PAGES},
    ("GET", "/dashboard/login"): (OPEN, READ),
    ("POST", "/dashboard/login"): (OPEN, READ),
    ("GET", "/dashboard/static/{file}"): (OPEN, READ),
    ("GET", "/dashboard" + _ENDPOINT): (DASHBOARD, READ),
    ("GET", "/dashboard" + _ENDPOINT + "/attempts"): (DASHBOARD, READ),
    ("GET", "/dashboard/event-types"): (DASHBOARD, READ),
    ("POST", "/dashboard/logout"): (DASHBOARD, READ),
    ("POST", "/dashboard" + _ENDPOINT + "/reactivate"): (DASHBOARD, READ),
    **{(m, "/portal" + p): (PORTAL, access) for m, p, access in _SHARED_PAGES},
    ("GET", "/portal/enter/{token}"): (OPEN, READ),
    ("POST", "/portal/enter"): (OPEN, READ),
    ("GET", "/portal/brand.css"): (OPEN, READ),
    ("GET", "/portal/static/{file}"): (OPEN, READ),
    ("POST", "/portal/logout"): (PORTAL, READ),
    ("GET", "/portal" + _ENDPOINT): (PORTAL, READ),
    ("POST", "/portal" + _ENDPOINT + "/replay"): (PORTAL, RESEND),
    ("POST", "/portal" + _ENDPOINT + "/test-event"): (PORTAL, RESEND),
    ("GET", "/portal/catalogue"): (PORTAL, READ),
    ("GET", "/portal/catalogue/openapi.json"): (PORTAL, READ),
    ("GET", "/portal/new"): (PORTAL, MANAGE),
    ("POST", "/portal/endpoints"): (PORTAL, MANAGE),
    ("GET", "/portal" + _ENDPOINT + "/edit"): (PORTAL, MANAGE),
    ("POST", "/portal" + _ENDPOINT + "/edit"): (PORTAL, MANAGE),
    ("POST", "/portal" + _ENDPOINT + "/delete"): (PORTAL, MANAGE),
    ("POST", "/portal" + _ENDPOINT + "/pause"): (PORTAL, MANAGE),
    ("POST", "/portal" + _ENDPOINT + "/resume"): (PORTAL, MANAGE),
    ("POST", "/portal" + _ENDPOINT + "/rotate-secret"): (PORTAL, MANAGE),
}

# Every kind of caller: its audience and, for a tenant's, its grant. An
# admin token in an Authorization header is the dashboard's credential too.
CALLERS: dict[str, tuple[frozenset[Audience], Access]] = {
    "nobody": (frozenset(), READ),
    "ingest token": (frozenset({INGESTERS}), READ),
    "admin token": (frozenset({ADMINS, DASHBOARD}), READ),
    "dashboard cookie": (frozenset({DASHBOARD}), READ),
    **{f"tenant token ({a})": (frozenset({TENANT}), a) for a in Access},
    **{f"portal cookie ({a})": (frozenset({PORTAL}), a) for a in Access},
}
_PARAMETERS = {
    "namespace": "default",
    "name": "orders",
    "id": "1",
    "file": "style.css",
    "token": "hlpl_" + "x" * 43,
    "type": "order.paid",
}


@pytest.fixture
async def api(dsn: str, settings: Settings) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    configured = replace(settings, portal_endpoints="local", portal_https_only=False)
    async with in_process_api(dsn, configured, INGEST, ADMIN) as client:
        yield client


def _routes(api: TestClient) -> dict[tuple[str, str], tuple[Audience | None, Access | None]]:  # type: ignore[type-arg]
    return {
        (route.method, route.resource.canonical): (
            getattr(route.handler, "audience", None),
            getattr(route.handler, "access", None),
        )
        for route in api.server.app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


async def test_every_route_is_in_the_table_with_its_audience(api):
    found = _routes(api)
    assert sorted(found.keys() - ROUTES.keys()) == [], "routes missing from ROUTES"
    assert sorted(ROUTES.keys() - found.keys()) == [], "ROUTES lists routes the app does not have"
    for key, (who, access) in ROUTES.items():
        marked_who, marked_access = found[key]
        assert marked_who is who, key
        if who in (TENANT, PORTAL):
            assert marked_access is access, key


async def _headers(api: TestClient, caller: str) -> dict[str, str]:  # type: ignore[type-arg]
    # A page's own forms: the portal's and the dashboard's changes need it.
    headers = {"Sec-Fetch-Site": "same-origin"}
    if caller == "ingest token":
        return {**headers, "Authorization": f"Bearer {INGEST}"}
    if caller == "admin token":
        return {**headers, "Authorization": f"Bearer {ADMIN}"}
    if caller == "dashboard cookie":
        return {**headers, "Cookie": f"{SESSION_COOKIE}={ADMIN}"}
    if caller == "nobody":
        return headers
    access = caller.split("(")[1].rstrip(")")
    response = await api.post(
        "/v1/admin/portal-sessions",
        headers={"Authorization": f"Bearer {ADMIN}"},
        json={"tenant": "acme", "access": access, "kind": "token"},
    )
    token = (await response.json())["token"]
    if caller.startswith("tenant"):
        return {**headers, "Authorization": f"Bearer {token}"}
    return {**headers, "Cookie": f"{PORTAL_COOKIE}={token}"}


def _refused(method: str, status: int, location: str) -> bool:
    return status in (401, 403) or (method == "GET" and status == 303 and location.endswith(LOGIN_PATH))


@pytest.mark.parametrize(("method", "path"), sorted(ROUTES), ids=[f"{m} {p}" for m, p in sorted(ROUTES)])
async def test_a_route_admits_its_audience_and_refuses_every_other(api, method, path):
    who, needed = ROUTES[method, path]
    url = re.sub(r"\{(\w+)\}", lambda m: _PARAMETERS[m[1]], path)
    answers = {}
    for caller, (audiences, access) in CALLERS.items():
        response = await api.request(method, url, headers=await _headers(api, caller), allow_redirects=False)
        answers[caller] = response.status
        refused = _refused(method, response.status, response.headers.get("Location", ""))
        admitted = who in audiences and access >= needed
        if who is OPEN:
            continue
        assert refused is not admitted, (caller, response.status, await response.text())
    if who is OPEN:
        # An open route answers the same whoever calls.
        assert len(set(answers.values())) == 1, answers
