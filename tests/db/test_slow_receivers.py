"""Many receivers slow at once (issue 39): a worker's quick slots stay for
the endpoints that answer, and the slow ones share the long budget
(hooklane/worker/slots.py). Real receivers on loopback, an in-process
worker, nothing timed: each step waits for what it asserts."""

from __future__ import annotations

import asyncio

import hooklane
from testsupport.fixtures import add_endpoint, wait_for
from testsupport.receivers import Answer

QUICK = 4
# Twice the long budget (the most the long class holds, calls that ran long
# while it was full included) holds a call of every slow endpoint: each
# first call starts quick, before its endpoint is known slow.
LONG = 8
SLOW_ENDPOINTS = 12  # three times the worker's quick slots


async def publish(db, tenant: str, n: int) -> None:
    async with db.transaction():
        for i in range(n):
            await hooklane.publish(db, tenant=tenant, type="order.updated", data={"i": i})


def arrivals(receiver, paths: list[str]) -> int:
    return sum(len(receiver.at(p)) for p in paths)


async def test_fast_endpoints_are_served_while_more_endpoints_are_slow_than_the_worker_has_slots(
    db, receiver, start_worker
):
    held = asyncio.Event()
    slow = [f"slow-{i}" for i in range(SLOW_ENDPOINTS)]
    fast = [f"fast-{i}" for i in range(3)]
    for path in slow:
        await add_endpoint(
            db, path, receiver.on(path, Answer(204, held=held)), tenant="region", timeout_seconds=60
        )
    for path in fast:
        await add_endpoint(db, path, receiver.on(path, Answer(204)), tenant="elsewhere")
    await publish(db, "region", 2)  # two each: 24 calls asked of a worker of 4 slots
    worker = start_worker(worker_concurrency=QUICK, worker_long_calls=LONG, long_call_seconds=0.2)
    try:
        # Every slow endpoint got a call, and they are held; the quick slots
        # were given back as each call ran long.
        await wait_for(lambda: {r.path for p in slow for r in receiver.at(p)} == {f"/{p}" for p in slow}, 30)
        await wait_for(lambda: worker.worker.slots.quick_in_flight == 0)
        assert worker.worker.slots.long_in_flight == arrivals(receiver, slow)

        await publish(db, "elsewhere", 5)
        await wait_for(lambda: arrivals(receiver, fast) == 5 * len(fast), timeout=30)
        # The slow calls all still held, in the long budget.
        assert arrivals(receiver, slow) == worker.worker.slots.long_in_flight
    finally:
        held.set()
    await wait_for(
        lambda: db.fetchval("SELECT count(*) FILTER (WHERE state = 'delivered') = count(*) FROM deliveries"),
        timeout=60,
    )
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 2 * SLOW_ENDPOINTS + 5 * len(fast)
    assert all(len(receiver.at(p)) == 2 for p in slow)


async def test_a_slow_endpoint_that_answers_quickly_again_gets_quick_slots_back(db, receiver, start_worker):
    held = asyncio.Event()
    endpoint_id = await add_endpoint(
        db, "recovers", receiver.on("recovers", lambda i: Answer(204, held=held if i == 0 else None))
    )
    await publish(db, "acme", 1)
    worker = start_worker(worker_concurrency=QUICK, worker_long_calls=LONG, long_call_seconds=0.2)
    await wait_for(lambda: worker.worker.slots.long_in_flight == 1)
    assert worker.worker.ready_list.slow(endpoint_id)
    held.set()
    await publish(db, "acme", 10)
    await wait_for(lambda: len(receiver.at("recovers")) == 11)
    await wait_for(lambda: db.fetchval("SELECT bool_and(state = 'delivered') FROM deliveries"))
    # Its last calls answered at once: quick again.
    await wait_for(lambda: not worker.worker.ready_list.slow(endpoint_id))


async def test_receivers_turning_slow_all_at_once_give_their_quick_slots_back_before_the_threshold(
    db, receiver, start_worker
):
    """As many receivers as the worker has quick slots turn slow at once:
    with the slots all taken, their calls move to the long budget after a
    tenth of the threshold, not at it (40 s here, past the waits below),
    as long as the slots stay pressed."""
    held = asyncio.Event()
    slow = [f"turning-{i}" for i in range(QUICK)]
    ids = [
        await add_endpoint(
            db, path, receiver.on(path, Answer(204, held=held)), tenant="region", timeout_seconds=60
        )
        for path in slow
    ]
    await add_endpoint(db, "fast", receiver.on("fast", Answer(204)), tenant="elsewhere")
    worker = start_worker(worker_concurrency=QUICK, worker_long_calls=LONG, long_call_seconds=40)
    try:
        await publish(db, "region", 1)
        await wait_for(lambda: arrivals(receiver, slow) == QUICK, 30)
        await publish(db, "elsewhere", 1)
        await wait_for(lambda: receiver.at("fast"), timeout=30)
        # As many moved as the slots' pressure asked, and those endpoints
        # are slow while their calls run: their next calls wait for the
        # long budget.
        moved = worker.worker.slots.long_in_flight
        assert moved >= 1
        assert sum(worker.worker.ready_list.slow(i) for i in ids) == moved
    finally:
        held.set()
    await wait_for(lambda: db.fetchval("SELECT bool_and(state = 'delivered') FROM deliveries"), timeout=60)
