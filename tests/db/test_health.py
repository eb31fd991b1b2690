"""One health record per endpoint (hooklane/health.py, store.endpoint_health):
its state decided once, at the database's clock, and the queue counted in
one statement."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import asyncpg

import hooklane
from hooklane import store
from hooklane.endpoint_state import EndpointState, Standing
from hooklane.store.endpoints import EndpointFilter
from hooklane.store.queries import QUERIES
from hooklane.worker.jobs import Gauges
from hooklane.worker.partitions import PartitionOwner
from hooklane.worker.ready import ReadyList
from testsupport.fixtures import add_endpoint


async def test_one_statement_counts_pending_in_flight_and_dead(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    await add_endpoint(db, "b", "http://127.0.0.1:9/b", tenant="globex")
    for i in range(5):
        await hooklane.publish(db, tenant="acme", type="order.paid", data={"i": i}, id=f"e{i}")
    ids = [r["id"] for r in await db.fetch("SELECT id FROM deliveries ORDER BY id")]
    await db.execute("UPDATE deliveries SET state = 'dead' WHERE id = ANY($1::bigint[])", ids[:2])
    await db.execute(
        "UPDATE deliveries SET state = 'sending', attempted_by = 'pod-1',"
        " lease_expires_at = now() + interval '1 minute' WHERE id = $1",
        ids[2],
    )
    await db.execute("UPDATE deliveries SET created_at = now() - interval '1 minute' WHERE id = $1", ids[3])

    by_name = {h.name: h for h in await store.endpoint_health(db)}
    assert list(by_name) == ["a", "b"]  # most delayed first
    h = by_name["a"]
    assert (h.id, h.pending, h.in_flight, h.dead, h.sending_on) == (a, 2, 1, 2, ("pod-1",))
    assert h.oldest_pending_age is not None and 59 < h.oldest_pending_age < 600
    assert h.standing == Standing(EndpointState.ACTIVE)
    now = await db.fetchval("SELECT now()")
    assert abs((now - h.observed_at).total_seconds()) < 60
    idle = by_name["b"]
    assert (idle.pending, idle.in_flight, idle.dead, idle.oldest_pending_age) == (0, 0, 0, None)

    (one,) = await store.endpoint_health(db, endpoint=("default", "b"))
    assert one.name == "b"
    assert await store.endpoint_health(db, endpoint=("default", "missing")) == []
    partition = await db.fetchval("SELECT partition FROM endpoints WHERE name = 'a'")
    assert {x.name for x in await store.endpoint_health(db, [partition])} >= {"a"}
    assert await store.endpoint_health(db, []) == []


async def test_in_flight_is_what_holds_a_live_lease_and_pending_counts_from_a_floor(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    for i in range(4):
        await hooklane.publish(db, tenant="acme", type="order.paid", data={"i": i}, id=f"e{i}")
    ids = [r["id"] for r in await db.fetch("SELECT id FROM deliveries ORDER BY id")]
    # a call its worker has given up on is not in flight, rescued or not
    await db.execute(
        "UPDATE deliveries SET state = 'sending', attempted_by = 'lost',"
        " lease_expires_at = now() - interval '1 second' WHERE id = $1",
        ids[0],
    )
    await db.execute(
        "UPDATE deliveries SET next_attempt_at = now() - interval '1 hour' WHERE id = $1", ids[1]
    )
    (h,) = await store.endpoint_health(db)
    assert (h.pending, h.in_flight, h.sending_on) == (3, 0, ())
    # from a worker's floor: what lies before it is not read (the ready
    # list's invariant says nothing pending is there)
    floor = await db.fetchval("SELECT now() - interval '1 minute'")
    (h,) = await store.endpoint_health(db, floors={a: floor})
    assert h.pending == 2


# While another session holds the xmin horizon, every queue entry and lease
# of a delivery sent stays in the indexes (issues 21 and 37).

CHURNED = 2000


async def _walked(db, statement: str, **params: Any) -> tuple[dict[str, int], int]:
    """The index entries of deliveries each index gave the statement (dead
    ones included: the scan returns them before the heap says so), and the
    shared buffers its plan touched."""
    sql, *args = QUERIES[statement](**params)
    indexes = ["deliveries_queue", "deliveries_leased", "deliveries_dead"]
    returned = "SELECT array_agg(pg_stat_get_xact_tuples_returned(i::regclass)) FROM unnest($1::text[]) i"
    # Counted within one transaction: the session's counts of earlier ones
    # may not have been reported yet.
    async with db.transaction():
        before = await db.fetchval(returned, indexes)
        (plan,) = json.loads(await db.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *args))
        after = await db.fetchval(returned, indexes)
    top = plan["Plan"]
    walked = {i: a - b for i, a, b in zip(indexes, after, before, strict=True)}
    return walked, top["Shared Hit Blocks"] + top["Shared Read Blocks"]


async def _churn(db, endpoint: int, count: int) -> None:
    """``count`` deliveries to ``endpoint`` sent as a worker sends them:
    pending, then in flight under a lease that has ended, then delivered."""
    first = await db.fetchval("SELECT count(*) FROM events")
    await db.execute(
        "INSERT INTO events (id, tenant, type, data, fanout)"
        " SELECT 'c' || i, 'acme', 't', '{}', 1 FROM generate_series($1::int, $2::int) i",
        first,
        first + count - 1,
    )
    await db.execute(
        "INSERT INTO deliveries (endpoint_id, event_tenant, event_id)"
        " SELECT $1, 'acme', 'c' || i FROM generate_series($2::int, $3::int) i",
        endpoint,
        first,
        first + count - 1,
    )
    await db.execute(
        "UPDATE deliveries SET state = 'sending', attempts = 1, lease_expires_at = now() - interval '1 s'"
        " WHERE endpoint_id = $1 AND state = 'pending' AND event_id LIKE 'c%'",
        endpoint,
    )
    await db.execute(
        "UPDATE deliveries SET state = 'delivered', lease_expires_at = NULL"
        " WHERE endpoint_id = $1 AND state = 'sending'",
        endpoint,
    )


async def test_the_gauges_read_no_dead_entry_nor_the_listing_an_ended_lease_under_a_held_horizon(dsn, db):
    busy = await add_endpoint(db, "busy", "http://127.0.0.1:9/a")
    idle = await add_endpoint(db, "idle", "http://127.0.0.1:9/b", tenant="idle")
    await add_endpoint(db, "paused", "http://127.0.0.1:9/c", tenant="paused", paused=True)
    report = await asyncpg.connect(dsn)
    try:
        await report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM events")
        for endpoint in (busy, idle):
            await _churn(db, endpoint, CHURNED)
        for n in range(3):
            await hooklane.publish(db, tenant="acme", type="order.paid", data={"n": n}, id=f"live-{n}")
        await hooklane.publish(db, tenant="paused", type="order.paid", data={}, id="live-paused")
        # The busy endpoint's head, as the ready list holds it; the idle one
        # is not in the list (nothing pending), the paused one never.
        head = await db.fetchval(
            "SELECT min(next_attempt_at) FROM deliveries WHERE endpoint_id = $1 AND state = 'pending'", busy
        )
        gauges = {"partitions": None, "namespace": None, "name": None, "floor_ids": [busy], "floors": [head]}
        walked, buffers = await _walked(db, "endpoint_health", **gauges, listed=True)
        healths = {
            h.name: h.pending for h in await store.endpoint_health(db, floors={busy: head}, listed=True)
        }
        # Read without the list, the idle endpoint's queue walks every dead
        # entry its deliveries left: what the gauges read before.
        unlisted, unlisted_buffers = await _walked(db, "endpoint_health", **gauges, listed=False)
        first_page = {"cursor_oldest_pending_at": None, "cursor_namespace": None, "cursor_name": None}
        listing, _ = await _walked(
            db, "endpoint_page", **EndpointFilter().parameters(), **first_page, limit=51
        )
    finally:
        await report.close()
    await db.execute("VACUUM deliveries")
    _, vacuumed = await _walked(db, "endpoint_health", **gauges, listed=True)
    assert healths == {"busy": 3, "idle": 0, "paused": 1}
    # The live entries (busy's from its head on, paused's from its start),
    # none of the 4,000 dead ones; in buffers, what the live rows cost once
    # the dead versions are vacuumed, and a couple a live row more (its
    # versions' pages), where the queue read from its start costs more.
    live_rows = 4 + 3
    assert walked == {"deliveries_queue": 4, "deliveries_leased": 0, "deliveries_dead": 0}
    assert buffers <= vacuumed + 2 * live_rows, (buffers, vacuumed)
    assert unlisted["deliveries_queue"] >= CHURNED and unlisted_buffers > vacuumed + 2 * live_rows
    # In flight on the listing's page, as in the gauges: a live lease, and
    # none of the 4,000 ended ones the horizon keeps.
    assert listing["deliveries_leased"] == 0


async def test_the_listings_show_a_gauge_pass_and_walk_no_queue_under_a_held_horizon(dsn, db, settings):
    busy = await add_endpoint(db, "busy", "http://127.0.0.1:9/a")
    await add_endpoint(db, "paused", "http://127.0.0.1:9/c", tenant="paused", paused=True)
    owner = PartitionOwner(dsn, await store.partition_count(db), lambda _p: None)
    await owner.connect()
    pool = await store.create_pool(dsn, min_size=0, max_size=2)
    report = await asyncpg.connect(dsn)
    try:
        await owner.rebalance()
        await report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM events")
        await _churn(db, busy, CHURNED)
        for n in range(3):
            await hooklane.publish(db, tenant="acme", type="order.paid", data={"n": n}, id=f"live-{n}")
        await hooklane.publish(db, tenant="paused", type="order.paid", data={}, id="live-paused")
        # The ready list a worker holds: the busy endpoint from its head.
        ready = ReadyList()
        for endpoint_id, partition, head in (
            await store.pending_endpoints(db, sorted(owner.owned))
        ).endpoints:
            ready.listed(endpoint_id, partition, head, datetime.now(UTC))
        await Gauges(settings, owner, pool, ready).run_once()
        page = {**EndpointFilter().parameters(), "cursor_oldest_pending_at": None}
        page |= {"cursor_namespace": None, "cursor_name": None, "limit": 51}
        listing, _ = await _walked(db, "endpoint_page", **page)
        totals, _ = await _walked(db, "endpoint_totals", **EndpointFilter().parameters())
        shown = {
            h.name: (h.pending, h.counted_at)
            for h in (await store.endpoint_page(db, EndpointFilter(), limit=50)).endpoints
        }
        summed = await store.endpoint_totals(db, EndpointFilter())
        # The worker gone: its counts are stale, and the listing counts the
        # queues again, past every dead entry the horizon keeps.
        await db.execute("UPDATE queue_summaries SET fresh_until = now()")
        counted, _ = await _walked(db, "endpoint_page", **page)
        recounted = {
            h.name: h.pending for h in (await store.endpoint_page(db, EndpointFilter(), limit=50)).endpoints
        }
    finally:
        await report.close()
        await pool.close()
        await owner.close()
    # Counted by the pass, each partition's slice when its statement ran.
    assert {name: pending for name, (pending, _) in shown.items()} == {"busy": 3, "paused": 1}
    assert all(counted_at is not None for _, counted_at in shown.values())
    assert (summed.pending, summed.in_flight) == (4, 0)
    # Neither read a queue, nor an ended lease the horizon keeps.
    assert listing == {"deliveries_queue": 0, "deliveries_leased": 0, "deliveries_dead": 0}
    assert totals == {"deliveries_queue": 0, "deliveries_leased": 0, "deliveries_dead": 0}
    assert recounted == {"busy": 3, "paused": 1}
    assert counted["deliveries_queue"] >= CHURNED
