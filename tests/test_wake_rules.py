"""When the worker runs a reservation round: only when one can find something.

The SQL side (what `complete` makes ready and reports) is in
tests/test_reservation.py; here, the worker's decisions on top of it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest

import hooklane
from hooklane import store
from hooklane.policies import CircuitPolicy
from hooklane.settings import Settings
from hooklane.worker.runner import _ROUND_INTERVAL, Worker, round_pause, slot_freed_matters
from tests.conftest import add_endpoint

ALL = list(range(32))


@pytest.mark.unit
def test_a_freed_slot_matters_only_to_a_worker_that_was_at_its_limit():
    assert slot_freed_matters(in_flight=255, concurrency=256)
    assert not slot_freed_matters(in_flight=254, concurrency=256)
    assert not slot_freed_matters(in_flight=0, concurrency=256)
    assert slot_freed_matters(in_flight=0, concurrency=1)


@pytest.mark.unit
def test_rounds_share_a_window_only_while_slots_are_plentiful():
    assert round_pause(0.005, in_flight=3, concurrency=256) == pytest.approx(_ROUND_INTERVAL - 0.005)
    assert round_pause(1.0, in_flight=0, concurrency=256) == 0.0  # woken after a quiet spell: at once
    assert round_pause(0.0, in_flight=128, concurrency=256) == 0.0  # busy: freed slots are throughput


@pytest.mark.unit
async def test_a_finished_delivery_wakes_the_reservation_only_at_the_worker_limit():
    worker = Worker(Settings(worker_concurrency=2))
    tasks = [asyncio.create_task(asyncio.sleep(0)) for _ in range(2)]
    await asyncio.gather(*tasks)
    worker._sending.update(tasks)
    worker._sent(tasks[0])  # 2 of 2 were in flight: rounds had stopped
    assert worker._wake.is_set()
    worker._wake.clear()
    worker._sent(tasks[1])  # 1 of 2: a round was free to run anyway
    assert not worker._wake.is_set()


async def test_a_recorded_result_wakes_the_reservation_only_for_due_work_and_a_free_slot(db, settings):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=1)
    worker = Worker(replace(settings, worker_concurrency=8))
    worker._pool = await store.create_pool(settings.database_url, min_size=0, max_size=1)
    try:
        await hooklane.publish(db, tenant="acme", type="t", data={})
        (only,) = await store.reserve(db, ALL, 10, 10.0, "w")
        await worker._record([store.Result.delivered(only["id"], only["attempts"], status=204)])
        assert not worker._wake.is_set()  # nothing pending: a round would find nothing

        for _ in range(2):
            await hooklane.publish(db, tenant="acme", type="t", data={})
        (first,) = await store.reserve(db, ALL, 10, 10.0, "w")  # at its limit, one left
        assert await store.reserve(db, ALL, 10, 10.0, "w") == []
        await worker._record([store.Result.delivered(first["id"], first["attempts"], status=204)])
        assert worker._wake.is_set()  # its slot is free and the next one is due
        assert await db.fetchval("SELECT ready_at <= now() FROM ready_endpoints WHERE endpoint_id = $1", a)
        assert len(await store.reserve(db, ALL, 10, 10.0, "w")) == 1
    finally:
        await worker._pool.close()


async def test_the_circuit_log_line_follows_what_complete_opened(db, settings, caplog):
    # a batch of failures that jumps past the threshold opened the circuit
    # without the count ever equalling it
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=10)
    worker = Worker(replace(settings, circuit=CircuitPolicy(threshold=3)))
    worker._pool = await store.create_pool(settings.database_url, min_size=0, max_size=1)
    try:
        for _ in range(7):
            await hooklane.publish(db, tenant="acme", type="t", data={})
        rows = await store.reserve(db, ALL, 10, 10.0, "w")
        failed = [
            store.Result.retry(r["id"], r["attempts"], retry_in=60.0, status=500, error="HTTP 500")
            for r in rows
        ]
        gone = store.Result.dead(rows[-1]["id"], rows[-1]["attempts"], status=410, error="HTTP 410")
        with caplog.at_level(logging.WARNING, logger="hooklane.worker.runner"):
            await worker._record(failed[:2])
            await worker._record(failed[2:5])  # 2 to 5 failures
            await worker._record(failed[5:6])  # open already
            await worker._record([gone])
        said = [(r.getMessage(), r.__dict__.get("action")) for r in caplog.records]
        assert said == [
            ("endpoint default/a paused: circuit open", "circuit"),
            ("endpoint default/a deactivated", "circuit"),
        ]
    finally:
        await worker._pool.close()
