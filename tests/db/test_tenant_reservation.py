"""The reservation's caps, its order (tenant, then endpoint) and the tenant
ceiling (hooklane_reserve_v7, migration 0020), on a real Postgres: the
ceiling across workers of different partitions reserving at once."""

from __future__ import annotations

import asyncio
from collections import Counter

import asyncpg
import pytest

import hooklane
from hooklane import store
from hooklane.policies import CircuitPolicy
from testsupport.fixtures import ALL_PARTITIONS as ALL
from testsupport.fixtures import add_endpoint, wait_for


async def _publish(db: asyncpg.Connection, n: int, tenant: str) -> None:
    for _ in range(n):
        await hooklane.publish(db, tenant=tenant, type="t", data={})


async def _round(
    conn: asyncpg.Connection,
    candidates: list[int],
    limit: int = 100,
    *,
    partitions: list[int] = ALL,
    caps: list[int | None] | None = None,
    apart: list[bool] | None = None,
    tenant_ceiling: int | None = None,
) -> store.Reservation:
    return await store.reserve(
        conn,
        partitions,
        candidates,
        [None] * len(candidates),
        limit,
        10.0,
        "w",
        caps=caps,
        apart=apart,
        tenant_ceiling=tenant_ceiling,
    )


async def _in_flight(db: asyncpg.Connection, tenant: str) -> int:
    return await db.fetchval(
        "SELECT count(*) FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id"
        " WHERE ep.tenant = $1 AND d.state = 'sending' AND d.lease_expires_at > now()",
        tenant,
    )


async def _endpoints(db: asyncpg.Connection, tenant: str, n: int, **spec: object) -> list[int]:
    return [
        await add_endpoint(db, f"{tenant}-{i}", f"http://127.0.0.1:1/{tenant}/{i}", tenant=tenant, **spec)
        for i in range(n)
    ]


async def test_a_capped_candidate_gets_at_most_its_cap_and_the_limit_counts_those_not_apart(db):
    slow = await add_endpoint(db, "slow", "http://127.0.0.1:1/slow", tenant="slow", max_concurrency=10)
    narrow = await add_endpoint(db, "narrow", "http://127.0.0.1:1/narrow", tenant="narrow", max_concurrency=2)
    quick = await _endpoints(db, "quick", 3, max_concurrency=10)
    for tenant in ("slow", "narrow", "quick"):
        await _publish(db, 10, tenant)
    # slow and narrow apart: slow, a cap of 3 of its 10 free slots; narrow,
    # its 2 free slots are fewer than its cap; the quick ones share the
    # limit of 4 between them, the first two capped at 1
    round_ = await _round(
        db,
        [slow, narrow, *quick],
        limit=4,
        caps=[3, 5, 1, 1, None],
        apart=[True, True, False, False, False],
    )
    got = Counter(r.endpoint_id for r in round_.deliveries)
    assert (got[slow], got[narrow]) == (3, 2)
    assert [got[q] for q in quick] == [1, 1, 2]
    # capped but none apart: the same limit holds for all
    round_ = await _round(db, [slow, narrow, *quick], limit=4, caps=[3, 5, 1, 1, None])
    assert len(round_.deliveries) == 4


async def test_a_tenants_rows_apart_take_nothing_of_its_place_among_the_others(db):
    b1, b2 = await _endpoints(db, "b", 2)
    a1, a2 = await _endpoints(db, "a", 2)
    await _publish(db, 2, "b")  # b's rows first: on a tie, they go first
    await _publish(db, 2, "a")
    # a1 is apart (its tenant's slow calls): a2 is still a's first row
    # counted in the limit, level with b's first
    round_ = await _round(
        db, [b1, b2, a1, a2], limit=2, caps=[None, None, 2, None], apart=[False, False, True, False]
    )
    got = Counter(r.endpoint_id for r in round_.deliveries)
    assert (got[a1], got[a2], got[b1] + got[b2]) == (2, 1, 1)


async def test_when_the_limit_binds_tenants_come_first_then_their_endpoints(db):
    crowd = await _endpoints(db, "crowd", 200)
    await _publish(db, 1, "crowd")
    singles = []
    for i in range(5):
        singles += await _endpoints(db, f"single{i}", 1)
        await _publish(db, 2, f"single{i}")
    # 205 endpoints due, 200 of them one tenant's: by endpoint, the crowd
    # would get 195 of 200 rows; by tenant, each single's first two come
    # before the crowd's third
    rows = (await _round(db, crowd + singles, limit=12)).deliveries
    tenants = Counter(r.tenant for r in rows)
    assert tenants == {"crowd": 2, **{f"single{i}": 2 for i in range(5)}}
    # within a tenant, its endpoints interleave as before: two endpoints' firsts
    assert len({r.endpoint_id for r in rows if r.tenant == "crowd"}) == 2


async def test_the_ceiling_holds_a_tenants_calls_in_flight_over_all_its_endpoints(db):
    big = await _endpoints(db, "big", 20, max_concurrency=4)
    other = await add_endpoint(db, "other", "http://127.0.0.1:1/other", tenant="other", max_concurrency=4)
    await _publish(db, 4, "big")
    await _publish(db, 4, "other")
    # one call of big's in flight from an earlier round: the first to end
    (early,) = (await _round(db, big[:1], caps=[1], apart=[True], tenant_ceiling=6)).deliveries
    round_ = await _round(db, [*big, other], tenant_ceiling=6)
    assert Counter(r.tenant for r in round_.deliveries) == {"big": 5, "other": 4}
    assert len({r.endpoint_id for r in round_.deliveries if r.tenant == "big"}) == 5
    # every one of big's endpoints is held, those that got a call and those
    # that did not, until the first of its tenant's leases ends
    verdicts = {v.endpoint_id: v for v in round_.verdicts}
    first_lease = await db.fetchval("SELECT lease_expires_at FROM deliveries WHERE id = $1", early.id)
    for endpoint in big:
        verdict = verdicts[endpoint]
        assert (verdict.at_limit, verdict.leases_end, verdict.held_by) == (True, first_lease, "big")
        assert verdict.head is not None
    assert verdicts[other].held_by is None  # its tenant is under the ceiling
    assert await _in_flight(db, "big") == 6
    assert (await _round(db, big, tenant_ceiling=6)).deliveries == []

    # a result frees one of the tenant's six
    (done,) = await db.fetch(
        "SELECT id, attempts FROM deliveries WHERE event_tenant = 'big' AND state = 'sending' LIMIT 1"
    )
    result = store.Result.delivered(done["id"], done["attempts"], status=204)
    await store.complete(db, [result], CircuitPolicy(), ALL)
    assert len((await _round(db, big, tenant_ceiling=6)).deliveries) == 1
    # without a ceiling, each endpoint has only its own limit: all the rest
    # goes (four each, less the six in flight and the one delivered)
    assert len((await _round(db, big)).deliveries) == 20 * 4 - 6 - 1


async def test_an_endpoint_at_its_own_limit_says_when_its_own_first_lease_ends(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=2)
    b = await add_endpoint(db, "b", "http://127.0.0.1:1/b", max_concurrency=1)
    await _publish(db, 3, "acme")
    assert len((await _round(db, [b], tenant_ceiling=3)).deliveries) == 1
    round_ = await _round(db, [a], tenant_ceiling=3)
    assert len(round_.deliveries) == 2
    # both its own slots and its tenant's three are held: its own first
    # lease, not b's earlier one, frees it
    (verdict,) = round_.verdicts
    own_first = await db.fetchval(
        "SELECT min(lease_expires_at) FROM deliveries WHERE endpoint_id = $1 AND state = 'sending'", a
    )
    assert (verdict.at_limit, verdict.leases_end) == (True, own_first)
    tenants_first = await db.fetchval("SELECT min(lease_expires_at) FROM deliveries WHERE state = 'sending'")
    assert tenants_first < own_first


async def _in_partitions(
    db: asyncpg.Connection, tenant: str, n: int
) -> tuple[list[int], list[int], int, int]:
    """n endpoints of the tenant, and two of their partitions with endpoints
    in each: the ones of the first and of the second."""
    endpoints = await _endpoints(db, tenant, n, max_concurrency=8)
    rows = await db.fetch(
        "SELECT id, partition FROM endpoints WHERE id = ANY($1) ORDER BY partition", endpoints
    )
    first, second = rows[0]["partition"], rows[-1]["partition"]
    assert first != second
    return (
        [r["id"] for r in rows if r["partition"] == first],
        [r["id"] for r in rows if r["partition"] == second],
        first,
        second,
    )


async def test_a_round_waits_for_another_workers_round_of_the_same_tenant(db, dsn):
    mine, theirs, p_mine, p_theirs = await _in_partitions(db, "acme", 16)
    await _publish(db, 4, "acme")
    first = await store.connect(dsn, server_settings=store.WORKER_SESSION)
    second = await store.connect(dsn, server_settings=store.WORKER_SESSION)
    try:
        # the first worker's round, not yet committed: it holds acme's lock
        async with first.transaction():
            held = await _round(first, mine, partitions=[p_mine], tenant_ceiling=5)
            granted = len(held.deliveries)
            assert 0 < granted <= 5
            pid = second.get_server_pid()
            waiting = asyncio.create_task(_round(second, theirs, partitions=[p_theirs], tenant_ceiling=5))
            await wait_for(
                lambda: db.fetchval(
                    "SELECT wait_event = 'advisory' FROM pg_stat_activity WHERE pid = $1", pid
                )
            )
            assert not waiting.done()
        # committed: the second sees the first's leases and takes the rest
        got = await waiting
        assert len(got.deliveries) == 5 - granted
        assert await _in_flight(db, "acme") == 5
    finally:
        await first.close()
        await second.close()


async def test_the_ceiling_is_never_exceeded_by_workers_reserving_at_once(db, dsn):
    mine, theirs, p_mine, p_theirs = await _in_partitions(db, "acme", 16)
    # enough that both partitions' endpoints have some pending to the end
    await _publish(db, 20, "acme")
    workers = [await store.connect(dsn, server_settings=store.WORKER_SESSION) for _ in range(2)]
    ceiling = 7
    try:
        for _ in range(15):
            await asyncio.gather(
                _round(workers[0], mine, partitions=[p_mine], tenant_ceiling=ceiling),
                _round(workers[1], theirs, partitions=[p_theirs], tenant_ceiling=ceiling),
            )
            assert await _in_flight(db, "acme") == ceiling
            # two of the calls end, the others stay in flight
            done = await db.fetch(
                "SELECT id, attempts FROM deliveries WHERE state = 'sending' ORDER BY random() LIMIT 2"
            )
            results = [store.Result.delivered(r["id"], r["attempts"], status=204) for r in done]
            await store.complete(db, results, CircuitPolicy(), ALL)
        assert await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'delivered'") == 30
    finally:
        for worker in workers:
            await worker.close()


async def test_without_a_ceiling_a_round_takes_no_tenant_lock(db):
    endpoints = await _endpoints(db, "acme", 3, max_concurrency=4)
    await _publish(db, 4, "acme")
    async with db.transaction():
        round_ = await _round(db, endpoints)
        locks = await db.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
    assert (len(round_.deliveries), locks) == (12, 0)
    assert all(v.at_limit for v in round_.verdicts)  # each at its own limit


async def test_hostile_arguments_are_refused_before_any_sql(db):
    with pytest.raises(ValueError, match="2 caps for 1 candidates"):
        await _round(db, [1], caps=[1, 2])
    with pytest.raises(ValueError, match="2 apart for 1 candidates"):
        await _round(db, [1], apart=[True, False])
    with pytest.raises(ValueError, match="at least 1, not 0"):
        await _round(db, [1], tenant_ceiling=0)
