"""The admin API over real HTTP (aiohttp's TestServer on loopback), on a
real Postgres: endpoints and their health, deliveries, the repairs, and
receivers' reconciliation with a stable cursor."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from openapi_schema_validator import OAS31Validator

import hooklane
from hooklane import store
from hooklane.api.app import make_app
from hooklane.api.auth import token_sources
from hooklane.dev.postgres import free_port
from hooklane.settings import Settings
from hooklane.times import rfc3339
from hooklane.tokens import Tokens
from testsupport.api_admin import ADMIN, AUTH, INGEST, call, kill, openapi_document
from testsupport.fixtures import SECRET, add_endpoint, flaky_history, notified, wait_for

EP = "/v1/admin/endpoints/default"


async def publish(db: asyncpg.Connection, n: int, tenant: str = "acme", type_: str = "order.paid") -> None:
    for i in range(n):
        await hooklane.publish(db, tenant=tenant, type=type_, data={"i": i}, id=f"{tenant}-{type_}-{i}")


async def delivery_ids(db: asyncpg.Connection, name: str) -> list[int]:
    return [
        r["id"]
        for r in await db.fetch(
            "SELECT d.id FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id "
            "WHERE ep.name = $1 ORDER BY d.id",
            name,
        )
    ]


# --- access --------------------------------------------------------------------


async def test_the_admin_api_needs_an_admin_token(api):
    for headers in ({}, {"Authorization": f"Bearer {INGEST}"}, {"Authorization": "Bearer x" * 3}):
        response = await api.get("/v1/admin/endpoints", headers=headers)
        assert response.status == 401
        assert (await response.json())["error"] == "unauthorized"
    assert (await call(api, "GET", "/v1/admin/endpoints")) == {"endpoints": [], "next_cursor": None}


# --- endpoints -------------------------------------------------------------------


async def test_endpoints_most_delayed_first_with_their_health(api, db):
    for name in ("idle", "late", "later"):
        await add_endpoint(
            db,
            name,
            f"http://127.0.0.1:9/{name}",
            event_types=[f"{name}.*"],
            ordering_on_dead="skip" if name == "late" else "hold",
        )
    await publish(db, 2, type_="late.x")
    await publish(db, 1, type_="later.x")
    await db.execute(
        "UPDATE deliveries d SET created_at = now() - CASE ep.name WHEN 'later' THEN interval '1 hour' "
        "ELSE interval '1 minute' END FROM endpoints ep WHERE ep.id = d.endpoint_id"
    )
    body = await call(api, "GET", "/v1/admin/endpoints")
    assert [e["name"] for e in body["endpoints"]] == ["later", "late", "idle"]
    later = body["endpoints"][0]
    assert later["pending"] == 1 and 3599 < later["oldest_pending_age_seconds"] < 3700
    assert later["phase"] == "Active" and later["circuit"]["consecutive_failures"] == 0
    assert [e["ordering_on_dead"] for e in body["endpoints"]] == ["Hold", "Skip", "Hold"]

    one = await call(api, "GET", f"{EP}/late")
    assert (one["name"], one["pending"], one["tenant"], one["ordering_on_dead"]) == (
        "late",
        2,
        "acme",
        "Skip",
    )


async def test_unknown_endpoints_and_bad_names(api):
    missing = await call(api, "GET", f"{EP}/missing", 404)
    assert missing["error"] == "not_found" and "default/missing" in missing["detail"]
    for path in (f"{EP}/missing/deliveries", f"{EP}/missing/resend-dead", f"{EP}/missing/reactivate"):
        method = "GET" if path.endswith("deliveries") else "POST"
        assert (await call(api, method, path, 404))["error"] == "not_found"
    bad = await call(api, "GET", "/v1/admin/endpoints/default/Not_A_Name", 422)
    assert bad["field"] == "name"
    bad = await call(api, "GET", "/v1/admin/endpoints/-x-/a", 422)
    assert bad["field"] == "namespace"


# --- endpoint listing: pages and filters ------------------------------------------


async def _many_endpoints(db: asyncpg.Connection) -> None:
    """Eleven endpoints of two tenants in every phase: some with pending
    deliveries of distinct ages, two tied on the same oldest one, some with
    nothing pending (listed last, by name)."""
    names = [f"ep-{i:02d}" for i in range(11)]
    for i, name in enumerate(names):
        await add_endpoint(
            db,
            name,
            f"http://127.0.0.1:9/{name}",
            tenant="acme" if i % 2 else "globex",
            paused=i == 3,
            secret=None if i == 9 else SECRET,
        )
    for tenant in ("acme", "globex"):
        await publish(db, 1, tenant=tenant)
    # Pending on ep-00..ep-07, ep-04 and ep-05 tied; none on the rest.
    await db.execute(
        """UPDATE deliveries d SET created_at = timestamptz '2026-01-01' + (CASE ep.name
               WHEN 'ep-05' THEN 4 ELSE substr(ep.name, 4)::int END) * interval '1 minute'
           FROM endpoints ep WHERE ep.id = d.endpoint_id"""
    )
    await db.execute(
        "DELETE FROM deliveries d USING endpoints ep WHERE ep.id = d.endpoint_id AND ep.name >= 'ep-08'"
    )
    await db.execute(
        """UPDATE endpoints SET consecutive_failures = 9, failing_since = now(),
                  paused_until = now() + CASE name WHEN 'ep-01' THEN interval '1 hour'
                                                   ELSE interval '-1 minute' END
           WHERE name IN ('ep-01', 'ep-06')"""
    )
    await db.execute("UPDATE endpoints SET state = 'deactivated' WHERE name IN ('ep-02', 'ep-10')")


async def _walk(api: TestClient, query: str, limit: int) -> list[list[str]]:
    pages, cursor = [], ""
    while True:
        body = await call(api, "GET", f"/v1/admin/endpoints?limit={limit}&cursor={cursor}{query}")
        pages.append([e["name"] for e in body["endpoints"]])
        assert len(pages[-1]) <= limit
        if body["next_cursor"] is None:
            return pages
        cursor = body["next_cursor"]


async def test_endpoint_list_pages_by_cursor_in_the_oldest_pending_order(api, db):
    await _many_endpoints(db)
    order = [h.name for h in await store.endpoint_health(db)]
    assert order[:8] == ["ep-00", "ep-01", "ep-02", "ep-03", "ep-04", "ep-05", "ep-06", "ep-07"]
    for limit in (1, 2, 3, 4, 11):
        pages = await _walk(api, "", limit)
        assert [n for page in pages for n in page] == order, limit
        # Only the last page may be short; none is empty unless all are.
        assert all(len(page) == limit for page in pages[:-1]) and pages[-1], limit
    # The default page holds them all, and says there is no more.
    body = await call(api, "GET", "/v1/admin/endpoints")
    assert [e["name"] for e in body["endpoints"]] == order and body["next_cursor"] is None


async def test_endpoint_list_paging_survives_a_delivered_head(api, db):
    """An endpoint whose oldest pending delivery goes meanwhile moves later
    in the order: every endpoint that stayed put is still listed once."""
    await _many_endpoints(db)
    body = await call(api, "GET", "/v1/admin/endpoints?limit=3")
    first = [e["name"] for e in body["endpoints"]]
    await db.execute(
        "UPDATE deliveries d SET state = 'delivered' FROM endpoints ep "
        "WHERE ep.id = d.endpoint_id AND ep.name = 'ep-01'"
    )
    body = await call(api, "GET", f"/v1/admin/endpoints?limit=100&cursor={body['next_cursor']}")
    rest = [e["name"] for e in body["endpoints"]]
    everything = [h.name for h in await store.endpoint_health(db)]
    assert first == ["ep-00", "ep-01", "ep-02"]
    assert set(first) | set(rest) == set(everything) and len(set(rest)) == len(rest)
    # It moved behind the cursor, among those with nothing pending: seen twice.
    assert rest[-3:] == ["ep-01", "ep-09", "ep-10"] or "ep-01" in rest


@pytest.mark.parametrize(
    ("query", "chosen"),
    [
        ("tenant=acme", lambda h: h.tenant == "acme"),
        ("name_prefix=ep-0", lambda h: h.name.startswith("ep-0")),
        ("name_prefix=ep-1", lambda h: h.name.startswith("ep-1")),
        ("phase=Active", lambda h: h.standing.state == "Active"),
        ("phase=Paused", lambda h: h.standing.state == "Paused"),
        ("phase=probing", lambda h: h.standing.state == "Probing"),
        ("phase=Deactivated", lambda h: h.standing.state == "Deactivated"),
        ("not_delivering=true", lambda h: h.standing.state != "Active" or not h.signed),
        ("not_delivering=false", lambda h: True),
        (
            "tenant=globex&not_delivering=true",
            lambda h: h.tenant == "globex" and h.standing.state != "Active",
        ),
        ("tenant=&phase=&name_prefix=", lambda h: True),
    ],
)
async def test_endpoint_list_filters_agree_with_the_health_records(api, db, query, chosen):
    """The filters are SQL; the phases are health.py's: both decide alike."""
    await _many_endpoints(db)
    expected = [h.name for h in await store.endpoint_health(db) if chosen(h)]
    assert expected
    for limit in (2, 100):
        assert [n for page in await _walk(api, "&" + query, limit) for n in page] == expected


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("phase=Sleeping", "phase"),
        ("not_delivering=yes", "not_delivering"),
        ("name_prefix=Ep", "name_prefix"),
        ("name_prefix=ep_", "name_prefix"),
        ("tenant=%00", "tenant"),
        ("limit=0", "limit"),
        (f"limit={store.MAX_PAGE + 1}", "limit"),
        ("cursor=not-a-cursor", "cursor"),
        # A deliveries cursor is no endpoint cursor.
        (f"cursor={store.cursor.delivery_cursor(5)}", "cursor"),
    ],
)
async def test_endpoint_list_refuses_what_it_cannot_read(api, query, field):
    body = await call(api, "GET", f"/v1/admin/endpoints?{query}", 422)
    assert (body["error"], body["field"]) == ("invalid", field)


# --- deliveries ------------------------------------------------------------------


async def test_deliveries_by_state_and_time_page_by_page(api, db):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    await publish(db, 5)
    ids = await delivery_ids(db, "a")
    await kill(db, ids[:3])
    await db.execute("UPDATE deliveries SET created_at = now() - interval '2 hours' WHERE id = $1", ids[0])

    every = await call(api, "GET", f"{EP}/a/deliveries")
    assert [d["id"] for d in every["deliveries"]] == ids[::-1] and every["next_cursor"] is None
    pending = every["deliveries"][0]
    assert (pending["state"], pending["event_type"], pending["attempts"]) == ("pending", "order.paid", 0)
    assert pending["next_attempt_at"] is not None and pending["event_id"] == "acme-order.paid-4"
    dead = every["deliveries"][-1]
    assert (dead["state"], dead["last_status"], dead["last_error"], dead["next_attempt_at"]) == (
        "dead",
        500,
        "HTTP 500",
        None,
    )

    seen: list[int] = []
    cursor = None
    while True:
        params = {"state": "dead", "limit": "2", **({"cursor": cursor} if cursor else {})}
        page = await call(api, "GET", f"{EP}/a/deliveries", params=params)
        seen += [d["id"] for d in page["deliveries"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[:3][::-1]

    hour_ago = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    recent = await call(api, "GET", f"{EP}/a/deliveries", params={"state": "dead,pending", "since": hour_ago})
    assert [d["id"] for d in recent["deliveries"]] == ids[1:][::-1]
    old = await call(api, "GET", f"{EP}/a/deliveries", params={"until": hour_ago})
    assert [d["id"] for d in old["deliveries"]] == ids[:1]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"state": "lost"}, "state"),
        ({"state": ""}, "state"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": "ZTE6MTI6YQ"}, "cursor"),  # an events cursor
        ({"since": "2026-03-01T12:00:00"}, "since"),  # no timezone
        ({"until": "yesterday"}, "until"),
        ({"status": "5XX"}, "status"),
        ({"failure": "timed_out"}, "failure"),
    ],
)
async def test_bad_delivery_parameters_are_named(api, db, params, field):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    body = await call(api, "GET", f"{EP}/a/deliveries", 422, params=params)
    assert (body["error"], body["field"]) == ("invalid", field)


async def test_deliveries_by_last_status_and_failure_each_with_its_last_failure(api, db):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    await publish(db, 3)
    ids = await delivery_ids(db, "a")
    await db.execute("UPDATE deliveries SET last_status = 503, last_error = 'HTTP 503' WHERE id = $1", ids[0])
    await db.execute(
        "UPDATE deliveries SET last_failure = 'timeout', last_error = 'timeout: no response within 5 s' "
        "WHERE id = $1",
        ids[1],
    )

    async def listed(**params: str) -> list[tuple[int, Any, Any]]:
        body = await call(api, "GET", f"{EP}/a/deliveries", params=params)
        return [(d["id"], d["last_status"], d["last_failure"]) for d in body["deliveries"]]

    assert await listed() == [(ids[2], None, None), (ids[1], None, "timeout"), (ids[0], 503, None)]
    assert await listed(status="5xx") == await listed(status="503") == [(ids[0], 503, None)]
    assert await listed(status="500") == []
    assert await listed(failure="timeout") == [(ids[1], None, "timeout")]
    assert await listed(failure="tls_error", state="pending") == []


@pytest.fixture
async def flaky(db, receiver, start_worker) -> int:
    """One delivery of endpoint default/flaky answered 503, 500, then 204; its id."""
    return await flaky_history(db, receiver, start_worker)


async def test_a_delivery_shows_its_attempts_in_order(api, db, flaky):
    body = await call(api, "GET", f"{EP}/flaky/deliveries/{flaky}")
    conforms(body, "AdminDeliveryDetail")
    assert (body["endpoint"], body["tenant"], body["attempts_truncated"]) == (
        {"namespace": "default", "name": "flaky"},
        "acme",
        False,
    )
    delivery = body["delivery"]
    assert (delivery["id"], delivery["event_id"], delivery["state"], delivery["attempts"]) == (
        flaky,
        "evt-flaky",
        "delivered",
        3,
    )
    assert (delivery["last_status"], delivery["last_failure"], delivery["last_error"]) == (204, None, None)
    attempts = body["attempts"]
    assert [(a["attempt"], a["outcome"], a["status"], a["error"]) for a in attempts] == [
        (1, "retry", 503, "HTTP 503"),
        (2, "retry", 500, "HTTP 500"),
        (3, "delivered", 204, None),
    ]
    assert all(a["attempted_by"] and a["duration_seconds"] > 0 and a["failure"] is None for a in attempts)
    assert attempts[0]["next_attempt_at"] is not None and attempts[2]["next_attempt_at"] is None
    assert [a["started_at"] for a in attempts] == sorted(a["started_at"] for a in attempts)

    # Only through its own endpoint; an id of none is not found either way.
    await add_endpoint(db, "other", "http://127.0.0.1:9/other")
    for path in (f"{EP}/other/deliveries/{flaky}", f"{EP}/flaky/deliveries/{flaky + 1}"):
        missing = await call(api, "GET", path, 404)
        assert (missing["error"], missing["field"]) == ("not_found", "id")
    assert (await call(api, "GET", f"{EP}/nobody/deliveries/{flaky}", 404))["error"] == "not_found"
    for bad in ("x1", "0", "99999999999999999999"):
        assert (await call(api, "GET", f"{EP}/flaky/deliveries/{bad}", 422))["field"] == "id"


async def test_an_endpoints_attempts_by_filter_and_page(api, db, flaky):
    async def listed(**params: str) -> list[tuple[int, str, Any]]:
        body = await call(api, "GET", f"{EP}/flaky/attempts", params=params)
        conforms(body, "AdminAttemptPage")
        assert all((a["delivery_id"], a["event_id"]) == (flaky, "evt-flaky") for a in body["attempts"])
        return [(a["attempt"], a["outcome"], a["status"]) for a in body["attempts"]]

    every = [(3, "delivered", 204), (2, "retry", 500), (1, "retry", 503)]
    assert await listed() == every
    assert await listed(status="5xx") == every[1:]
    assert await listed(status="503") == every[2:]
    assert await listed(status="2xx", outcome="delivered") == every[:1]
    assert await listed(outcome="retry,dead") == every[1:]
    assert await listed(failure="timeout") == []
    body = await call(api, "GET", f"{EP}/flaky/attempts?outcome=delivered&outcome=retry")
    assert len(body["attempts"]) == 3
    # Outside the range: none, though the endpoint is there.
    day_ago = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    assert await listed(until=day_ago) == []
    assert await listed(since=day_ago) == every

    seen, cursor = [], None
    while True:
        params = {"limit": "1", **({"cursor": cursor} if cursor else {})}
        page = await call(api, "GET", f"{EP}/flaky/attempts", params=params)
        assert len(page["attempts"]) <= 1
        seen += [a["attempt"] for a in page["attempts"]]
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert seen == [3, 2, 1]
    assert (await call(api, "GET", f"{EP}/nobody/attempts", 404))["error"] == "not_found"


_NOW = datetime.now(UTC)


@pytest.mark.parametrize(
    "params, field",
    [
        ({"status": "5XX"}, "status"),
        ({"status": "600"}, "status"),
        ({"status": ""}, "status"),
        ({"failure": "port closed"}, "failure"),
        ({"outcome": "sent"}, "outcome"),
        ({"outcome": "retry,"}, "outcome"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": "ZDE6MQ"}, "cursor"),  # a deliveries cursor
        ({"limit": "0"}, "limit"),
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-03-01T12:00:00"}, "until"),  # no timezone
        ({"until": "0001-01-01T00:00:00+14:00"}, "until"),
        # Longer than 31 days, or empty.
        ({"since": (_NOW - timedelta(days=32)).isoformat()}, "since"),
        ({"since": "2026-01-01T00:00:00Z", "until": "2026-03-01T00:00:00Z"}, "since"),
        ({"since": (_NOW + timedelta(hours=1)).isoformat()}, "since"),
        ({"since": "2026-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since"),
    ],
)
async def test_bad_attempt_parameters_are_named(api, db, params, field):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    body = await call(api, "GET", f"{EP}/a/attempts", 422, params=params)
    assert (body["error"], body["field"]) == ("invalid", field)


async def test_an_attempt_range_of_31_days_is_taken(api, db):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    body = await call(
        api,
        "GET",
        f"{EP}/a/attempts",
        params={"since": "2026-01-01T00:00:00Z", "until": "2026-02-01T00:00:00Z"},
    )
    assert body == {"attempts": [], "next_cursor": None}
    # An `until` at the start of year 1: the default hour before it is clamped.
    assert (await call(api, "GET", f"{EP}/a/attempts", params={"until": "0001-01-01T00:10:00Z"}))[
        "attempts"
    ] == []


# --- repairs -----------------------------------------------------------------------


async def test_resend_one_or_all_dead(api, db):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    await publish(db, 3)
    ids = await delivery_ids(db, "a")
    await kill(db, ids[:2])
    assert await call(api, "POST", f"{EP}/a/deliveries/{ids[0]}/resend") == {"resent": 1}
    # not dead (any more), or not there: nothing to resend
    for other in (ids[0], ids[2], 999999):
        body = await call(api, "POST", f"{EP}/a/deliveries/{other}/resend", 404)
        assert body["field"] == "id"
    assert (await call(api, "POST", f"{EP}/a/deliveries/x1/resend", 422))["field"] == "id"
    # a resend wakes the endpoint for the workers
    heard = await notified(db, lambda: call(api, "POST", f"{EP}/a/resend-dead"))
    assert [w.endpoints for w in heard] == [(await db.fetchval("SELECT id FROM endpoints"),)]
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'pending'") == 3


async def test_a_resend_keeps_when_the_delivery_was_created(api, db):
    """A delivery made days ago, dead, then resent (one, then all): it is
    shown created when it was made, queued again at the resend, and the
    creation filters find it by its creation; its age, which the workers
    read, starts anew."""
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    await publish(db, 2)
    ids = await delivery_ids(db, "a")
    await kill(db, ids)
    await db.execute("UPDATE deliveries SET created_at = now() - interval '3 days'")
    made = {r["id"]: r["created_at"] for r in await db.fetch("SELECT id, created_at FROM deliveries")}

    async def shown(delivery: int) -> dict[str, Any]:
        detail = await call(api, "GET", f"{EP}/a/deliveries/{delivery}")
        conforms(detail, "AdminDeliveryDetail")
        listing = await call(api, "GET", f"{EP}/a/deliveries")
        conforms(listing, "AdminDeliveryPage")
        (listed,) = [d for d in listing["deliveries"] if d["id"] == delivery]
        assert listed == detail["delivery"]
        return listed

    before = datetime.now(UTC)
    assert await call(api, "POST", f"{EP}/a/deliveries/{ids[0]}/resend") == {"resent": 1}
    assert await call(api, "POST", f"{EP}/a/resend-dead") == {"resent": 1, "complete": True}
    first = {}
    for delivery in ids:
        d = await shown(delivery)
        assert d["created_at"] == rfc3339(made[delivery])
        first[delivery] = datetime.fromisoformat(d["queued_at"])
        assert first[delivery] >= before
    # What the workers count the age from: the resend.
    assert await db.fetchval("SELECT bool_and(created_at >= $1) FROM deliveries", before)

    two_days_ago = (datetime.now(UTC) - timedelta(days=2)).isoformat()
    recent = await call(api, "GET", f"{EP}/a/deliveries", params={"since": two_days_ago})
    assert recent["deliveries"] == []
    old = await call(api, "GET", f"{EP}/a/deliveries", params={"until": two_days_ago})
    assert [d["id"] for d in old["deliveries"]] == ids[::-1]

    # Dead again and resent again: still the first creation, a later queueing.
    await kill(db, ids[:1])
    assert await call(api, "POST", f"{EP}/a/deliveries/{ids[0]}/resend") == {"resent": 1}
    again = await shown(ids[0])
    assert again["created_at"] == rfc3339(made[ids[0]])
    assert datetime.fromisoformat(again["queued_at"]) >= first[ids[0]]

    # One never resent is queued when it was created.
    await publish(db, 1, type_="order.shipped")
    fresh = (await call(api, "GET", f"{EP}/a/deliveries", params={"limit": "1"}))["deliveries"][0]
    assert fresh["id"] not in ids and fresh["queued_at"] == fresh["created_at"]


async def test_discard_dead_says_who_and_is_final(api, db):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    await publish(db, 4)
    ids = await delivery_ids(db, "a")
    await kill(db, ids[:3])
    assert await call(api, "POST", f"{EP}/a/discard-dead", json={"ids": [ids[0]]}) == {
        "discarded": 1,
        "complete": True,
    }
    assert await call(api, "POST", f"{EP}/a/discard-dead") == {"discarded": 2, "complete": True}
    rows = await db.fetch("SELECT state, last_error FROM deliveries WHERE id = ANY($1::bigint[])", ids[:3])
    assert {r["state"] for r in rows} == {"discarded"}
    assert {r["last_error"] for r in rows} == {"discarded by the admin API (dead of: HTTP 500)"}
    assert await call(api, "POST", f"{EP}/a/resend-dead") == {"resent": 0, "complete": True}
    assert await db.fetchval("SELECT state FROM deliveries WHERE id = $1", ids[3]) == "pending"

    for body, field in (({"ids": []}, "ids"), ({"ids": ["1"]}, "ids"), ({"ids": [0]}, "ids"), ([1], "body")):
        assert (await call(api, "POST", f"{EP}/a/discard-dead", 422, json=body))["field"] == field
    malformed = await api.post(
        f"{EP}/a/discard-dead", data=b"{", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert malformed.status == 400 and (await malformed.json())["error"]
    wrong_type = await api.post(
        f"{EP}/a/discard-dead", data=b"ids=1", headers={**AUTH, "Content-Type": "text/plain"}
    )
    assert wrong_type.status == 415


async def test_replay_sends_the_same_events_again(api, db, receiver, start_worker):
    await add_endpoint(db, "a", receiver.url("/a"))
    await add_endpoint(db, "other", receiver.url("/other"))
    before = datetime.now(UTC) - timedelta(seconds=1)
    await publish(db, 3)
    start_worker()
    await wait_for(lambda: len(receiver.at("/a")) == 3 and len(receiver.at("/other")) == 3)
    # Received is not yet recorded: a delivery still in flight is not replayed.
    await wait_for(lambda: db.fetchval("SELECT count(*) = 6 FROM deliveries WHERE state = 'delivered'"))
    # one more, still pending when the replay runs (never due, so that no
    # worker takes it meanwhile): not queued twice
    async with db.transaction():
        await hooklane.publish(db, tenant="acme", type="order.paid", data={}, id="pending-one")
        await db.execute(
            "UPDATE deliveries SET next_attempt_at = now() + interval '1 hour' WHERE state = 'pending'"
        )

    assert await call(api, "POST", f"{EP}/a/replay", json={"since": before.isoformat()}) == {
        "replayed": 3,
        "complete": True,
        "next_cursor": None,
    }
    await wait_for(lambda: len(receiver.at("/a")) == 6)
    ids = [r.headers["webhook-id"] for r in receiver.at("/a")]
    assert sorted(ids[3:]) == sorted(ids[:3])  # the same ids: receivers deduplicate
    assert len(receiver.at("/other")) == 3
    # New deliveries, each created when the replay queued it, not resent.
    listed = (await call(api, "GET", f"{EP}/a/deliveries"))["deliveries"]
    assert len(listed) == 7 and all(d["queued_at"] == d["created_at"] for d in listed)
    replayed = [datetime.fromisoformat(d["created_at"]) for d in listed[:3]]
    assert min(replayed) > max(datetime.fromisoformat(d["created_at"]) for d in listed[3:])
    # nothing since then
    later = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    assert await call(api, "POST", f"{EP}/a/replay", json={"since": later}) == {
        "replayed": 0,
        "complete": True,
        "next_cursor": None,
    }

    for body, field in (({}, "since"), ({"since": "2026-03-01T12:00:00"}, "since"), ({"since": 5}, "since")):
        assert (await call(api, "POST", f"{EP}/a/replay", 422, json=body))["field"] == field
    assert (await call(api, "POST", f"{EP}/a/replay", 422))["field"] == "body"


async def test_reactivate(api, db):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    await db.execute("UPDATE endpoints SET state = 'deactivated', deactivated_reason = 'HTTP 410'")
    assert (await call(api, "GET", f"{EP}/a"))["phase"] == "Deactivated"
    reactivated = await call(api, "POST", f"{EP}/a/reactivate")
    assert reactivated == {"reactivated": True}
    conforms(reactivated, "AdminReactivated")
    assert (await call(api, "GET", f"{EP}/a"))["phase"] == "Active"


async def test_reactivating_an_endpoint_that_is_not_deactivated_leaves_its_circuit(api, db):
    """An active endpoint failing (its circuit counting) is not reset by a
    reactivate: 409, and the failures, pause and failing_since stay."""
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    circuit = "SELECT state, consecutive_failures, failing_since, paused_until, updated_at FROM endpoints WHERE name = 'a'"
    await db.execute(
        "UPDATE endpoints SET consecutive_failures = 7, failing_since = now() - interval '1 hour', "
        "paused_until = now() + interval '1 minute'"
    )
    before = await db.fetchrow(circuit)
    refused = await call(api, "POST", f"{EP}/a/reactivate", 409)
    assert refused["error"] == "not_deactivated" and "not deactivated" in refused["detail"]
    assert await db.fetchrow(circuit) == before
    assert (await call(api, "GET", f"{EP}/a"))["circuit"]["consecutive_failures"] == 7


# --- reconciliation ------------------------------------------------------------------


async def test_events_page_with_a_stable_cursor_over_http(api, db):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    since = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    await publish(db, 5)
    await publish(db, 2, tenant="globex")
    got: list[str] = []
    cursor = None
    for _ in range(3):
        params = {"tenant": "acme", "since": since, "limit": "2", **({"cursor": cursor} if cursor else {})}
        page = await call(api, "GET", "/v1/admin/events", params=params)
        got += [e["id"] for e in page["events"]]
        cursor = page["next_cursor"]
    assert got == [f"acme-order.paid-{i}" for i in range(5)]
    assert page["events"][0]["data"] == {"i": 4} and page["events"][0]["fanout"] == 1
    # the end: the same cursor again, and what commits later comes after it
    empty = await call(
        api, "GET", "/v1/admin/events", params={"tenant": "acme", "since": since, "cursor": cursor}
    )
    assert empty == {"events": [], "next_cursor": cursor}
    await hooklane.publish(db, tenant="acme", type="order.paid", data={}, id="later")
    later = await call(
        api, "GET", "/v1/admin/events", params={"tenant": "acme", "since": since, "cursor": cursor}
    )
    assert [e["id"] for e in later["events"]] == ["later"]

    for params, field in (
        ({"since": since}, "tenant"),
        ({"tenant": "acme"}, "since"),
        ({"tenant": "acme\x01", "since": since}, "tenant"),
        ({"tenant": "acme", "since": "2026-01-01"}, "since"),
        ({"tenant": "acme", "since": since, "cursor": "ZDE6MQ"}, "cursor"),  # a deliveries cursor
    ):
        assert (await call(api, "GET", "/v1/admin/events", 422, params=params))["field"] == field


async def test_an_event_that_commits_late_is_not_skipped(dsn, db):
    """A producer's transaction stores an event and commits after a reader
    paged past the events committed meanwhile: the reader's next page, from
    the same cursor, holds it. (Ordered by created_at, the late event would
    sort before the cursor and never be seen.)"""
    since = datetime.now(UTC) - timedelta(minutes=1)
    await hooklane.publish(db, tenant="acme", type="t.x", data={}, id="first")
    late = await asyncpg.connect(dsn)
    try:
        transaction = late.transaction()
        await transaction.start()
        await hooklane.publish(late, tenant="acme", type="t.x", data={}, id="late")
        await hooklane.publish(db, tenant="acme", type="t.x", data={}, id="after")
        page = await store.list_events(db, "acme", since)
        assert [e.id for e in page.events] == ["first"]  # "after" waits behind the open transaction
        again = await store.list_events(db, "acme", since, cursor=page.cursor)
        assert again.events == [] and again.cursor == page.cursor
        await transaction.commit()
    finally:
        await late.close()
    rest = await store.list_events(db, "acme", since, cursor=page.cursor)
    assert [e.id for e in rest.events] == ["late", "after"]


async def test_unrouted_events_per_tenant_and_type(api, db):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a", event_types=["order.*"])
    await publish(db, 2)  # routed
    await publish(db, 3, type_="invoice.paid")
    await publish(db, 1, tenant="globex")
    body = await call(api, "GET", "/v1/admin/unrouted")
    assert body["total"] == 4
    assert [(u["tenant"], u["type"], u["events"]) for u in body["unrouted"]] == [
        ("acme", "invoice.paid", 3),
        ("globex", "order.paid", 1),
    ]
    assert body["unrouted"][0]["oldest"] <= body["unrouted"][0]["newest"]


async def test_the_api_answers_503_while_the_database_is_away(api, database_outage):
    with database_outage():
        response = await api.get("/v1/admin/endpoints", headers=AUTH)
        assert response.status == 503 and response.headers["Retry-After"]
        assert (await response.json())["error"] == "unavailable"


# --- the document ------------------------------------------------------------------


def conforms(body: Any, schema: str) -> None:
    """``body`` is valid by the OpenAPI document's component ``schema``."""
    components = openapi_document()["components"]
    OAS31Validator({"$ref": f"#/components/schemas/{schema}", "components": components}).validate(body)


async def test_answers_match_the_openapi_document(api, db):
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    since = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    await publish(db, 3)
    await publish(db, 1, tenant="globex")
    ids = await delivery_ids(db, "a")
    await kill(db, ids[:2])
    await db.execute("UPDATE deliveries SET state = 'sending', attempted_by = 'pod-1' WHERE id = $1", ids[2])
    await db.execute("UPDATE endpoints SET consecutive_failures = 20, paused_until = now() + interval '1 m'")
    # An attempt without an answer, so that the nullable enums are checked too.
    await db.execute(
        """INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,
                                          started_at, outcome, failure, error, next_attempt_at)
           SELECT id, 1, endpoint_id, 'acme', event_id, now(), 'retry', 'timeout', 'timeout', now()
           FROM deliveries WHERE id = $1""",
        ids[0],
    )
    await db.execute("UPDATE deliveries SET last_failure = 'timeout' WHERE id = $1", ids[0])
    answers = [
        ("GET", f"{EP}/a/deliveries/{ids[0]}", {}, "AdminDeliveryDetail"),
        ("GET", f"{EP}/a/attempts", {}, "AdminAttemptPage"),
        ("GET", f"{EP}/a/deliveries/{ids[0] + 100}", {"expect": 404}, "Error"),
        ("GET", f"{EP}/a/attempts", {"params": {"outcome": "sent"}, "expect": 422}, "Error"),
        ("GET", "/v1/admin/endpoints", {}, "AdminEndpointList"),
        ("GET", f"{EP}/a", {}, "AdminEndpoint"),
        ("GET", f"{EP}/a/deliveries", {"params": {"limit": "2"}}, "AdminDeliveryPage"),
        ("GET", "/v1/admin/events", {"params": {"tenant": "acme", "since": since}}, "AdminEventPage"),
        ("GET", "/v1/admin/unrouted", {}, "AdminUnroutedList"),
        ("POST", f"{EP}/a/deliveries/{ids[0]}/resend", {}, "AdminResent"),
        ("POST", f"{EP}/a/discard-dead", {"json": {"ids": [ids[1]]}}, "AdminDiscarded"),
        ("POST", f"{EP}/a/resend-dead", {}, "AdminResentAll"),
        ("POST", f"{EP}/a/replay", {"json": {"since": since}}, "AdminReplayed"),
        ("POST", f"{EP}/a/reactivate", {"expect": 409}, "Error"),
        ("GET", f"{EP}/missing", {"expect": 404}, "Error"),
        ("GET", f"{EP}/a/deliveries", {"params": {"state": "x"}, "expect": 422}, "Error"),
    ]
    for method, path, kwargs, schema in answers:
        conforms(await call(api, method, path, kwargs.pop("expect", 200), **kwargs), schema)
    listed = await call(api, "GET", f"{EP}/a/attempts")
    assert [(a["delivery_id"], a["failure"]) for a in listed["attempts"]] == [(ids[0], "timeout")]


async def test_a_malformed_cursor_is_refused_even_with_the_database_away(settings: Settings) -> None:
    configured = replace(settings, admin_tokens=Tokens.parse(ADMIN, "HOOKLANE_ADMIN_TOKENS"))
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/hooklane"
    pool = await store.create_pool(closed, min_size=0, max_size=2, server_settings=store.API_SESSION)
    app = make_app(
        configured, pool, *token_sources(replace(configured, api_tokens=Tokens.parse(INGEST, "t")))
    )
    try:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            for path, field in (
                ("deliveries?cursor=not-a-cursor", "cursor"),
                ("deliveries?status=5XX", "status"),
                ("deliveries/x1", "id"),
                ("attempts?cursor=not-a-cursor", "cursor"),
                ("attempts?outcome=sent", "outcome"),
                ("attempts?since=2026-01-01T00:00:00Z", "since"),
            ):
                refused = await call(client, "GET", f"{EP}/orders/{path}", 422)
                assert refused["field"] == field
            # A well-formed request does need the database: 503, not a 422.
            await call(client, "GET", f"{EP}/orders/deliveries", 503)
    finally:
        await pool.close()
