"""When the worker runs a reservation round, on a real Postgres: a recorded
result wakes it only for due work and a free slot, and the circuit's log
line follows what ``complete`` opened. The pure rules are
tests/unit/test_wake_rules.py's."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import hooklane
from hooklane import store
from hooklane.policies import CircuitPolicy
from hooklane.worker.ready import ReadyList
from hooklane.worker.runner import record
from hooklane.worker.trigger import Trigger, Wake
from testsupport.fixtures import ALL_PARTITIONS as ALL
from testsupport.fixtures import add_endpoint, reserve_round


async def test_a_recorded_result_wakes_the_reservation_only_for_due_work_and_a_free_slot(db, settings):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=1)
    trigger = Trigger(concurrency=8)
    ready = ReadyList()
    pool = await store.create_pool(settings.database_url, min_size=0, max_size=1)
    try:
        await hooklane.publish(db, tenant="acme", type="t", data={})
        (only,) = await reserve_round(db, ready=ready)
        await record(
            pool,
            [store.Result.delivered(only.id, only.attempts, status=204)],
            settings.circuit,
            trigger,
            ready,
            ALL,
            "test-worker",
        )
        assert await trigger.wait(0) is Wake.POLL  # nothing pending: a round would find nothing
        assert not ready.scheduled(a)

        for _ in range(2):
            await hooklane.publish(db, tenant="acme", type="t", data={})
        (first,) = await reserve_round(db, ready=ready)  # at its limit, one left
        assert await reserve_round(db, ready=ready) == []  # it waits for its slot
        await record(
            pool,
            [store.Result.delivered(first.id, first.attempts, status=204)],
            settings.circuit,
            trigger,
            ready,
            ALL,
            "test-worker",
        )
        assert await trigger.wait(0) is Wake.READY  # its slot is free and the next one is due
        assert ready.due(a) <= datetime.now(UTC)
        assert len(await reserve_round(db, ready=ready)) == 1
    finally:
        await pool.close()


async def test_the_circuit_log_line_follows_what_complete_opened(db, settings, caplog):
    # a batch of failures that jumps past the threshold opened the circuit
    # without the count ever equalling it
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=10)
    circuit = CircuitPolicy(threshold=3)
    trigger = Trigger(concurrency=settings.worker_concurrency)
    pool = await store.create_pool(settings.database_url, min_size=0, max_size=1)
    try:
        for _ in range(7):
            await hooklane.publish(db, tenant="acme", type="t", data={})
        rows = await reserve_round(db, 10)
        failed = [
            store.Result.retry(r.id, r.attempts, retry_in=60.0, status=500, error="HTTP 500") for r in rows
        ]
        gone = store.Result.dead(rows[-1].id, rows[-1].attempts, status=410, error="HTTP 410")
        with caplog.at_level(logging.WARNING, logger="hooklane.worker.runner"):
            await record(pool, failed[:2], circuit, trigger, ReadyList(), ALL, "test-worker")
            await record(
                pool, failed[2:5], circuit, trigger, ReadyList(), ALL, "test-worker"
            )  # 2 to 5 failures
            await record(pool, failed[5:6], circuit, trigger, ReadyList(), ALL, "test-worker")  # open already
            await record(pool, [gone], circuit, trigger, ReadyList(), ALL, "test-worker")
        said = [(r.getMessage(), r.__dict__.get("action")) for r in caplog.records]
        assert said == [
            ("endpoint default/a paused: circuit open", "circuit"),
            ("endpoint default/a deactivated", "circuit"),
        ]
    finally:
        await pool.close()
