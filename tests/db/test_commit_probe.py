"""Publishing without a NOTIFY in the application's transaction (issue 38):
a publish notifies nobody, and workers find what committed by probing,
in commit order, a transaction that commits late after later ones
included; the API's group commit hints once per group; publishers and
workers of the previous version go on delivering beside these."""

from __future__ import annotations

import json
import logging

import asyncpg

import hooklane
from hooklane import store
from hooklane.settings import Settings
from testsupport.fixtures import add_endpoint, in_process_api, notified, wait_for

INGEST = "ingest-token-0123456789"
ADMIN = "admin-token-0123456789"
# Long enough that a timer set to it does not come round in a test.
NEVER = 3600.0


def _ids(received: list) -> list[str]:
    return [json.loads(r.body)["id"] for r in received]


async def test_a_publish_sends_no_notification(db, dsn):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    conn = await asyncpg.connect(dsn)

    async def publish() -> None:
        async with conn.transaction():
            await hooklane.publish(conn, tenant="acme", type="order.created", data={}, id="e1")
            await conn.fetchrow("SELECT * FROM hooklane_try_publish_v2('acme', 'order.created', '{}', 'e2')")

    try:
        assert await notified(db, publish) == []
    finally:
        await conn.close()
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 2


async def test_the_probe_finds_each_commit_once_a_late_one_after_later_ones_included(db, dsn):
    early = await add_endpoint(db, "early", "http://127.0.0.1:1/early", tenant="t-early")
    later = await add_endpoint(db, "later", "http://127.0.0.1:1/later", tenant="t-later")
    partition = await db.fetchval("SELECT partition FROM endpoints WHERE id = $1", early)
    long = await asyncpg.connect(dsn)
    try:
        # A transaction that started before the first probe, and publishes
        # and commits only after a later transaction's commit was probed.
        tx = long.transaction()
        await tx.start()
        await long.execute("SELECT pg_current_xact_id()")
        first = await store.published_since(db, None)
        assert (first.events, first.endpoints) == (0, [])
        await hooklane.publish(long, tenant="t-early", type="order.created", data={}, id="late")
        await hooklane.publish(db, tenant="t-later", type="order.created", data={}, id="soon")
        seen = await store.published_since(db, first.snapshot)
        assert seen.events == 1
        assert [e for e, _, _ in seen.endpoints] == [later]
        await tx.commit()
        after = await store.published_since(db, seen.snapshot)
        # only the late commit: what the last probe saw is not read again
        assert after.events == 1
        [(endpoint, found_partition, due)] = after.endpoints
        assert (endpoint, found_partition) == (early, partition)
        assert due == await db.fetchval("SELECT next_attempt_at FROM deliveries WHERE event_id = 'late'")
        quiet = await store.published_since(db, after.snapshot)
        assert (quiet.events, quiet.endpoints) == (0, [])
    finally:
        await long.close()


async def test_the_probe_leaves_out_what_was_reserved_or_rolled_back(db, dsn):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    start = await store.published_since(db, None)
    conn = await asyncpg.connect(dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await hooklane.publish(conn, tenant="acme", type="order.created", data={}, id="undone")
        await tx.rollback()
    finally:
        await conn.close()
    await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="sent")
    await db.execute("UPDATE deliveries SET state = 'sending' WHERE event_id = 'sent'")
    found = await store.published_since(db, start.snapshot)
    assert (found.events, found.endpoints) == (1, [])


async def test_a_worker_delivers_a_late_commit_found_by_its_probe(db, dsn, receiver, start_worker, caplog):
    caplog.set_level(logging.WARNING, logger="hooklane.worker.jobs")
    await add_endpoint(db, "early", receiver.url("early"), tenant="t-early")
    await add_endpoint(db, "later", receiver.url("later"), tenant="t-later")
    start_worker()
    # Up and probing, its partitions listed.
    await hooklane.publish(db, tenant="t-later", type="order.created", data={}, id="warm")
    await wait_for(lambda: receiver.at("later"))
    long = await asyncpg.connect(dsn)
    try:
        tx = long.transaction()
        await tx.start()
        await hooklane.publish(long, tenant="t-early", type="order.created", data={}, id="late")
        await hooklane.publish(db, tenant="t-later", type="order.created", data={}, id="soon")
        await wait_for(lambda: len(receiver.at("later")) == 2)
        assert not receiver.at("early")
        await tx.commit()
        await wait_for(lambda: receiver.at("early"))
    finally:
        await long.close()
    assert _ids(receiver.received) == ["warm", "soon", "late"]
    # the sweep (every 60 s) had nothing to repair: the probe found both
    assert "were not ready" not in caplog.text


async def test_an_old_publisher_that_notifies_is_delivered_once_by_a_new_worker(db, receiver, start_worker):
    # The previous version's publish: the rows, and the notification of
    # each endpoint's owner from the same transaction (hooklane_wake_v2).
    ids = [await add_endpoint(db, name, receiver.url(name)) for name in ("a", "b")]
    start_worker()
    async with db.transaction():
        await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="old")
        await db.execute(
            "SELECT hooklane_wake_v2(array_agg(id), array_agg(partition), array_agg(now()))"
            " FROM endpoints WHERE id = ANY($1)",
            ids,
        )
    await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="new")
    await wait_for(lambda: len(receiver.received) == 4)
    await wait_for(lambda: db.fetchval("SELECT count(*) = 4 FROM deliveries WHERE state = 'delivered'"))
    assert sorted(_ids(receiver.received)) == ["new", "new", "old", "old"]


async def test_the_group_commit_hints_the_workers_to_probe_at_once(dsn, db, settings, receiver, start_worker):
    await add_endpoint(db, "a", receiver.url("a"))
    # Neither its timer nor the rebalancer (whose snapshot would show the
    # commit) has it probe after it is up.
    running = start_worker(probe_min_seconds=NEVER, probe_max_seconds=NEVER, rebalance_seconds=NEVER)
    await wait_for(running.worker.ready)
    async with in_process_api(dsn, settings, INGEST, ADMIN) as client:
        event = {"tenant": "acme", "type": "order.created", "data": {}, "id": "via-api"}
        headers = {"Authorization": f"Bearer {INGEST}"}
        async with client.post("/v1/events", json=event, headers=headers) as response:
            assert response.status in (200, 201, 202), await response.text()
        await wait_for(lambda: receiver.at("a"))
    assert _ids(receiver.received) == ["via-api"]


async def test_the_first_probe_is_taken_before_partitions_are_listed(
    db, settings: Settings, receiver, start_worker
):
    # Published before the worker starts: its listing finds it, the probes
    # (none runs after the first here) do not need to.
    await add_endpoint(db, "a", receiver.url("a"))
    await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="before")
    start_worker(probe_min_seconds=NEVER, probe_max_seconds=NEVER, rebalance_seconds=NEVER)
    await wait_for(lambda: receiver.at("a"))


async def test_an_idle_worker_probes_when_the_rebalancer_sees_a_commit(db, receiver, start_worker):
    # Its own timer never comes round again: the snapshot the rebalancer
    # reads each pass shows the publish's commit.
    await add_endpoint(db, "a", receiver.url("a"))
    running = start_worker(probe_min_seconds=NEVER, probe_max_seconds=NEVER)
    await wait_for(running.worker.ready)
    await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="quiet")
    await wait_for(lambda: receiver.at("a"))


async def test_a_probe_planned_on_empty_tables_reads_each_events_deliveries_by_their_event(db, dsn):
    """The probe's function keeps the plan its session made first: on a new
    install, for empty tables. Once thousands of events come at once it must
    still find their deliveries by event, not walk every pending delivery
    once per event (the partial index of the queue serves 'pending' too)."""
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    worker = await asyncpg.connect(dsn, server_settings=store.WORKER_SESSION)
    try:
        since = (await store.published_since(worker, None)).snapshot
        async with db.transaction():
            await store.insert_events(
                db, [store.Event(f"bulk-{i}", "acme", "bulk.item", "{}") for i in range(2000)]
            )
        returned = "SELECT pg_stat_get_xact_tuples_returned('deliveries_queue'::regclass)"
        async with worker.transaction():
            before = await worker.fetchval(returned)
            found = await store.published_since(worker, since)
            walked = await worker.fetchval(returned) - before
    finally:
        await worker.close()
    assert found.events == 2000 and len(found.endpoints) == 1
    assert walked == 0
