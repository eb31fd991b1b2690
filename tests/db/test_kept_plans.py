"""The worker's SQL functions keep one plan per session (migration 0004),
made on the statistics of their first call. Those plans must stay lookups
per candidate and per result when the queue, or the deliveries in flight,
grow far past what the statistics said: here they are made on an analysed
database with a delivered history and an empty queue, then used on a
backlog of thousands and a thousand deliveries in flight."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import asyncpg

import hooklane
from hooklane import store
from hooklane.policies import CircuitPolicy
from hooklane.worker.ready import ReadyList
from testsupport.fixtures import add_endpoint

ALL = list(range(32))
WORKER = "test-worker"
HISTORY = 2_000
BACKLOG = 2_000
IN_FLIGHT = 1_000
# A lookup per candidate or per result reads a few rows; reading the backlog
# or the in-flight rows would read thousands.
FEW = 100

_SCAN = re.compile(r"Scan.* on deliveries .*actual rows=(\d+) loops=(\d+)")
_SESSION = [
    "auto_explain.log_min_duration = 0",
    "auto_explain.log_nested_statements = on",
    "auto_explain.log_analyze = on",
    "auto_explain.log_timing = off",
    "auto_explain.log_level = notice",
    "client_min_messages = notice",
]


async def _explained_worker_session(dsn: str) -> tuple[asyncpg.Connection, list[str]]:
    """A connection with the worker's session settings that collects the plan
    of every statement it runs, those inside functions included."""
    conn = await store.connect(dsn, server_settings=store.WORKER_SESSION)
    await conn.execute("LOAD 'auto_explain'")
    for setting in _SESSION:
        await conn.execute(f"SET {setting}")
    plans: list[str] = []
    conn.add_log_listener(lambda _conn, message: plans.append(message.message))
    return conn, plans


def _most_deliveries_read(plans: list[str]) -> int:
    """The most rows one scan of deliveries returned in all, over the plans."""
    counts = [int(m[1]) * int(m[2]) for plan in plans for m in _SCAN.finditer(plan)]
    assert counts, "no scan of deliveries in the plans: auto_explain's format has changed"
    return max(counts)


async def _publish(db: asyncpg.Connection, tenant: str, n: int) -> None:
    for _ in range(n):
        await hooklane.publish(db, tenant=tenant, type="t", data={})


async def test_kept_plans_stay_lookups_when_the_queue_grows_after_them(db, dsn):
    busy = await add_endpoint(db, "busy", "http://127.0.0.1:1/busy", tenant="busy", max_concurrency=4)
    await add_endpoint(db, "crowded", "http://127.0.0.1:1/crowded", tenant="crowded")
    await _publish(db, "busy", HISTORY)
    await db.execute("UPDATE deliveries SET state = 'delivered', attempts = 1, delivered_at = now()")
    await _publish(db, "busy", 1)
    await db.execute("VACUUM ANALYZE")
    partition = await db.fetchval("SELECT partition FROM endpoints WHERE id = $1", busy)
    worker, plans = await _explained_worker_session(dsn)
    ready = ReadyList()

    async def round_() -> list[asyncpg.Record]:
        candidates = ready.take(datetime.now(UTC), 100)
        reservation = await store.reserve(
            worker, ALL, [c.endpoint_id for c in candidates], [c.floor for c in candidates], 100, 10.0, WORKER
        )
        ready.settle(
            reservation.verdicts,
            [(r.id, r.endpoint_id) for r in reservation.deliveries],
            datetime.now(UTC),
        )
        return reservation.deliveries

    try:
        # The plans are made here, on a queue of one, read from its start.
        ready.wake(busy, partition, None, datetime.now(UTC))
        first = await round_()
        results = [store.Result.delivered(r.id, r.attempts, status=204) for r in first]
        await store.complete(worker, results, CircuitPolicy(), ALL)
        ready.recorded([r.id for r in first], [], datetime.now(UTC))
        await _publish(db, "busy", BACKLOG)
        # In flight elsewhere, as on a busy platform; not woken, so only
        # complete's plan could come near them.
        await _publish(db, "crowded", IN_FLIGHT)
        await db.execute(
            "UPDATE deliveries SET state = 'sending', attempts = 1,"
            " lease_expires_at = now() + interval '1 hour'"
            " FROM endpoints ep WHERE ep.id = deliveries.endpoint_id AND ep.tenant = 'crowded'"
        )
        # what the backlog's publishes notified
        due = await db.fetchval(
            "SELECT min(next_attempt_at) FROM deliveries WHERE endpoint_id = $1 AND state = 'pending'", busy
        )
        ready.wake(busy, partition, due, datetime.now(UTC))

        plans.clear()
        rows = await round_()
        assert [r.endpoint_id for r in rows] == [busy] * 4  # its limit
        assert _most_deliveries_read(plans) < FEW, "\n\n".join(plans)

        plans.clear()
        results = [store.Result.delivered(r.id, r.attempts, status=204) for r in rows]
        touched = await store.complete(worker, results, CircuitPolicy(), ALL)
        assert [t.id for t in touched] == [busy]
        assert _most_deliveries_read(plans) < FEW, "\n\n".join(plans)
        # its slots are free and its next delivery due
        assert ready.recorded([r.id for r in rows], [t.recorded() for t in touched], datetime.now(UTC))
    finally:
        await worker.close()
