"""Publishing: the transactional outbox, routing, idempotence, coalescing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

import hooklane
from hooklane import store
from hooklane.errors import EventConflict, InvalidInput
from hooklane.publish import MAX_DATA_BYTES
from testsupport.databases import nested_plans
from testsupport.fixtures import SECRET, add_endpoint, wait_for
from testsupport.publish import (
    FITS,
    HUGE,
    READING,
    TINY,
    compact,
    delivered_as_checked,
    ordered_deliveries,
    queued_in_order,
)


async def _deliveries(db) -> list[tuple[str, str, str]]:
    rows = await db.fetch(
        """SELECT ep.name, d.event_id, d.state FROM deliveries d
           JOIN endpoints ep ON ep.id = d.endpoint_id ORDER BY d.id"""
    )
    return [tuple(r) for r in rows]


async def test_event_and_deliveries_commit_with_the_callers_transaction(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await db.execute("CREATE TABLE orders (id int)")
    async with db.transaction():
        await db.execute("INSERT INTO orders VALUES (1)")
        event_id = await hooklane.publish(db, tenant="acme", type="order.created", data={"id": 1})
    assert await _deliveries(db) == [("a", event_id, "pending")]


async def test_rollback_stores_nothing(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await db.execute("CREATE TABLE orders (id int)")

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with db.transaction():
            await db.execute("INSERT INTO orders VALUES (1)")
            await hooklane.publish(db, tenant="acme", type="order.created", data={"id": 1})
            raise Boom
    assert await db.fetchval("SELECT count(*) FROM events") == 0
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 0
    assert await db.fetchval("SELECT count(*) FROM orders") == 0


async def test_routing_by_tenant_event_type_and_state(db):
    await add_endpoint(db, "all", "http://127.0.0.1:1/all")
    await add_endpoint(db, "orders", "http://127.0.0.1:1/o", event_types=("order.*",))
    await add_endpoint(db, "exact", "http://127.0.0.1:1/e", event_types=("order.created",))
    await add_endpoint(db, "star", "http://127.0.0.1:1/s", event_types=("*",))
    await add_endpoint(db, "invoices", "http://127.0.0.1:1/i", event_types=("invoice.*",))
    await add_endpoint(db, "other-tenant", "http://127.0.0.1:1/x", tenant="globex")
    gone = await add_endpoint(db, "deactivated", "http://127.0.0.1:1/d")
    await db.execute("UPDATE endpoints SET state = 'deactivated' WHERE id = $1", gone)

    await hooklane.publish(db, tenant="acme", type="order.created", data={})
    await hooklane.publish(db, tenant="acme", type="order.item.added", data={})
    await hooklane.publish(db, tenant="acme", type="orders.created", data={})

    routed = {}
    for name, event_id, _ in await _deliveries(db):
        etype = await db.fetchval("SELECT type FROM events WHERE id = $1", event_id)
        routed.setdefault(etype, set()).add(name)
    assert routed == {
        "order.created": {"all", "orders", "exact", "star"},
        "order.item.added": {"all", "orders", "star"},
        "orders.created": {"all", "star"},
    }


async def test_unmatched_event_is_kept_and_counted(db):
    event_id = await hooklane.publish(db, tenant="nobody", type="order.created", data={"x": 1})
    row = await db.fetchrow("SELECT tenant, fanout, data FROM events WHERE id = $1", event_id)
    assert (row["tenant"], row["fanout"]) == ("nobody", 0)
    assert await store.unrouted_events(db) == 1


async def test_same_id_twice_is_stored_once(db):
    # With other content it is refused: tests/db/test_tenancy.py.
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    first = await hooklane.publish(db, tenant="acme", type="order.created", data={"v": 1}, id="evt-42")
    again = await hooklane.publish(db, tenant="acme", type="order.created", data={"v": 1}, id="evt-42")
    assert first == again == "evt-42"
    assert await db.fetchval("SELECT count(*) FROM events") == 1
    assert await db.fetchval("SELECT data->>'v' FROM events") == "1"
    assert len(await _deliveries(db)) == 1


async def test_generated_ids_are_unique(db):
    ids = {await hooklane.publish(db, tenant="acme", type="t", data={}) for _ in range(20)}
    assert len(ids) == 20 and all(i.startswith("msg_") for i in ids)


async def test_coalesce_key_replaces_the_pending_delivery(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await add_endpoint(db, "b", "http://127.0.0.1:1/b")
    for version in range(50):
        last = await hooklane.publish(
            db, tenant="acme", type="order.updated", data={"v": version}, coalesce_key="order-7"
        )
    other = await hooklane.publish(db, tenant="acme", type="order.updated", data={}, coalesce_key="order-8")
    rows = await _deliveries(db)
    assert sorted(rows) == sorted(
        [("a", last, "pending"), ("b", last, "pending"), ("a", other, "pending"), ("b", other, "pending")]
    )
    # every change is still an event, listable for reconciliation
    assert await db.fetchval("SELECT count(*) FROM events") == 51


async def test_coalescing_never_touches_a_delivery_in_flight(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    first = await hooklane.publish(db, tenant="acme", type="order.updated", data={}, coalesce_key="k")
    await db.execute("UPDATE deliveries SET state = 'sending'")
    second = await hooklane.publish(db, tenant="acme", type="order.updated", data={}, coalesce_key="k")
    assert sorted(await _deliveries(db)) == sorted([("a", first, "sending"), ("a", second, "pending")])


async def test_facts_without_a_key_are_never_coalesced(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    for _ in range(3):
        await hooklane.publish(db, tenant="acme", type="payment.approved", data={})
    assert len(await _deliveries(db)) == 3


async def test_an_ordering_key_numbers_each_endpoints_deliveries_in_commit_order(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await add_endpoint(db, "b", "http://127.0.0.1:1/b")
    ids = [
        await hooklane.publish(db, tenant="acme", type="order.updated", data={"v": v}, ordering_key="order-7")
        for v in range(3)
    ]
    other = await hooklane.publish(db, tenant="acme", type="order.updated", data={}, ordering_key="order-8")
    unordered = await hooklane.publish(db, tenant="acme", type="order.updated", data={})
    keys = await db.fetch("SELECT id, ordering_key FROM events")
    assert {r["id"]: r["ordering_key"] for r in keys} == {
        **dict.fromkeys(ids, "order-7"),
        other: "order-8",
        unordered: None,
    }
    # Only each key's head is due; another key's head is due beside it.
    assert await ordered_deliveries(db, "order-7") == dict.fromkeys("ab", queued_in_order(ids))
    assert await ordered_deliveries(db, "order-8") == dict.fromkeys("ab", queued_in_order([other]))
    rows = await db.fetch(
        "SELECT ordering_seq, next_attempt_at < 'infinity' AS due FROM deliveries WHERE event_id = $1",
        unordered,
    )
    assert [tuple(r) for r in rows] == [(None, True)] * 2


async def test_a_second_transaction_publishing_the_key_waits_for_the_first(db, dsn):
    """The key's row is locked until the first publisher ends: the second
    waits, and takes its number after it. A rolled-back publish takes none;
    a publisher of another key never waits."""
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    first, second = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        holding = first.transaction()
        await holding.start()
        await hooklane.publish(first, tenant="acme", type="order.updated", data={}, id="e1", ordering_key="k")
        waiting = asyncio.create_task(
            hooklane.publish(second, tenant="acme", type="order.updated", data={}, id="e2", ordering_key="k")
        )
        pid = second.get_server_pid()
        await wait_for(
            lambda: db.fetchval("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid)
        )
        # Another key goes through while "k" is held.
        await hooklane.publish(
            db, tenant="acme", type="order.updated", data={}, id="e3", ordering_key="other"
        )
        assert not waiting.done()
        await holding.rollback()
        assert await waiting == "e2"
        await hooklane.publish(first, tenant="acme", type="order.updated", data={}, id="e4", ordering_key="k")
    finally:
        await first.close()
        await second.close()
    assert await ordered_deliveries(db, "k") == {"a": queued_in_order(["e2", "e4"])}
    assert await ordered_deliveries(db, "other") == {"a": queued_in_order(["e3"])}


async def test_an_id_published_again_under_another_ordering_key_is_a_conflict(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    event = {"tenant": "acme", "type": "order.updated", "data": {}}
    assert await hooklane.publish(db, **event, id="e1", ordering_key="k") == "e1"
    # The same event again: stored once, its delivery numbered once.
    assert await hooklane.publish(db, **event, id="e1", ordering_key="k") == "e1"
    for other in ("k2", None):
        with pytest.raises(EventConflict) as info:
            await hooklane.publish(db, **event, id="e1", ordering_key=other)
        assert info.value.field == "id"
    await hooklane.publish(db, **event, id="e2")
    with pytest.raises(EventConflict):
        await hooklane.publish(db, **event, id="e2", ordering_key="k")
    assert await ordered_deliveries(db, "k") == {"a": queued_in_order(["e1"])}
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 2


async def test_a_coalesce_key_replaces_only_the_last_delivery_of_its_ordering_key(db):
    """As migration 0026 says: the later state replaces the pending one only
    when nothing of the key is queued behind it, and takes the next number
    (a gap the receiver sees); otherwise it queues behind."""
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    event = {"tenant": "acme", "type": "order.updated", "data": {}, "ordering_key": "k"}
    await hooklane.publish(db, **event, id="s1", coalesce_key="state")
    await hooklane.publish(db, **event, id="s2", coalesce_key="state")
    assert await ordered_deliveries(db, "k") == {"a": [("s2", 2, True)]}
    await hooklane.publish(db, **event, id="fact")
    await hooklane.publish(db, **event, id="s3", coalesce_key="state")
    assert await ordered_deliveries(db, "k") == {"a": [("s2", 2, True), ("fact", 3, False), ("s3", 4, False)]}
    await hooklane.publish(db, **event, id="s4", coalesce_key="state")
    assert await ordered_deliveries(db, "k") == {"a": [("s2", 2, True), ("fact", 3, False), ("s4", 5, False)]}


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"tenant": ""}, "tenant"),
        ({"tenant": 7}, "tenant"),
        ({"type": "order created"}, "type"),
        ({"type": ""}, "type"),
        ({"data": [1, 2]}, "data"),
        ({"data": {"x": float("nan")}}, "data"),
        ({"data": {"x": object()}}, "data"),
        ({"data": {"x": "y" * 300_000}}, "data"),
        ({"id": "has space"}, "id"),
        ({"id": ""}, "id"),
        ({"coalesce_key": ""}, "coalesce_key"),
        ({"ordering_key": ""}, "ordering_key"),
        ({"ordering_key": "k" * 256}, "ordering_key"),
    ],
)
async def test_bad_arguments_store_nothing(db, kwargs, field):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    args = {"tenant": "acme", "type": "order.created", "data": {}, **kwargs}
    with pytest.raises(InvalidInput) as info:
        await hooklane.publish(db, **args)
    assert info.value.field == field
    assert await db.fetchval("SELECT count(*) FROM events") == 0
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 0


async def test_a_bad_publish_keeps_what_was_already_accepted(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    kept = await hooklane.publish(db, tenant="acme", type="order.created", data={})
    with pytest.raises(InvalidInput):
        await hooklane.publish(db, tenant="acme", type="bad type", data={})
    assert await db.fetchval("SELECT array_agg(id) FROM events") == [kept]


def _deep(levels: int) -> dict:
    data: dict | str = "leaf"
    for _ in range(levels):
        data = {"a": data}
    return data


def _shared(levels: int) -> dict:
    # 2**levels paths through a handful of objects.
    data: dict = {}
    for _ in range(levels):
        data = {"a": data, "b": data}
    return data


def _cycle() -> dict:
    data: dict = {}
    data["self"] = data
    return data


REFUSED = [
    ({"data": {"note": "a\x00b"}}, "data"),
    ({"data": {"no\x00te": 1}}, "data"),
    ({"data": {"a": [{"b": ["\x00"]}]}}, "data"),
    ({"data": {"a": "\ud800"}}, "data"),
    ({"data": {"\udfff": 1}}, "data"),
    ({"data": _deep(100_000)}, "data"),
    ({"data": _deep(65)}, "data"),
    ({"data": _shared(60)}, "data"),
    ({"data": _cycle()}, "data"),
    ({"data": {"n": 2**64}}, "data"),
    ({"data": {"n": -(2**63) - 1}}, "data"),
    ({"data": {"n": 10**5000}}, "data"),
    ({"data": {"x": float("inf")}}, "data"),
    ({"data": {"x": [float("-inf")]}}, "data"),
    ({"data": {1: "one"}}, "data"),
    ({"data": {None: "none"}}, "data"),
    ({"data": {"s": {1, 2}}}, "data"),
    ({"data": {"b": b"bytes"}}, "data"),
    ({"tenant": "ac\x00me"}, "tenant"),
    ({"tenant": "acme\n"}, "tenant"),
    ({"tenant": "ac\x1b[31mme"}, "tenant"),
    ({"tenant": "ac\x7fme"}, "tenant"),
    ({"tenant": "ac\x9bme"}, "tenant"),
    ({"tenant": "\ud800"}, "tenant"),
    ({"type": "order.created\x00"}, "type"),
    ({"type": "order.created\n"}, "type"),
    ({"type": "x" * 256}, "type"),
    ({"id": "evt-1\x00"}, "id"),
    ({"id": "evt-1\n"}, "id"),
    ({"coalesce_key": "k\x00"}, "coalesce_key"),
    ({"coalesce_key": "k\n"}, "coalesce_key"),
    ({"coalesce_key": "k\t1"}, "coalesce_key"),
    ({"coalesce_key": "\udc80"}, "coalesce_key"),
    ({"coalesce_key": 7}, "coalesce_key"),
    ({"ordering_key": "k\x00"}, "ordering_key"),
    ({"ordering_key": "k\n"}, "ordering_key"),
    ({"ordering_key": "k\x9b"}, "ordering_key"),
    ({"ordering_key": "\udc80"}, "ordering_key"),
    ({"ordering_key": 7}, "ordering_key"),
]


@pytest.mark.parametrize("kwargs, field", REFUSED, ids=[f"{f}-{i}" for i, (_, f) in enumerate(REFUSED)])
async def test_a_refused_publish_leaves_the_callers_transaction_usable(db, kwargs, field):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await db.execute("CREATE TABLE orders (id int)")
    async with db.transaction():
        await db.execute("INSERT INTO orders VALUES (1)")
        with pytest.raises(InvalidInput) as info:
            await hooklane.publish(db, **{"tenant": "acme", "type": "order.created", "data": {}, **kwargs})
        await db.execute("INSERT INTO orders VALUES (2)")
    assert info.value.field == field
    assert len(str(info.value)) < 1000
    assert await db.fetchval("SELECT count(*) FROM orders") == 2
    assert await db.fetchval("SELECT count(*) FROM events") == 0


async def test_the_limits_themselves_are_accepted(db):
    data = {
        "deep": _deep(63),
        "max": 2**64 - 1,
        "min": -(2**63),
        "text": "tab\tnew\nline\x1b ok",
        "t": (1, 2),
    }
    event_id = await hooklane.publish(
        db, tenant="a" * 253, type="order.created", data=data, id="i" * 255, coalesce_key="k" * 255
    )
    stored = await db.fetchval("SELECT data FROM events WHERE id = $1", event_id)
    assert '"max": 18446744073709551615' in stored and "\\u001b" in stored


# A tenant with this many endpoints made every publish of it take 28 s while
# the planner's statistics of `endpoints` were a fresh table's (issue 18).
FANOUT = 10_000

BULK_ENDPOINTS = """
INSERT INTO endpoints (namespace, name, tenant, url, secret, partition)
SELECT 'default', 'ep-' || i, $2, 'http://127.0.0.1:1/' || i, $3, i % 32
FROM generate_series(1, $1) i
"""


def _nodes(plan: dict, depth: int = 0) -> list[tuple[int, str, int]]:
    """Each node of an EXPLAIN ANALYZE plan (init plans and sub-plans
    included): its depth, what it is, and the rows it handled in all (rows
    x loops)."""
    what = " ".join(filter(None, [plan["Node Type"], plan.get("CTE Name"), plan.get("Relation Name")]))
    own = (depth, what, plan["Actual Rows"] * plan["Actual Loops"])
    return [own, *(n for child in plan.get("Plans", []) for n in _nodes(child, depth + 1))]


async def test_a_fanout_to_ten_thousand_endpoints_never_depends_on_their_statistics(db, dsn):
    await db.execute("ALTER TABLE endpoints SET (autovacuum_enabled = off)")
    await db.execute(BULK_ENDPOINTS, FANOUT, "big", SECRET)
    # what the planner knows of the table: nothing yet (never analysed)
    assert await db.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'endpoints'::regclass") < 0

    # The statement is the publish function's: auto_explain has the plans
    # of the statements inside it.
    conn = await asyncpg.connect(dsn)
    plans: list[dict] = []

    async def publish() -> None:
        plans.extend(
            await nested_plans(
                conn, lambda: hooklane.publish(conn, tenant="big", type="order.created", data={}, id="evt-1")
            )
        )

    before = await store.published_since(db, None)
    try:
        await publish()
    finally:
        await conn.close()
    nodes = [n for plan in plans for n in _nodes(plan)]
    # Each endpoint is read a bounded number of times; a nested loop over
    # two CTE scans handles FANOUT x FANOUT rows in one node.
    assert max(rows for _, _, rows in nodes) == FANOUT, "\n".join(
        f"{'  ' * depth}{what}: {rows} rows" for depth, what, rows in nodes
    )
    assert await db.fetchval("SELECT fanout FROM events WHERE id = 'evt-1'") == FANOUT
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE event_id = 'evt-1'") == FANOUT
    # every endpoint's owner finds it by its probe
    found = await store.published_since(db, before.snapshot)
    assert sorted(e for e, _, _ in found.endpoints) == sorted(
        await db.fetchval("SELECT array_agg(id) FROM endpoints")
    )


async def _woken(db: asyncpg.Connection, run: Callable[[], Awaitable[object]]) -> list[int]:
    """The endpoints a worker's probe finds given work by ``run``."""
    before = await store.published_since(db, None)
    await run()
    return sorted(e for e, _, _ in (await store.published_since(db, before.snapshot)).endpoints)


async def test_a_coalesced_publish_wakes_every_endpoint_it_replaced_a_delivery_of(db):
    # the delivery a coalesce key replaces now names the new event, which
    # is how the probe finds it
    ids = [await add_endpoint(db, name, f"http://127.0.0.1:1/{name}") for name in ("a", "b")]
    await hooklane.publish(db, tenant="acme", type="order.updated", data={"v": 1}, coalesce_key="k")
    woken = await _woken(
        db, lambda: hooklane.publish(db, tenant="acme", type="order.updated", data={"v": 2}, coalesce_key="k")
    )
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 2
    assert woken == sorted(ids)

    # the same id twice stores it once
    async def twice() -> None:
        for _ in range(2):
            await hooklane.publish(db, tenant="acme", type="order.updated", data={"v": 2}, id="once")

    assert await _woken(db, twice) == sorted(ids)


async def test_the_worker_analyses_endpoints_after_a_bulk_change(db, start_worker):
    await db.execute("ALTER TABLE endpoints SET (autovacuum_enabled = off)")
    start_worker()
    await db.execute(BULK_ENDPOINTS, FANOUT, "big", SECRET)
    # autovacuum is off for the table: only the worker can have analysed it
    await wait_for(
        lambda: db.fetchval("SELECT reltuples = $1 FROM pg_class WHERE oid = 'endpoints'::regclass", FANOUT),
        timeout=30,
    )
    assert (
        await db.fetchval("SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'endpoints'")
        < 50
    )


# --------------------------------------------------------------------------
# The size limit holds for what is sent (issue 18, item 1): through the
# library, the API and the CLI, to a real receiver through a real worker.


async def test_the_library_refuses_data_that_would_be_sent_larger_than_the_limit(db, receiver, start_worker):
    await add_endpoint(db, "a", receiver.url("/hook"))
    assert len(compact(TINY)) < MAX_DATA_BYTES
    for data in (TINY, HUGE):
        with pytest.raises(InvalidInput) as info:
            await hooklane.publish(db, **READING, data=data)
        assert info.value.field == "data" and len(str(info.value)) < 300
    assert await db.fetchval("SELECT count(*) FROM events") == 0
    await hooklane.publish(db, **READING, data=FITS)
    await delivered_as_checked(receiver, start_worker, FITS)
