"""The event catalogue read over real HTTP on a real Postgres: the admin
API's and the tenant API's listing (paged, filtered) and one type, the
portal's catalogue page and type picker without JavaScript, and the
OpenAPI export, validated as a document and used as a receiver would: a
body a real worker delivered to a real receiver validates against the
export's schema for its type, and a changed one does not."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate
from referencing import Registry
from referencing.jsonschema import DRAFT202012

import hooklane
from hooklane.api.auth import PORTAL_COOKIE
from hooklane.selfservice import resource_name
from hooklane.settings import Settings
from testsupport.api import ADMIN, ADMIN_AUTH, INGEST, grant
from testsupport.api_admin import openapi_document
from testsupport.catalogue import ORDER_PAID_V2_EXAMPLE, add_order_types
from testsupport.fixtures import add_endpoint, in_process_api, wait_for
from testsupport.portal import OWN_URL
from testsupport.receiver_guide import GUIDE, guide_block
from testsupport.receivers import Answer


@pytest.fixture
async def api(dsn: str, settings: Settings) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    configured = replace(settings, portal_endpoints="local", portal_https_only=False, portal_name="Acme")
    async with in_process_api(dsn, configured, INGEST, ADMIN) as client:
        yield client


async def get(api: TestClient, path: str, headers: dict[str, str], status: int = 200) -> Any:  # type: ignore[type-arg]
    response = await api.get(path, headers=headers)
    body = await response.json()
    assert response.status == status, body
    return body


async def tenant_auth(api: TestClient) -> dict[str, str]:  # type: ignore[type-arg]
    return {"Authorization": f"Bearer {(await grant(api, 'acme'))['token']}"}


# --- the JSON listings --------------------------------------------------------------


async def test_the_admin_and_the_tenant_api_list_the_same_catalogue_by_pages(api, db):
    await add_order_types(db)
    names, cursor = [], None
    while True:
        query = "?limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = await get(api, "/v1/admin/catalogue" + query, ADMIN_AUTH)
        names += [t["name"] for t in page["types"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert names == ["invoice.sent", "order.paid", "order.refunded", "user.created"]

    whole = await get(api, "/v1/admin/catalogue", ADMIN_AUTH)
    assert whole["next_cursor"] is None
    components = openapi_document()["components"]
    OAS31Validator({"$ref": "#/components/schemas/CatalogueTypeList", "components": components}).validate(
        whole
    )
    assert await get(api, "/v1/tenant/catalogue", await tenant_auth(api)) == whole
    paid = next(t for t in whole["types"] if t["name"] == "order.paid")
    assert (paid["group"], paid["description"], paid["latest_version"]) == (
        "orders",
        "An order was paid in full.",
        2,
    )
    assert [v["version"] for v in paid["versions"]] == [1, 2]
    assert paid["versions"][1]["example"] == ORDER_PAID_V2_EXAMPLE
    assert paid["versions"][1]["schema"]["$defs"]["address"]["required"] == ["city"]
    archived = next(t for t in whole["types"] if t["name"] == "invoice.sent")
    refunded = next(t for t in whole["types"] if t["name"] == "order.refunded")
    assert (archived["archived"], refunded["deprecated"], refunded["deprecated_since"]) == (
        True,
        True,
        "2026-06-01",
    )


async def test_the_listing_filters_by_group_and_name_prefix(api, db):
    await add_order_types(db)
    orders = await get(api, "/v1/admin/catalogue?group=orders", ADMIN_AUTH)
    assert [t["name"] for t in orders["types"]] == ["order.paid", "order.refunded"]
    prefixed = await get(api, "/v1/tenant/catalogue?name_prefix=order.r", await tenant_auth(api))
    assert [t["name"] for t in prefixed["types"]] == ["order.refunded"]
    none = await get(api, "/v1/admin/catalogue?group=orders&name_prefix=user", ADMIN_AUTH)
    assert none == {"types": [], "next_cursor": None}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=x", "limit"),
        ("cursor=bm9wZQ", "cursor"),
        ("cursor=" + "A" * 2000, "cursor"),
        ("group=" + "g" * 256, "group"),
        ("name_prefix=" + "n" * 256, "name_prefix"),
        ("name_prefix=a%00b", "name_prefix"),
        ("group=", "group"),
    ],
)
async def test_a_bad_parameter_is_a_422_naming_it(api, query, field):
    body = await get(api, f"/v1/admin/catalogue?{query}", ADMIN_AUTH, status=422)
    assert body["field"] == field


async def test_one_type_and_the_types_there_are_not(api, db):
    await add_order_types(db)
    auth = await tenant_auth(api)
    paid = await get(api, "/v1/tenant/catalogue/order.paid", auth)
    components = openapi_document()["components"]
    OAS31Validator({"$ref": "#/components/schemas/CatalogueType", "components": components}).validate(paid)
    assert paid == await get(api, "/v1/admin/catalogue/order.paid", ADMIN_AUTH)
    assert paid["name"] == "order.paid" and len(paid["versions"]) == 2
    for missing in ("order.payed", "order.*", "a%00b", "x" * 300):
        body = await get(api, f"/v1/admin/catalogue/{missing}", ADMIN_AUTH, status=404)
        assert body["error"] == "not_found"


# --- the export, as a receiver uses it -----------------------------------------------


def body_check(document: dict[str, Any], key: str) -> Draft202012Validator:
    """What a receiver generates from the export: a validator of the body
    of the webhook ``key``, its references resolved in the document."""
    schema = document["webhooks"][key]["post"]["requestBody"]["content"]["application/json"]["schema"]
    registry: Registry[Any] = Registry().with_resource("urn:events", DRAFT202012.create_resource(document))
    return Draft202012Validator({"$ref": "urn:events" + schema["$ref"]}, registry=registry)


async def test_a_real_delivery_validates_against_the_export_and_a_changed_one_does_not(
    api, db, receiver, start_worker
):
    await add_order_types(db)
    await add_endpoint(db, "orders", receiver.on("orders", Answer(204)), tenant="acme")
    start_worker()
    await hooklane.publish(db, tenant="acme", type="order.paid", data=ORDER_PAID_V2_EXAMPLE)
    await wait_for(lambda: receiver.at("orders"))
    delivered = json.loads(receiver.at("orders")[0].body)

    response = await api.get("/v1/catalogue/openapi.json", headers=ADMIN_AUTH)
    assert response.status == 200 and response.content_type == "application/json"
    document = await response.json()
    validate(document)
    assert document["info"]["title"] == "Acme events"
    assert set(document["webhooks"]) == {
        "hooklane.test",
        "invoice.sent",
        "order.paid",
        "order.paid@1",
        "order.refunded",
        "user.created",
    }

    check = body_check(document, delivered["type"])
    check.validate(delivered)
    changed = json.loads(json.dumps(delivered))
    changed["data"]["customer"].pop("email")
    with pytest.raises(ValidationError, match="'email' is a required property"):
        check.validate(changed)
    with pytest.raises(ValidationError):
        check.validate({key: value for key, value in delivered.items() if key != "timestamp"})
    # docs/receivers.md's check, run as written on the same body.
    example: dict[str, Any] = {}
    exec(compile(guide_block("python", "def event_checker("), str(GUIDE), "exec"), example)
    guide_check = example["event_checker"](document)
    assert guide_check(receiver.at("orders")[0].body) == delivered
    # Without the email it is still version 1's data; a text amount is no version's.
    assert guide_check(json.dumps(changed).encode()) == changed
    with pytest.raises(ValidationError, match="'990' is not of type 'integer'"):
        guide_check(json.dumps({**delivered, "data": {**delivered["data"], "amount": "990"}}).encode())
    with pytest.raises(ValidationError, match=r"'order\.payed' is not in the catalogue"):
        guide_check(json.dumps({**delivered, "type": "order.payed"}).encode())
    # Data of the older version is checked against it: accepted.
    older = {**delivered, "data": {"order_id": "ord_1", "amount": 5}}
    assert guide_check(json.dumps(older).encode()) == older
    # The test event an endpoint's owner asks for passes the same checks.
    resend = {"Authorization": f"Bearer {(await grant(api, 'acme', 'resend'))['token']}"}
    asked = await api.post("/v1/tenant/endpoints/default/orders/test-event", headers=resend)
    assert asked.status == 202, await asked.text()
    await wait_for(lambda: len(receiver.at("orders")) == 2)
    test_event = json.loads(receiver.at("orders")[1].body)
    assert test_event["type"] == "hooklane.test"
    body_check(document, "hooklane.test").validate(test_event)
    assert guide_check(receiver.at("orders")[1].body) == test_event
    # The headers it names are the ones that came.
    sent = {k.lower() for k in receiver.at("orders")[0].headers}
    named = {p["name"] for p in document["webhooks"]["order.paid"]["post"]["parameters"] if p["required"]}
    assert named <= sent

    # The tenants' people download the same document from the portal.
    session = (await grant(api, "acme"))["token"]
    portal = await api.get("/portal/catalogue/openapi.json", headers={"Cookie": f"{PORTAL_COOKIE}={session}"})
    assert portal.status == 200
    assert "attachment" in portal.headers["Content-Disposition"]
    assert await portal.json() == document


async def test_an_empty_catalogue_is_a_valid_document(api):
    document = await get(api, "/v1/catalogue/openapi.json", ADMIN_AUTH)
    validate(document)
    # But for the test event, which every endpoint may be sent.
    assert list(document["webhooks"]) == ["hooklane.test"]


# --- the portal ----------------------------------------------------------------------


async def portal(api: TestClient, method: str, path: str, session: str, data: Any = None) -> tuple[int, str]:  # type: ignore[type-arg]
    headers = {"Cookie": f"{PORTAL_COOKIE}={session}"}
    if method == "POST":
        headers["Sec-Fetch-Site"] = "same-origin"
    response = await api.request(method, path, data=data, headers=headers, allow_redirects=False)
    body = await response.text()
    api.session.cookie_jar.clear()
    return response.status, body


async def test_the_catalogue_page_shows_types_schemas_and_examples(api, db):
    await add_order_types(db)
    session = (await grant(api, "acme"))["token"]
    status, page = await portal(api, "GET", "/portal/catalogue", session)
    assert status == 200
    assert 'href="/portal/catalogue"' in page  # the navigation's link
    assert (
        '<tr data-path="customer.address.city"><td class="depth-2"><code>city</code></td><td>string</td><td>required</td>'
        in page
    )
    assert "deprecated since 2026-06-01" in page and '<span class="badge archived"' in page
    assert "&#34;ana@example.com&#34;" in page  # the example, pretty-printed and escaped
    assert "<summary>Version 1</summary>" in page
    empty_session = session
    await db.execute("DELETE FROM catalogue_types")
    status, page = await portal(api, "GET", "/portal/catalogue", empty_session)
    assert status == 200 and "has not described its event types yet" in page


async def test_the_picker_posts_without_javascript_and_the_server_merges_typed_patterns(api, db):
    await add_order_types(db)
    session = (await grant(api, "acme", "manage"))["token"]
    status, form = await portal(api, "GET", "/portal/new", session)
    assert status == 200
    assert 'name="event_type" value="order.paid"' in form
    assert 'value="invoice.sent"' not in form  # archived: not offered
    assert '<code>order.refunded</code> <span class="badge deprecated">deprecated</span>' in form

    data = [
        ("name", "picked"),
        ("url", OWN_URL),
        ("event_type", "order.paid"),
        ("event_type", "user.created"),
        ("event_types", "billing.*, order.paid"),
    ]
    status, created = await portal(api, "POST", "/portal/endpoints", session, aiohttp.FormData(data))
    assert status == 200 and "Endpoint created" in created
    stored = await db.fetchval(
        "SELECT event_types FROM endpoints WHERE name = $1", resource_name("acme", "picked")
    )
    assert list(stored) == ["order.paid", "user.created", "billing.*"]

    # Editing: the catalogue's types ticked, the patterns typed.
    path = f"/portal/endpoints/default/{resource_name('acme', 'picked')}/edit"
    status, form = await portal(api, "GET", path, session)
    assert status == 200
    assert 'value="order.paid" checked' in form and 'value="user.created" checked' in form
    assert 'value="order.refunded">' in form
    assert 'id="event_types" type="text" name="event_types" value="billing.*"' in form

    # A refused form comes back with what was ticked still ticked.
    bad = [("url", "not a url"), ("event_type", "order.refunded")]
    status, form = await portal(api, "POST", path, session, aiohttp.FormData(bad))
    assert status == 422
    assert 'value="order.refunded" checked' in form


async def test_the_picker_offers_only_the_types_the_platform_allows(dsn, settings, db):
    await add_order_types(db)
    bounded = replace(
        settings, portal_endpoints="local", portal_https_only=False, portal_event_types=("order.*",)
    )
    async with in_process_api(dsn, bounded, INGEST, ADMIN) as api:
        session = (await grant(api, "acme", "manage"))["token"]
        status, form = await portal(api, "GET", "/portal/new", session)
    assert status == 200
    assert 'value="order.paid"' in form and 'value="order.refunded"' in form
    assert 'value="user.created"' not in form
