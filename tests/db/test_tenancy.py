"""Tenant isolation: an event is (tenant, id), and an endpoint that moves to
another tenant never receives the old tenant's events. Real Postgres, real
receivers."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane import store
from hooklane.errors import EventConflict, InvalidInput
from hooklane.policies import CircuitPolicy
from hooklane.spec import EndpointSpec
from testsupport.fixtures import SECRET, add_endpoint, reserve_round, wait_for

ALL = list(range(32))
DISCARDED = "discarded: the endpoint's tenant changed from acme to globex"


async def _reserve(db: asyncpg.Connection) -> list[asyncpg.Record]:
    return await reserve_round(db)


async def _states(db: asyncpg.Connection) -> list[tuple[str, str, str, str | None]]:
    rows = await db.fetch("SELECT event_tenant, event_id, state, last_error FROM deliveries ORDER BY id")
    return [tuple(r) for r in rows]


async def _move(db: asyncpg.Connection, name: str, url: str, tenant: str) -> store.endpoints.Upserted:
    spec = EndpointSpec(namespace="default", name=name, url=url, tenant=tenant)
    return await store.upsert_endpoint(db, spec, SECRET)


# --- the same id from two tenants ------------------------------------------


async def test_the_same_id_from_two_tenants_is_two_events_each_delivered_to_its_own(
    db, receiver, start_worker
):
    await add_endpoint(db, "acme", receiver.url("acme"), tenant="acme")
    await add_endpoint(db, "globex", receiver.url("globex"), tenant="globex")
    first = await hooklane.publish(db, tenant="acme", type="order.paid", data={"who": "acme"}, id="order-1")
    second = await hooklane.publish(
        db, tenant="globex", type="order.paid", data={"who": "globex"}, id="order-1"
    )
    assert first == second == "order-1"
    assert sorted(tuple(r) for r in await db.fetch("SELECT tenant, data->>'who' FROM events")) == [
        ("acme", "acme"),
        ("globex", "globex"),
    ]
    start_worker()
    await wait_for(lambda: len(receiver.received) == 2)
    for path in ("acme", "globex"):
        (got,) = receiver.at(path)
        payload = Webhook(SECRET).verify(got.body, got.headers)
        assert (payload["id"], payload["data"]) == ("order-1", {"who": path})


async def test_listing_and_retention_see_each_tenants_event_apart(db):
    await add_endpoint(db, "acme", "http://127.0.0.1:1/a", tenant="acme")
    await add_endpoint(db, "globex", "http://127.0.0.1:1/g", tenant="globex")
    for tenant in ("acme", "globex"):
        await hooklane.publish(db, tenant=tenant, type="order.paid", data={"who": tenant}, id="order-1")
    now = datetime.now(UTC)
    page = await store.list_events(db, "globex", now - timedelta(minutes=1), now + timedelta(minutes=1))
    (listed,) = page.events
    assert json.loads(listed.data) == {"who": "globex"}
    # Both past retention; acme's was delivered, globex's is still pending:
    # only acme's goes, and globex's delivery keeps its event.
    await db.execute("UPDATE events SET created_at = now() - interval '40 days'")
    await db.execute("UPDATE deliveries SET state = 'delivered' WHERE event_tenant = 'acme'")
    assert await store.purge_events(db, 30 * 24 * 3600.0) == 1
    assert [tuple(r) for r in await db.fetch("SELECT tenant, id FROM events")] == [("globex", "order-1")]
    (row,) = await _reserve(db)
    assert (row.name, json.loads(row.data)) == ("globex", {"who": "globex"})


# --- the same id again from the same tenant --------------------------------


async def test_the_same_event_again_is_stored_once_and_answered_the_same(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    event = {
        "tenant": "acme",
        "type": "order.paid",
        "data": {"id": 7, "lines": [1, 2]},
        "coalesce_key": "order-7",
    }
    assert await hooklane.publish(db, **event, id="evt-1") == "evt-1"
    # jsonb equality: the order of keys is not content
    again = dict(event, data={"lines": [1, 2], "id": 7})
    assert await hooklane.publish(db, **again, id="evt-1") == "evt-1"
    assert await db.fetchval("SELECT count(*) FROM events") == 1
    assert len(await _states(db)) == 1


@pytest.mark.parametrize(
    "change",
    [{"type": "order.refunded"}, {"data": {"id": 8}}, {"coalesce_key": "order-8"}, {"coalesce_key": None}],
    ids=["type", "data", "coalesce_key", "no-coalesce_key"],
)
async def test_the_same_id_with_other_content_is_refused_and_the_transaction_goes_on(db, change):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    event = {"tenant": "acme", "type": "order.paid", "data": {"id": 7}, "coalesce_key": "order-7"}
    await db.execute("CREATE TABLE orders (id int)")
    async with db.transaction():
        await hooklane.publish(db, **event, id="evt-1")
        with pytest.raises(EventConflict) as refused:
            await hooklane.publish(db, **dict(event, **change), id="evt-1")
        # no SQL error: the caller's transaction is still usable and commits
        await db.execute("INSERT INTO orders VALUES (1)")
    assert isinstance(refused.value, InvalidInput) and refused.value.field == "id"
    assert "already published by tenant 'acme' with different content" in str(refused.value)
    assert await db.fetchval("SELECT count(*) FROM orders") == 1
    stored = await db.fetchrow("SELECT type, data::text, coalesce_key FROM events")
    assert tuple(stored) == ("order.paid", '{"id": 7}', "order-7")
    assert len(await _states(db)) == 1


async def test_a_conflict_is_seen_when_the_first_publish_commits_while_the_second_waits(db, dsn):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    other = await asyncpg.connect(dsn)
    try:
        first = other.transaction()
        await first.start()
        await hooklane.publish(other, tenant="acme", type="order.paid", data={"v": 1}, id="evt-1")
        # The second waits on the first's uncommitted row, which its own
        # snapshot cannot see once the first commits.
        second = asyncio.create_task(
            hooklane.publish(db, tenant="acme", type="order.paid", data={"v": 2}, id="evt-1")
        )
        await wait_for(
            lambda: other.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
        )
        await first.commit()
        with pytest.raises(EventConflict):
            await second
        same = await hooklane.publish(db, tenant="acme", type="order.paid", data={"v": 1}, id="evt-1")
        assert same == "evt-1"
    finally:
        await other.close()
    assert await db.fetchval("SELECT data->>'v' FROM events") == "1"


# --- an endpoint that changes tenant ----------------------------------------


async def test_a_tenant_change_discards_the_old_tenants_pending_and_dead_deliveries(db, caplog):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", tenant="acme")
    for n in range(3):
        await hooklane.publish(db, tenant="acme", type="order.paid", data={}, id=f"evt-{n}")
    sent = await _reserve(db)
    done, dead = sent[0], sent[1]
    await store.complete(
        db,
        [
            store.Result.delivered(done.id, done.attempts, status=200),
            store.Result.dead(dead.id, dead.attempts, status=413, error="HTTP 413"),
        ],
        CircuitPolicy(),
        ALL,
    )
    await db.execute("UPDATE deliveries SET state = 'pending' WHERE state = 'sending'")

    with caplog.at_level(logging.WARNING, logger="hooklane.store.endpoints"):
        moved = await _move(db, "a", "http://127.0.0.1:1/a", "globex")
    assert (moved.previous_tenant, moved.discarded) == ("acme", 2)
    assert "endpoint default/a moved from tenant acme to globex: 2 pending or dead" in caplog.text
    assert sorted(s for _, _, s, _ in await _states(db)) == ["delivered", "discarded", "discarded"]
    assert {e for _, _, s, e in await _states(db) if s == "discarded"} == {DISCARDED}
    assert await store.resend_dead(db, "default", "a") == 0
    assert await _reserve(db) == []
    # an update that keeps the tenant reports no change
    again = await _move(db, "a", "http://127.0.0.1:1/a", "globex")
    assert (again.previous_tenant, again.discarded) == (None, 0)


async def test_after_a_tenant_change_the_receiver_gets_only_the_new_tenants_events(
    db, dsn, receiver, start_worker
):
    url = receiver.url("hook")
    await add_endpoint(db, "a", url, tenant="acme")
    await hooklane.publish(db, tenant="acme", type="order.paid", data={"who": "acme"}, id="queued")
    # A publish still open when the tenant changes matched the endpoint
    # under the old tenant; its delivery commits after the discard.
    late = await asyncpg.connect(dsn)
    try:
        async with late.transaction():
            await hooklane.publish(late, tenant="acme", type="order.paid", data={"who": "acme"}, id="late")
            await _move(db, "a", url, "globex")
    finally:
        await late.close()
    await hooklane.publish(db, tenant="globex", type="order.paid", data={"who": "globex"}, id="new")
    start_worker()
    await wait_for(lambda: receiver.at("hook"))

    async def settled() -> bool:
        return await db.fetchval("SELECT count(*) FROM deliveries WHERE state IN ('pending', 'sending')") == 0

    await wait_for(settled)
    assert [json.loads(r.body)["data"] for r in receiver.at("hook")] == [{"who": "globex"}]
    assert sorted((i, s, e) for _, i, s, e in await _states(db)) == [
        ("late", "discarded", DISCARDED),
        ("new", "delivered", None),
        ("queued", "discarded", DISCARDED),
    ]


@pytest.mark.parametrize("outcome", ["retry", "dead"])
async def test_a_failure_in_flight_across_a_tenant_change_is_discarded_not_retried(db, outcome):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", tenant="acme")
    await hooklane.publish(db, tenant="acme", type="order.paid", data={}, id="evt-1")
    (row,) = await _reserve(db)
    await _move(db, "a", "http://127.0.0.1:1/a", "globex")
    await store.complete(
        db, [store.Result(row.id, row.attempts, outcome, 0.0, 503, "HTTP 503")], CircuitPolicy(), ALL
    )
    assert await _states(db) == [("acme", "evt-1", "discarded", DISCARDED + " (HTTP 503)")]
    assert await store.resend_dead(db, "default", "a") == 0


async def test_a_success_in_flight_across_a_tenant_change_is_recorded(db):
    # Reserved under the old tenant and already on its way: it finishes.
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", tenant="acme")
    await hooklane.publish(db, tenant="acme", type="order.paid", data={}, id="evt-1")
    (row,) = await _reserve(db)
    await _move(db, "a", "http://127.0.0.1:1/a", "globex")
    await store.complete(db, [store.Result.delivered(row.id, row.attempts, status=200)], CircuitPolicy(), ALL)
    assert await _states(db) == [("acme", "evt-1", "delivered", None)]


async def test_resend_never_takes_another_tenants_dead_delivery(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", tenant="acme")
    await hooklane.publish(db, tenant="acme", type="order.paid", data={}, id="evt-1")
    await _reserve(db)
    await _move(db, "a", "http://127.0.0.1:1/a", "globex")
    # what a worker of the previous version records for a failure in flight
    # across the change: dead, not discarded
    await db.execute("UPDATE deliveries SET state = 'dead', last_error = 'HTTP 413'")
    assert await store.resend_dead(db, "default", "a") == 0
    assert await _states(db) == [("acme", "evt-1", "dead", "HTTP 413")]


async def _publish_ordered(db: asyncpg.Connection, tenant: str, event_id: str, key: str) -> None:
    # Straight to the SQL function: the ordering key's own publish path.
    refused = await db.fetchval(
        "SELECT error_message FROM hooklane_try_publish_v3($1, 'order.paid', '{}'::jsonb, $2, NULL, NULL, $3)",
        tenant,
        event_id,
        key,
    )
    assert refused is None


async def test_a_tenant_change_lets_go_of_the_old_tenants_ordering_keys(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", tenant="acme")
    for n in range(3):
        await _publish_ordered(db, "acme", f"evt-{n}", "order-1")
    # The head died under hold: the key is held, its later two wait.
    await db.execute("UPDATE deliveries SET state = 'dead' WHERE ordering_seq = 1")
    await db.execute("UPDATE ordering_keys SET held_since = now(), skipped = 2")

    moved = await _move(db, "a", "http://127.0.0.1:1/a", "globex")
    assert (moved.previous_tenant, moved.discarded) == ("acme", 3)
    key = await db.fetchrow("SELECT last_seq, head_seq, held_since, skipped FROM ordering_keys")
    assert tuple(key) == (3, None, None, 0)

    # The new tenant's event of the same key is due at once, numbered on
    # after the old tenant's (whose discarded deliveries keep 1 to 3).
    await _publish_ordered(db, "globex", "evt-new", "order-1")
    new = await db.fetchrow(
        "SELECT ordering_seq, next_attempt_at <= now() AS due FROM deliveries WHERE event_id = 'evt-new'"
    )
    assert tuple(new) == (4, True)
    assert await db.fetchval("SELECT head_seq FROM ordering_keys") == 4
    # An update that keeps the tenant leaves the keys as they are.
    await db.execute("UPDATE ordering_keys SET skipped = 1")
    await _move(db, "a", "http://127.0.0.1:1/a", "globex")
    assert tuple(await db.fetchrow("SELECT head_seq, skipped FROM ordering_keys")) == (4, 1)
