"""What people see of ordered delivery (issue 42), on a real Postgres: an
endpoint's keys held back and why in the admin and tenant APIs, the
ordering key and number of each delivery, and the held keys' pages."""

from __future__ import annotations

import re
from typing import Any

import asyncpg
from aiohttp.test_utils import TestClient
from openapi_schema_validator import OAS31Validator

import hooklane
from hooklane import store
from hooklane.api.auth import PORTAL_COOKIE
from hooklane.store.queries import QUERIES
from testsupport.api import grant
from testsupport.api_admin import AUTH, call, openapi_document
from testsupport.fixtures import add_endpoint
from testsupport.held_keys import kill_head, publish_ordered

EP = "/v1/admin/endpoints/default"


def conforms(body: Any, schema: str) -> None:
    components = openapi_document()["components"]
    OAS31Validator({"$ref": f"#/components/schemas/{schema}", "components": components}).validate(body)


async def held_order(db: asyncpg.Connection, name: str = "orders") -> int:
    """Endpoint ``name`` with key order-1 held by its dead head (two events
    behind it), key order-2 due with one behind, and an unordered event;
    the dead head's id."""
    await add_endpoint(db, name, "http://127.0.0.1:9/hook")
    await publish_ordered(db, "order-1", ["o1-created", "o1-paid", "o1-refunded"])
    await publish_ordered(db, "order-2", ["o2-created", "o2-paid"])
    await hooklane.publish(db, tenant="acme", type="order.paid", data={}, id="plain")
    return await kill_head(db, name, "order-1", "HTTP 503: upstream down")


async def test_the_ordering_route_says_which_keys_are_held_and_why(api, db):
    head = await held_order(db)
    body = await call(api, "GET", f"{EP}/orders/ordering")
    conforms(body, "AdminOrdering")
    assert {k: body[k] for k in ("on_dead", "keys_outstanding", "keys_held", "waiting", "skipped")} == {
        "on_dead": "hold",
        "keys_outstanding": 2,
        "keys_held": 1,
        "waiting": 3,
        "skipped": 0,
    }
    assert body["next_cursor"] is None
    [held] = body["held_keys"]
    assert held["key"] == "order-1" and held["waiting"] == 2
    assert held["held_since"] == body["oldest_held_since"]
    assert held["head"] == {
        "ordering_seq": 1,
        "delivery_id": head,
        "event_id": "o1-created",
        "event_type": "order.paid",
        "attempts": 1,
        "last_status": 503,
        "last_failure": None,
        "last_error": "HTTP 503: upstream down",
    }


async def test_deliveries_and_attempts_carry_their_key_and_number(api, db):
    head = await held_order(db)
    page = await call(api, "GET", f"{EP}/orders/deliveries")
    conforms(page, "AdminDeliveryPage")
    shown = {d["event_id"]: d for d in page["deliveries"]}
    assert [
        (shown[e]["ordering_key"], shown[e]["ordering_seq"]) for e in ("o1-created", "o1-paid", "plain")
    ] == [
        ("order-1", 1),
        ("order-1", 2),
        (None, None),
    ]
    # Waiting behind its key: pending, with no time of its own.
    assert shown["o1-paid"]["state"] == "pending" and shown["o1-paid"]["next_attempt_at"] is None
    assert shown["o2-created"]["next_attempt_at"] is not None
    assert shown["plain"]["next_attempt_at"] is not None

    detail = await call(api, "GET", f"{EP}/orders/deliveries/{head}")
    conforms(detail, "AdminDeliveryDetail")
    assert (detail["delivery"]["ordering_key"], detail["delivery"]["ordering_seq"]) == ("order-1", 1)
    attempts = await call(api, "GET", f"{EP}/orders/attempts")
    conforms(attempts, "AdminAttemptPage")
    [attempt] = attempts["attempts"]
    assert (attempt["delivery_id"], attempt["ordering_key"], attempt["ordering_seq"]) == (head, "order-1", 1)


async def test_held_keys_page_held_longest_first(api, db):
    await add_endpoint(db, "orders", "http://127.0.0.1:9/hook")
    # Keys of characters a cursor must carry whole: colons, spaces, quotes,
    # the longest a key may be.
    keys = ["a:b", 'order 7 "eu":paid', "k" * 255, "~:%/" * 63]
    for i, key in enumerate(keys):
        await publish_ordered(db, key, [f"e{i}-1", f"e{i}-2"])
        await kill_head(db, "orders", key)
    # Two held at the same instant: the key breaks the tie.
    await db.execute(
        "UPDATE ordering_keys SET held_since = timestamptz '2026-01-01' + "
        "CASE key WHEN 'a:b' THEN interval '2 minutes' ELSE interval '1 minute' END"
    )
    seen: list[str] = []
    cursor = None
    for _ in range(4):
        params = {"limit": "1", **({"cursor": cursor} if cursor else {})}
        body = await call(api, "GET", f"{EP}/orders/ordering", params=params)
        conforms(body, "AdminOrdering")
        assert body["keys_held"] == 4 and body["waiting"] == 4
        seen += [k["key"] for k in body["held_keys"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    ties = sorted(await db.fetchval("SELECT array_agg(key) FROM ordering_keys WHERE key <> 'a:b'"))
    collated = await db.fetchval("SELECT array_agg(k ORDER BY k) FROM unnest($1::text[]) k", ties)
    assert seen[:3] == collated and seen[3:] == ["a:b"]
    # The last page is a full one: its cursor leads to an empty page.
    last = await call(api, "GET", f"{EP}/orders/ordering", params={"cursor": cursor})
    assert (last["held_keys"], last["next_cursor"]) == ([], None)


async def test_bad_ordering_parameters_are_named(api, db):
    await add_endpoint(db, "orders", "http://127.0.0.1:9/hook")
    for params, field in (
        ({"cursor": "bm90IGEgY3Vyc29y"}, "cursor"),
        ({"cursor": "x" * 2000}, "cursor"),
        ({"limit": "0"}, "limit"),
        ({"limit": "many"}, "limit"),
    ):
        body = await call(api, "GET", f"{EP}/orders/ordering", 422, params=params)
        assert (body["error"], body["field"]) == ("invalid", field), params
    assert (await call(api, "GET", f"{EP}/missing/ordering", 404))["error"] == "not_found"


async def test_a_skipping_endpoint_counts_what_it_skipped(api, db):
    await add_endpoint(db, "orders", "http://127.0.0.1:9/hook")
    await db.execute("UPDATE endpoints SET ordering_on_dead = 'skip'")
    await publish_ordered(db, "order-1", ["o1-created", "o1-paid"])
    await kill_head(db, "orders", "order-1")
    body = await call(api, "GET", f"{EP}/orders/ordering")
    assert {k: body[k] for k in ("on_dead", "keys_outstanding", "keys_held", "waiting", "skipped")} == {
        "on_dead": "skip",
        "keys_outstanding": 1,
        "keys_held": 0,
        "waiting": 0,
        "skipped": 1,
    }
    assert body["held_keys"] == [] and body["oldest_held_since"] is None
    # The next of the key went on: due now, number 2.
    page = await call(api, "GET", f"{EP}/orders/deliveries", params={"state": "pending"})
    [due] = page["deliveries"]
    assert (due["event_id"], due["ordering_seq"]) == ("o1-paid", 2) and due["next_attempt_at"] is not None


async def test_an_endpoint_without_ordered_deliveries_has_nothing_held(api, db):
    await add_endpoint(db, "orders", "http://127.0.0.1:9/hook")
    await hooklane.publish(db, tenant="acme", type="order.paid", data={}, id="plain")
    body = await call(api, "GET", f"{EP}/orders/ordering")
    assert body == {
        "on_dead": "hold",
        "keys_outstanding": 0,
        "keys_held": 0,
        "oldest_held_since": None,
        "waiting": 0,
        "skipped": 0,
        "held_keys": [],
        "next_cursor": None,
    }


async def test_a_tenant_sees_its_own_held_keys_only(api: TestClient, db):  # type: ignore[type-arg]
    head = await held_order(db)
    await add_endpoint(db, "theirs", "http://127.0.0.1:9/hook", tenant="globex")
    token = (await grant(api, "acme"))["token"]
    auth = {"Authorization": f"Bearer {token}"}
    mine = await api.get("/v1/tenant/endpoints/default/orders/ordering", headers=auth)
    body = await mine.json()
    assert mine.status == 200, body
    assert body == await call(api, "GET", f"{EP}/orders/ordering")
    assert body["held_keys"][0]["head"]["delivery_id"] == head
    delivery = await api.get(f"/v1/tenant/endpoints/default/orders/deliveries/{head}", headers=auth)
    assert (await delivery.json())["delivery"]["ordering_key"] == "order-1"
    theirs = await api.get("/v1/tenant/endpoints/default/theirs/ordering", headers=auth)
    assert theirs.status == 404 and (await theirs.json())["error"] == "not_found"


async def test_status_counts_held_keys_per_endpoint(db):
    await held_order(db, "orders")
    quiet = await add_endpoint(db, "quiet", "http://127.0.0.1:9/hook", event_types=["nothing.*"])
    ids = await db.fetchval("SELECT array_agg(id) FROM endpoints")
    assert await store.held_key_counts(db, [quiet]) == []
    [counted] = await store.held_key_counts(db, ids)
    assert (counted.namespace, counted.name, counted.tenant, counted.keys_held) == (
        "default",
        "orders",
        "acme",
        1,
    )
    held_since = await db.fetchval("SELECT held_since FROM ordering_keys WHERE key = 'order-1'")
    assert counted.oldest_held_since == held_since


# --- the pages ---------------------------------------------------------------------


def ordering_section(page: str) -> str:
    start = page.index('<section class="ordering-state"')
    return page[start : page.index("</section>", start)]


async def test_the_dashboard_shows_held_keys_and_each_delivery_its_key(api, db):
    head = await held_order(db)
    response = await api.get("/dashboard/endpoints/default/orders", headers=AUTH)
    page = await response.text()
    assert response.status == 200, page
    section = ordering_section(page)
    assert '<div class="keys-held"><dt>Keys held</dt><dd>1 ' in section
    assert '<div class="waiting"><dt>Waiting behind their key</dt><dd>3</dd>' in section
    row = section[section.index('<tr data-key="order-1">') :]
    row = row[: row.index("</tr>")]
    assert f'href="/dashboard/endpoints/default/orders/deliveries/{head}"' in row
    assert "HTTP 503: upstream down" in row and "o1-created" in row
    assert '<td class="num">2</td>' in row
    # The listing: each ordered delivery's key and number, and what waits.
    assert "key <code>order-1</code> #2" in page and "behind its key" in page

    response = await api.get(f"/dashboard/endpoints/default/orders/deliveries/{head}", headers=AUTH)
    delivery = await response.text()
    assert response.status == 200, delivery
    assert (
        '<dt>Ordering key</dt><dd><code>order-1</code> <span class="quiet">number <span class="seq">1</span>'
        in delivery
    )


async def test_an_endpoint_without_ordering_shows_no_ordering_section(api, db):
    await add_endpoint(db, "plain", "http://127.0.0.1:9/hook")
    await hooklane.publish(db, tenant="acme", type="order.paid", data={}, id="plain")
    page = await (await api.get("/dashboard/endpoints/default/plain", headers=AUTH)).text()
    assert "Recent deliveries" in page and "ordering-state" not in page and "Ordering key" not in page


async def test_the_portal_shows_a_tenant_its_held_keys(api, db):
    head = await held_order(db)
    session = (await grant(api, "acme"))["token"]
    cookie = {"Cookie": f"{PORTAL_COOKIE}={session}"}
    response = await api.get("/portal/endpoints/default/orders", headers=cookie)
    page = await response.text()
    assert response.status == 200, page
    section = ordering_section(page)
    assert '<tr data-key="order-1">' in section and "HTTP 503: upstream down" in section
    assert f'href="/portal/endpoints/default/orders/deliveries/{head}"' in section
    response = await api.get(f"/portal/endpoints/default/orders/deliveries/{head}", headers=cookie)
    delivery = await response.text()
    assert response.status == 200, delivery
    assert "<dt>Ordering key</dt><dd><code>order-1</code>" in delivery


# --- the health the operator reflects -------------------------------------------------


async def test_the_health_every_view_reads_counts_held_keys(db):
    await held_order(db)
    [health] = await store.endpoint_health(db, endpoint=("default", "orders"))
    assert health.held_keys == 1
    [listed] = (await store.endpoint_page(db, store.EndpointFilter(), limit=10)).endpoints
    assert listed.held_keys == 1
    # The operator's pass: a change of the held keys alone is a change.
    [(reflected, digest)] = (await store.endpoint_health_changed(db, {}, 10.0)).health
    assert reflected.held_keys == 1
    assert (await store.endpoint_health_changed(db, {reflected.id: digest}, 10.0)).health == []
    await db.execute("UPDATE ordering_keys SET held_since = NULL")
    [(released, _)] = (await store.endpoint_health_changed(db, {reflected.id: digest}, 10.0)).health
    assert released.held_keys == 0


# --- what the counts cost ------------------------------------------------------------

HISTORY = 3_000
# A lookup reads the held keys' heads, what waits behind them and the dead
# deliveries: a few rows here, whatever the endpoint delivered before.
FEW = 20
_SCAN = re.compile(r"Scan.* on deliveries .*actual rows=(\d+) loops=(\d+)")
_REMOVED = re.compile(r"Rows Removed by (?:Filter|Index Recheck): (\d+)")


async def _deliveries_read(db: asyncpg.Connection, statement: str, **params: Any) -> int:
    """The most rows one scan of deliveries read (returned or filtered out)
    in the statement's plan, over its loops."""
    sql, *args = QUERIES[statement](**params)
    lines = [r[0] for r in await db.fetch(f"EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) {sql}", *args)]
    # A node's details follow its line, up to the next node's ("->").
    nodes = "\n".join(lines).split("->")
    counts = []
    for node in nodes:
        if scan := _SCAN.search(node):
            removed = sum(int(n) for n in _REMOVED.findall(node))
            counts.append(int(scan[2]) * (int(scan[1]) + removed))
    assert counts, "\n".join(lines)
    return max(counts)


async def test_the_ordering_state_never_reads_the_delivered_history(db):
    await held_order(db)
    endpoint = await db.fetchval("SELECT id FROM endpoints WHERE name = 'orders'")
    await db.execute(
        "INSERT INTO events (id, tenant, type, data, fanout, ordering_key)"
        " SELECT 'h' || i, 'acme', 'order.paid', '{}', 1, 'order-' || (i % 100) FROM generate_series(1, $1) i",
        HISTORY,
    )
    await db.execute(
        "INSERT INTO deliveries (endpoint_id, event_tenant, event_id, ordering_key, ordering_seq, state,"
        "                        attempts, delivered_at)"
        " SELECT $1, 'acme', 'h' || i, 'order-' || (i % 100), 1000 + i, 'delivered', 1, now()"
        " FROM generate_series(1, $2) i",
        endpoint,
        HISTORY,
    )
    await db.execute("ANALYZE deliveries")
    endpoint_name = {"namespace": "default", "name": "orders"}
    assert await _deliveries_read(db, "endpoint_ordering", **endpoint_name) < FEW
    page = {"after_at": None, "after_key": None, "limit": 100}
    assert await _deliveries_read(db, "held_keys", **endpoint_name, **page) < FEW
    # And the answers are the same as without the history.
    summary = await store.endpoint_ordering(db, "default", "orders")
    assert summary is not None and (summary.keys_held, summary.waiting, summary.skipped) == (1, 3, 0)
