"""The worker's statements on a fresh or fast-growing database (issue 37):
planned from the statistics of a nearly empty `deliveries` (none at all,
or autovacuum's first analysis of a few dozen rows) and, in the
reservation's functions, kept for the session, they must still read each
endpoint's rows by index once the table holds thousands. A new install's
first load scanned the whole table every round, for as long as those
statistics lasted."""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import TypeVar

import pytest

from hooklane import store
from hooklane.policies import CircuitPolicy
from hooklane.worker.ready import ReadyList
from testsupport.databases import nested_plans
from testsupport.fixtures import ALL_PARTITIONS as ALL
from testsupport.fixtures import SECRET, reserve_round

T = TypeVar("T")

ENDPOINTS = 500
# Per endpoint, once the table has grown: a delivered history, a queue,
# calls in flight and leases that ran out. A lookup reads an endpoint's
# rows of one state; a scan of deliveries_endpoint reads all of them.
HISTORY, QUEUED, IN_FLIGHT, EXPIRED = 20, 4, 2, 1
PER_ENDPOINT = HISTORY + QUEUED + IN_FLIGHT + EXPIRED
# What a lookup of one endpoint may read at most: its queue or its leases,
# and a few entries more.
FEW = QUEUED + IN_FLIGHT + EXPIRED + 4
CANDIDATES = 100

BULK_ENDPOINTS = """
INSERT INTO endpoints (namespace, name, tenant, url, secret, partition, max_concurrency, rate_per_second)
SELECT 'default', 'ep-' || i, 'acme', 'http://127.0.0.1:1/' || i, $2, i % 32, 16,
       CASE WHEN i % 2 = 0 THEN 50 END
FROM generate_series(1, $1) i
"""
# n deliveries of each endpoint from the id given on, each of an event of
# its own, in the state given (a lease ending in the seconds given).
BULK_DELIVERIES = """
WITH e AS (
    INSERT INTO events (id, tenant, type, data, fanout)
    SELECT $1 || '-' || ep.id || '-' || gen_random_uuid(), 'acme', 't', '{}', 1
    FROM endpoints ep, generate_series(1, $2) k
    WHERE ep.id >= $3
    RETURNING id, tenant, split_part(id, '-', 2)::bigint AS endpoint_id
)
INSERT INTO deliveries (endpoint_id, event_tenant, event_id, state, attempts, lease_expires_at, delivered_at)
SELECT e.endpoint_id, e.tenant, e.id, $1,
       CASE WHEN $1 = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN $1 = 'sending' THEN now() + $4::float8 * interval '1 second' END,
       CASE WHEN $1 = 'delivered' THEN now() END
FROM e
"""


def _deliveries_read(plan: dict, table: str = "deliveries") -> list[tuple[str, int]]:
    """Each scan of ``table`` in an EXPLAIN ANALYZE plan (sub-plans
    included): what it is, and the rows it read in all, those its filter
    removed included."""
    found = []
    if plan.get("Relation Name") == table and "Scan" in plan["Node Type"]:
        per_loop = plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)
        found.append((f"{plan['Node Type']} {plan.get('Index Name', '')}", per_loop * plan["Actual Loops"]))
    return found + [s for child in plan.get("Plans", []) for s in _deliveries_read(child, table)]


def _assert_lookups(plans: list[dict], endpoints: int) -> None:
    """No sequential scan of deliveries in ``plans``, and no more rows read by any
    lookup of it than ``endpoints`` endpoints' few each."""
    scans = [s for plan in plans for s in _deliveries_read(plan)]
    assert scans, "no scan of deliveries in the plans: auto_explain's format has changed"
    shown = "\n".join(f"{what}: {rows} rows" for what, rows in scans)
    assert not [what for what, _ in scans if what.startswith("Seq Scan")], shown
    assert max(rows for _, rows in scans) <= endpoints * FEW, shown


# With a tenant ceiling, the round also counts the tenant's live leases, up
# to the ceiling: here every endpoint's, one tenant's, and room for a round.
CEILING = ENDPOINTS * IN_FLIGHT + CANDIDATES


@pytest.mark.parametrize("ceiling", [None, CEILING], ids=["no ceiling", "a tenant ceiling"])
@pytest.mark.parametrize("statistics", ["none", "of a few dozen rows"])
async def test_the_workers_statements_read_by_index_whatever_the_statistics(db, dsn, statistics, ceiling):
    for table in ("endpoints", "events", "deliveries"):
        await db.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    await db.execute(BULK_ENDPOINTS, ENDPOINTS, SECRET)
    first = await db.fetchval("SELECT min(id) FROM endpoints")
    if statistics == "of a few dozen rows":
        # What autovacuum sees of a new install: its first fifty-odd
        # deliveries, of the first endpoints to get any.
        await db.execute(BULK_DELIVERIES, "delivered", 6, first + ENDPOINTS - 10, 0)
        await db.execute("ANALYZE deliveries")
    else:
        assert await db.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'deliveries'::regclass") < 0

    worker = await store.connect(dsn, server_settings=store.WORKER_SESSION)
    try:
        # The worker's first round, on a queue of one: the reservation's
        # and complete's functions make their plans here and keep them.
        await db.execute(BULK_DELIVERIES, "pending", 1, first + ENDPOINTS - 1, 0)
        (row,) = await reserve_round(worker, CANDIDATES, tenant_ceiling=ceiling)
        await store.complete(
            worker, [store.Result.delivered(row.id, row.attempts, status=204)], CircuitPolicy(), ALL
        )
        await store.rescue_expired(worker, ALL)

        # Then the load: thousands of deliveries, the statistics as they were.
        for state, n, lease in (
            ("delivered", HISTORY, 0),
            ("pending", QUEUED, 0),
            ("sending", IN_FLIGHT, 3600),
            ("sending", EXPIRED, -60),
        ):
            await db.execute(BULK_DELIVERIES, state, n, first, lease)
        assert await db.fetchval("SELECT count(*) >= $1 FROM deliveries", ENDPOINTS * PER_ENDPOINT)

        plans = await nested_plans(worker, lambda: store.rescue_expired(worker, ALL))
        _assert_lookups(plans, ENDPOINTS)
        rescued = await db.fetchval("SELECT count(*) FROM deliveries WHERE last_failure = 'lease_expired'")
        assert rescued == ENDPOINTS * EXPIRED

        listing: list[store.Listed] = []
        plans = await nested_plans(worker, lambda: _append(listing, store.pending_endpoints(worker, ALL)))
        _assert_lookups(plans, ENDPOINTS)
        ready, now = ReadyList(), datetime.now(UTC)
        for endpoint_id, partition, head in listing[0].endpoints:
            ready.listed(endpoint_id, partition, head, now)
        candidates = ready.take(now, CANDIDATES)
        reservations: list[store.Reservation] = []
        plans = await nested_plans(
            worker,
            lambda: _append(
                reservations,
                store.reserve(
                    worker,
                    ALL,
                    [c.endpoint_id for c in candidates],
                    [c.floor for c in candidates],
                    CANDIDATES,
                    10.0,
                    "w",
                    tenant_ceiling=ceiling,
                ),
            ),
        )
        _assert_lookups(plans, CANDIDATES)
        # the candidates' endpoints by key, not every active endpoint
        endpoints_read = [rows for plan in plans for _, rows in _deliveries_read(plan, "endpoints")]
        assert max(endpoints_read) <= CANDIDATES, endpoints_read
        counted = [rows for plan in plans for what, rows in _deliveries_read(plan) if "tenant_leased" in what]
        # with a ceiling, the tenant's live leases are read once by each of
        # the round's two statements (the verdicts' sees the round's too);
        # without, never
        assert counted == ([0, 0] if ceiling is None else [ENDPOINTS * IN_FLIGHT, CEILING])
        reserved = reservations[0].deliveries
        assert len(reserved) == CANDIDATES

        results = [store.Result.delivered(r.id, r.attempts, status=204) for r in reserved]
        plans = await nested_plans(worker, lambda: store.complete(worker, results, CircuitPolicy(), ALL))
        _assert_lookups(plans, len(results))
        delivered = await db.fetchval(
            "SELECT count(*) FROM deliveries WHERE id = ANY($1) AND state = 'delivered'",
            [r.id for r in reserved],
        )
        assert delivered == len(reserved)
    finally:
        await worker.close()


async def _append(found: list[T], answer: Awaitable[T]) -> None:
    found.append(await answer)
