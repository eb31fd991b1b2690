"""Reservation, results and rescue at the SQL level, on a real Postgres."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import asyncpg

import hooklane
from hooklane import store
from hooklane.delivery import DeliverySpec
from hooklane.policies import CircuitPolicy
from hooklane.store.queries import QUERIES
from hooklane.worker.ready import Wakeup
from testsupport.fixtures import ALL_PARTITIONS as ALL
from testsupport.fixtures import add_endpoint, notified, queue_unannounced, reserve_round


async def _reserve(db, limit=100):
    return await reserve_round(db, limit)


async def _rescued(db, since=None) -> int:
    return len((await store.rescue_expired(db, ALL, since)).endpoints)


async def _complete(db, results, policy):
    return await store.complete(db, results, policy, ALL)


async def _publish(db, n, type="order.created", tenant="acme"):
    for _ in range(n):
        await hooklane.publish(db, tenant=tenant, type=type, data={})


async def test_never_more_in_flight_than_max_concurrency(db):
    await add_endpoint(db, "slow", "http://127.0.0.1:1/slow", max_concurrency=3)
    await _publish(db, 10)
    assert len(await _reserve(db)) == 3
    assert await _reserve(db) == []  # the endpoint is at its limit
    first = (await db.fetch("SELECT id, attempts FROM deliveries WHERE state = 'sending' LIMIT 1"))[0]
    await _complete(db, [store.Result.delivered(first["id"], first["attempts"], status=204)], CircuitPolicy())
    assert len(await _reserve(db)) == 1  # one slot freed, one more goes


async def test_endpoints_interleave_first_of_each_before_second_of_any(db):
    for name in ["a", "b", "c"]:
        await add_endpoint(db, name, f"http://127.0.0.1:1/{name}", tenant=name, max_concurrency=10)
    # a has a deep backlog published first; c has a single delivery, last
    await _publish(db, 20, tenant="a")
    await _publish(db, 20, tenant="b")
    await _publish(db, 1, tenant="c")
    rows = await _reserve(db, limit=5)
    # a FIFO would hand all five to a; interleaving gives each its first
    # before anyone its second
    assert sorted(r.name for r in rows) == ["a", "a", "b", "b", "c"]
    rows = await _reserve(db, limit=3)
    assert sorted(r.name for r in rows) == ["a", "a", "b"]


async def test_interleaving_ignores_queue_depth(db):
    await add_endpoint(db, "deep", "http://127.0.0.1:1/deep", tenant="deep", max_concurrency=256)
    for i in range(50):
        await add_endpoint(
            db, f"shallow{i}", f"http://127.0.0.1:1/s{i}", tenant=f"shallow{i}", max_concurrency=256
        )
    await _publish(db, 500, tenant="deep")
    for i in range(50):
        await _publish(db, 1, tenant=f"shallow{i}")
    rows = await _reserve(db, limit=51)
    assert sum(r.name == "deep" for r in rows) == 1


async def test_only_due_active_unpaused_signed_endpoints(db):
    ok = await add_endpoint(db, "ok", "http://127.0.0.1:1/ok")
    manual = await add_endpoint(db, "manual", "http://127.0.0.1:1/m", paused=True)
    circuit = await add_endpoint(db, "circuit", "http://127.0.0.1:1/c")
    gone = await add_endpoint(db, "gone", "http://127.0.0.1:1/g")
    unsigned = await add_endpoint(db, "unsigned", "http://127.0.0.1:1/u", secret=None)
    later = await add_endpoint(db, "later", "http://127.0.0.1:1/l", tenant="later")
    await _publish(db, 1)
    await _publish(db, 1, tenant="later")
    await db.execute("UPDATE endpoints SET paused_until = now() + interval '1 minute' WHERE id = $1", circuit)
    await db.execute("UPDATE endpoints SET state = 'deactivated' WHERE id = $1", gone)
    await db.execute(
        "UPDATE deliveries SET next_attempt_at = now() + interval '1 minute' WHERE endpoint_id = $1", later
    )
    assert [r.endpoint_id for r in await _reserve(db)] == [ok]
    # a minute passes: the pause ends and the retry is due
    await _time_passes(db, 61)
    assert sorted(r.endpoint_id for r in await _reserve(db)) == sorted([circuit, later])
    pending = await db.fetch("SELECT endpoint_id FROM deliveries WHERE state = 'pending'")
    assert sorted(r["endpoint_id"] for r in pending) == sorted([manual, gone, unsigned])
    # unpausing, signing and reactivating wake the endpoints up
    await add_endpoint(db, "manual", "http://127.0.0.1:1/m", paused=False)
    await add_endpoint(db, "unsigned", "http://127.0.0.1:1/u")
    assert await store.reactivate_endpoint(db, "default", "gone") is store.Reactivation.REACTIVATED
    assert sorted(r.endpoint_id for r in await _reserve(db)) == sorted([manual, gone, unsigned])


async def _time_passes(db, seconds: float) -> None:
    """Move every scheduled time back, as if ``seconds`` had gone by."""
    shift = f"interval '{seconds} seconds'"
    await db.execute(f"UPDATE endpoints SET paused_until = paused_until - {shift}")
    await db.execute(f"UPDATE deliveries SET next_attempt_at = next_attempt_at - {shift}")
    await db.execute(f"UPDATE ready_endpoints SET ready_at = ready_at - {shift} WHERE ready_at <> 'infinity'")


async def test_only_owned_partitions(db):
    ids = [await add_endpoint(db, f"e{i}", f"http://127.0.0.1:1/{i}") for i in range(40)]
    await _publish(db, 1)
    partitions = dict(await db.fetch("SELECT id, partition FROM endpoints"))
    mine = sorted(set(partitions.values()))[:3]
    rows = await reserve_round(db, partitions=mine)
    assert rows and {partitions[r.endpoint_id] for r in rows} <= set(mine)
    assert len(rows) == sum(1 for i in ids if partitions[i] in mine)
    # an endpoint of a partition not owned is never reserved, even if named
    other = next(i for i in ids if partitions[i] not in mine)
    named = await store.reserve(db, mine, [other], [None], 100, 10.0, "w")
    assert named.deliveries == []
    assert [(v.endpoint_id, v.deliverable) for v in named.verdicts] == [(other, False)]


async def test_late_result_from_a_worker_that_lost_the_delivery_changes_nothing(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await _publish(db, 1)
    (lost,) = await _reserve(db)
    # the lease runs out: rescued, then reserved again by another worker
    await db.execute("UPDATE deliveries SET lease_expires_at = now() - interval '1 second'")
    assert await _rescued(db) == 1
    (again,) = await _reserve(db)
    assert again.attempts == lost.attempts + 1
    # the first worker's late failure arrives and must not touch the new attempt
    await _complete(
        db,
        [store.Result.retry(lost.id, lost.attempts, retry_in=60.0, status=500, error="HTTP 500")],
        CircuitPolicy(),
    )
    row = await db.fetchrow("SELECT state, attempts, last_error FROM deliveries")
    assert (row["state"], row["attempts"], row["last_error"]) == (
        "sending",
        2,
        "lease expired: the worker lost the delivery",
    )
    assert await db.fetchval("SELECT consecutive_failures FROM endpoints") == 0
    await _complete(db, [store.Result.delivered(again.id, again.attempts, status=200)], CircuitPolicy())
    assert await db.fetchval("SELECT state FROM deliveries") == "delivered"


async def test_rescue_leaves_live_leases_alone(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", timeout_seconds=5)
    await _publish(db, 2)
    await _reserve(db)
    assert await _rescued(db) == 0
    lease = await db.fetchval("SELECT min(lease_expires_at - reserved_at) FROM deliveries")
    assert lease.total_seconds() == 15  # the timeout plus the grace


async def test_retry_schedules_with_the_given_delay(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await _publish(db, 1)
    (row,) = await _reserve(db)
    await _complete(
        db,
        [store.Result.retry(row.id, row.attempts, retry_in=120.0, status=503, error="HTTP 503")],
        CircuitPolicy(),
    )
    delay = await db.fetchval("SELECT extract(epoch FROM next_attempt_at - now()) FROM deliveries")
    assert 119 <= float(delay) <= 120
    assert await _reserve(db) == []  # not due yet


async def test_dead_stays_dead_until_resent(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await _publish(db, 1)
    (row,) = await _reserve(db)
    await _complete(
        db, [store.Result.dead(row.id, row.attempts, status=413, error="HTTP 413")], CircuitPolicy()
    )
    assert await _reserve(db) == []
    assert await store.resend_dead(db, "default", "a") == 1
    (again,) = await _reserve(db)
    assert again.id == row.id and again.attempts == 1


async def test_circuit_opens_at_threshold_and_success_closes_it(db):
    policy = CircuitPolicy(threshold=20, step_seconds=60, cap_seconds=3600)
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=256)
    await _publish(db, 30)
    rows = await _reserve(db)
    fail = [store.Result.retry(r.id, r.attempts, retry_in=30.0, status=500, error="HTTP 500") for r in rows]
    await _complete(db, fail[:19], policy)
    assert await db.fetchval("SELECT paused_until FROM endpoints") is None
    await _complete(db, fail[19:20], policy)
    pause = await db.fetchval("SELECT extract(epoch FROM paused_until - now()) FROM endpoints")
    assert 58 <= float(pause) <= 60
    # each further failure extends the pause, up to the cap
    await _complete(db, fail[20:24], policy)
    pause = await db.fetchval("SELECT extract(epoch FROM paused_until - now()) FROM endpoints")
    assert 298 <= float(pause) <= 300
    await _complete(db, [store.Result.delivered(rows[24].id, rows[24].attempts, status=200)], policy)
    row = await db.fetchrow("SELECT consecutive_failures, paused_until, failing_since FROM endpoints")
    assert tuple(row) == (0, None, None)


async def test_pause_is_capped_at_an_hour(db):
    policy = CircuitPolicy()
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await db.execute("UPDATE endpoints SET consecutive_failures = 500")
    await _publish(db, 1)
    (row,) = await _reserve(db)
    await _complete(
        db, [store.Result.retry(row.id, row.attempts, retry_in=30.0, status=500, error="x")], policy
    )
    pause = await db.fetchval("SELECT extract(epoch FROM paused_until - now()) FROM endpoints")
    assert 3598 <= float(pause) <= 3600


async def test_410_deactivates_the_endpoint_and_keeps_the_rest(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await _publish(db, 3)
    (row, *_rest) = await _reserve(db)
    await _complete(
        db, [store.Result.dead(row.id, row.attempts, status=410, error="HTTP 410")], CircuitPolicy()
    )
    ep = await db.fetchrow("SELECT state, deactivated_reason FROM endpoints")
    assert ep["state"] == "deactivated" and "410" in ep["deactivated_reason"]
    states = sorted(r["state"] for r in await db.fetch("SELECT state FROM deliveries"))
    assert states == ["dead", "sending", "sending"]


async def test_failing_for_five_days_deactivates_and_keeps_pending(db):
    await add_endpoint(db, "old", "http://127.0.0.1:1/old")
    await add_endpoint(db, "new", "http://127.0.0.1:1/new")
    await _publish(db, 2)
    await db.execute(
        "UPDATE endpoints SET failing_since = now() - interval '5 days 1 minute' WHERE name = 'old'"
    )
    await db.execute("UPDATE endpoints SET failing_since = now() - interval '4 days' WHERE name = 'new'")
    gone = await store.deactivate_failing(db, 5 * 24 * 3600)
    assert [r["name"] for r in gone] == ["old"]
    assert (
        await db.fetchval(
            "SELECT count(*) FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id WHERE e.name = 'old' AND d.state = 'pending'"
        )
        == 2
    )
    assert await store.reactivate_endpoint(db, "default", "old") is store.Reactivation.REACTIVATED
    assert await db.fetchval("SELECT state FROM endpoints WHERE name = 'old'") == "active"


async def test_events_are_purged_after_retention_unless_still_needed(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    done = await hooklane.publish(db, tenant="acme", type="t", data={})
    dead = await hooklane.publish(db, tenant="acme", type="t", data={})
    fresh = await hooklane.publish(db, tenant="acme", type="t", data={})
    unrouted = await hooklane.publish(db, tenant="nobody", type="t", data={})
    await db.execute("UPDATE deliveries SET state = 'delivered' WHERE event_id = $1", done)
    await db.execute("UPDATE deliveries SET state = 'dead' WHERE event_id = $1", dead)
    await db.execute(
        "UPDATE events SET created_at = now() - interval '31 days' WHERE id = ANY($1)", [done, dead, unrouted]
    )
    assert await store.purge_events(db, 30 * 24 * 3600, batch=1) == 2
    assert sorted(await db.fetchval("SELECT array_agg(id) FROM events")) == sorted([dead, fresh])
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 2


async def test_a_coalescing_publish_held_open_does_not_block_reservation(db, dsn):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", tenant="a")
    await add_endpoint(db, "b", "http://127.0.0.1:1/b", tenant="b")
    await hooklane.publish(db, tenant="a", type="order.updated", data={"v": 1}, coalesce_key="order-1")
    await hooklane.publish(db, tenant="b", type="order.updated", data={})
    app = await asyncpg.connect(dsn)
    try:
        tx = app.transaction()
        await tx.start()
        # the application's transaction now holds a's pending row
        newer = await hooklane.publish(
            app, tenant="a", type="order.updated", data={"v": 2}, coalesce_key="order-1"
        )
        rows = await asyncio.wait_for(_reserve(db), timeout=5)
        assert [r.name for r in rows] == ["b"]
        await tx.commit()
    finally:
        await app.close()
    (row,) = await _reserve(db)
    assert (row.name, row.event_id) == ("a", newer)


async def test_pending_endpoints_lists_what_a_ready_list_starts_from(db):
    endpoint = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await add_endpoint(db, "paused", "http://127.0.0.1:1/p", paused=True)
    await add_endpoint(db, "idle", "http://127.0.0.1:1/i", tenant="nobody")
    await queue_unannounced(db)
    await db.execute(
        "DELETE FROM deliveries d USING endpoints e WHERE e.id = d.endpoint_id AND e.name = 'idle'"
    )
    partition = await db.fetchval("SELECT partition FROM endpoints WHERE id = $1", endpoint)
    # not the paused one, nor one with nothing pending
    head = await db.fetchval("SELECT next_attempt_at FROM deliveries WHERE endpoint_id = $1", endpoint)
    before = await db.fetchval("SELECT now()")
    listing = await store.pending_endpoints(db, ALL)
    assert listing.endpoints == [(endpoint, partition, head)]
    assert before <= listing.checked_at <= await db.fetchval("SELECT now()")  # the database's clock
    assert (await store.pending_endpoints(db, [p for p in ALL if p != partition])).endpoints == []


async def test_pending_endpoints_reads_from_since_but_the_whole_partitions_from_the_start(db):
    endpoint = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await queue_unannounced(db)
    partition = await db.fetchval("SELECT partition FROM endpoints WHERE id = $1", endpoint)
    head = await db.fetchval("SELECT next_attempt_at FROM deliveries")
    later = await db.fetchval("SELECT now() + interval '1 minute'")
    assert (await store.pending_endpoints(db, ALL, since=head)).endpoints == [(endpoint, partition, head)]
    assert (await store.pending_endpoints(db, ALL, since=later)).endpoints == []
    others = [p for p in ALL if p != partition]
    assert (await store.pending_endpoints(db, ALL, since=later, whole=others)).endpoints == []
    assert (await store.pending_endpoints(db, ALL, since=later, whole=[partition])).endpoints == [
        (endpoint, partition, head)
    ]


async def test_each_statement_that_gives_an_endpoint_work_notifies_its_owner(db):
    # hooklane_wake_v2 is called from a CTE, which Postgres runs only if the
    # statement reads it: every caller is checked here. None writes a row.
    async def new_endpoint():
        nonlocal a, partition
        a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
        partition = await db.fetchval("SELECT partition FROM endpoints")

    a = partition = 0
    assert await notified(db, new_endpoint) == []  # nothing to wake for
    assert await notified(db, lambda: add_endpoint(db, "a", "http://127.0.0.1:1/a", paused=True)) == [
        Wakeup(partition, None, (a,))
    ]  # upsert_endpoint: changed, nothing written

    async def publish_in_a_transaction():
        async with db.transaction():
            await _publish(db, 2)
            return await db.fetchval("SELECT now()")

    # A publish notifies nobody (migration 0019): the owner's probe finds
    # it, due from the time its deliveries hold.
    before = await store.published_since(db, None)
    assert await notified(db, publish_in_a_transaction) == []
    due = await db.fetchval("SELECT max(next_attempt_at) FROM deliveries")
    found = await store.published_since(db, before.snapshot)
    assert (found.events, found.endpoints) == (2, [(a, partition, due)])
    await db.execute("UPDATE endpoints SET state = 'deactivated'")

    async def reactivate():
        assert await store.reactivate_endpoint(db, "default", "a") is store.Reactivation.REACTIVATED

    assert await notified(db, reactivate) == [Wakeup(partition, None, (a,))]
    await db.execute("UPDATE deliveries SET state = 'dead'")

    async def resend():
        assert await store.resend_dead(db, "default", "a") == 2

    (resent,) = await notified(db, resend)
    assert (resent.partition, resent.endpoints) == (partition, (a,))
    assert resent.due == await db.fetchval("SELECT min(next_attempt_at) FROM deliveries")
    await db.execute("UPDATE deliveries SET state = 'delivered'")

    async def replay():
        await store.replay_since(db, "default", "a", datetime(2000, 1, 1, tzinfo=UTC))

    (replayed,) = await notified(db, replay)
    assert replayed.endpoints == (a,) and replayed.due is not None

    async def nothing():
        # nothing to wake: no notification
        assert await store.resend_dead(db, "default", "a") == 0
        assert await store.reactivate_endpoint(db, "default", "missing") is store.Reactivation.NO_ENDPOINT
        assert await store.reactivate_endpoint(db, "default", "a") is store.Reactivation.NOT_DEACTIVATED
        await _publish(db, 1, tenant="nobody")

    assert await notified(db, nothing) == []
    assert await db.fetchval("SELECT count(*) FROM wakeups") == 0


async def test_a_notification_lists_at_most_300_endpoints(db):
    ids = [await add_endpoint(db, f"e{i}", f"http://127.0.0.1:1/{i}") for i in range(700)]
    await db.execute("UPDATE endpoints SET partition = 7")
    heard = await notified(
        db,
        lambda: db.execute(
            "SELECT hooklane_wake_v2(array_agg(id), array_agg(partition), array_agg(now())) FROM endpoints"
        ),
    )
    assert all(w.partition == 7 and len({w.due for w in heard}) == 1 for w in heard)
    assert sorted(len(w.endpoints) for w in heard) == [100, 300, 300]
    assert sorted(e for w in heard for e in w.endpoints) == sorted(ids)


async def test_reservation_records_the_worker_and_a_rescue_keeps_it(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await add_endpoint(db, "moved", "http://127.0.0.1:1/m", tenant="globex")
    await _publish(db, 1)
    await _publish(db, 1, tenant="globex")
    await add_endpoint(db, "moved", "http://127.0.0.1:1/m", tenant="acme")  # its pending one is discarded
    (row,) = await reserve_round(db, worker="pod-1")
    by = dict(await db.fetch("SELECT state, attempted_by FROM deliveries"))
    assert by == {"sending": "pod-1", "discarded": None}
    await db.execute("UPDATE deliveries SET lease_expires_at = now() - interval '1 second'")
    assert await _rescued(db) == 1
    # who lost it stays on record until another worker takes it
    assert await db.fetchval("SELECT attempted_by FROM deliveries WHERE id = $1", row.id) == "pod-1"
    await reserve_round(db, worker="pod-2")
    assert await db.fetchval("SELECT attempted_by FROM deliveries WHERE id = $1", row.id) == "pod-2"
    # what `hooklane status` shows
    sending_on = {h.name: h.sending_on for h in await store.endpoint_health(db)}
    assert sending_on == {"a": ("pod-2",), "moved": ()}


async def test_a_round_says_of_each_candidate_what_its_ready_list_needs(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=2)
    b = await add_endpoint(db, "b", "http://127.0.0.1:1/b", tenant="b")
    c = await add_endpoint(db, "c", "http://127.0.0.1:1/c", tenant="c")
    await _publish(db, 3)
    await _publish(db, 1, tenant="b")
    await _publish(db, 1, tenant="c")
    await db.execute(
        "UPDATE deliveries SET next_attempt_at = now() + interval '1 hour' WHERE endpoint_id = $1", b
    )
    await db.execute("UPDATE endpoints SET paused_until = now() + interval '1 minute' WHERE id = $1", c)
    gone = 10**9
    round_ = await store.reserve(db, ALL, [a, b, c, gone], [None] * 4, 100, 10.0, "w")
    assert [r.endpoint_id for r in round_.deliveries] == [a, a]
    verdicts = {v.endpoint_id: v for v in round_.verdicts}

    async def head(endpoint):
        return await db.fetchval(
            "SELECT min(next_attempt_at) FROM deliveries WHERE endpoint_id = $1 AND state = 'pending'",
            endpoint,
        )

    leases = await db.fetchval("SELECT min(lease_expires_at) FROM deliveries WHERE state = 'sending'")
    # a: its third delivery is next, and both its slots are held until then
    assert (verdicts[a].deliverable, verdicts[a].head, verdicts[a].at_limit, verdicts[a].leases_end) == (
        True,
        await head(a),
        True,
        leases,
    )
    # b: nothing due for an hour; c: its circuit pauses it
    assert (verdicts[b].head, verdicts[b].at_limit) == (await head(b), False)
    paused_until = await db.fetchval("SELECT paused_until FROM endpoints WHERE id = $1", c)
    assert (verdicts[c].paused_until, verdicts[c].head) == (paused_until, await head(c))
    # an endpoint that no longer exists says so
    assert (verdicts[gone].exists, verdicts[gone].deliverable) == (False, False)


async def test_a_round_reads_each_queue_from_its_floor(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=10)
    await _publish(db, 2)
    early, late = [r["id"] for r in await db.fetch("SELECT id FROM deliveries ORDER BY id")]
    await db.execute("UPDATE deliveries SET next_attempt_at = now() - interval '1 hour' WHERE id = $1", early)
    floor = await db.fetchval("SELECT now() - interval '1 minute'")
    # what lies before the floor is not read: the ready list moves a floor
    # only to a head a round saw, or down to what it is told of
    round_ = await store.reserve(db, ALL, [a], [floor], 100, 10.0, "w")
    assert [r.id for r in round_.deliveries] == [late]
    assert round_.verdicts[0].head is None
    round_ = await store.reserve(db, ALL, [a], [None], 100, 10.0, "w")
    assert [r.id for r in round_.deliveries] == [early]


async def test_only_live_leases_hold_slots(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=1)
    await _publish(db, 2)
    (first,) = await _reserve(db)
    assert await _reserve(db) == []  # its one slot is held
    await db.execute(
        "UPDATE deliveries SET lease_expires_at = now() - interval '1 second' WHERE id = $1", first.id
    )
    # the worker that reserved it has certainly given up on the call: the
    # slot is free before any rescue
    (second,) = await _reserve(db)
    assert second.id != first.id


async def test_rescue_reads_the_leases_that_ended_since_its_last_run(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=10)
    await _publish(db, 2)
    old, recent = await _reserve(db)
    await db.execute(
        "UPDATE deliveries SET lease_expires_at = now() - interval '10 minutes' WHERE id = $1", old.id
    )
    await db.execute(
        "UPDATE deliveries SET lease_expires_at = now() - interval '1 second' WHERE id = $1", recent.id
    )
    since = await db.fetchval("SELECT now() - interval '1 minute'")
    rescued = await store.rescue_expired(db, ALL, since)
    partition = await db.fetchval("SELECT partition FROM endpoints")
    due = await db.fetchval("SELECT next_attempt_at FROM deliveries WHERE id = $1", recent.id)
    assert rescued.endpoints == [(a, partition, due)]
    assert rescued.checked_at == due  # the same statement's time
    states = dict(await db.fetch("SELECT id, state FROM deliveries"))
    assert states == {old.id: "sending", recent.id: "pending"}
    # the first run for a partition taken reads them all
    assert await _rescued(db) == 1


async def test_complete_says_what_the_ready_list_needs(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=4)
    await _publish(db, 3)
    delivered, retried, gone = await _reserve(db)
    (touched,) = await _complete(
        db, [store.Result.delivered(delivered.id, delivered.attempts, status=204)], CircuitPolicy()
    )
    assert (touched.id, touched.deliverable, touched.retried_head) == (a, True, None)
    policy = CircuitPolicy(threshold=1, step_seconds=30.0, cap_seconds=60.0)
    (touched,) = await _complete(
        db,
        [store.Result.retry(retried.id, retried.attempts, retry_in=60.0, status=503, error="HTTP 503")],
        policy,
    )
    retry_at = await db.fetchval("SELECT next_attempt_at FROM deliveries WHERE id = $1", retried.id)
    paused_until = await db.fetchval("SELECT paused_until FROM endpoints")
    assert (touched.retried_head, touched.paused_until) == (retry_at, paused_until)
    assert paused_until is not None
    (touched,) = await _complete(
        db, [store.Result.dead(gone.id, gone.attempts, status=410, error="HTTP 410")], CircuitPolicy()
    )
    assert (touched.state, touched.deliverable) == ("deactivated", False)


async def test_a_healthy_endpoints_row_is_written_once_per_step_not_per_batch(db):
    # While a horizon is held, every version of the row stays, and every
    # statement reading the endpoint walks them.
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=10)
    await _publish(db, 3)
    rows = await _reserve(db)

    async def deliver(r):
        await _complete(db, [store.Result.delivered(r.id, r.attempts, status=204)], CircuitPolicy())
        return tuple(await db.fetchrow("SELECT xmin::text, last_delivered_at FROM endpoints"))

    version, first = await deliver(rows[0])
    assert first is not None
    assert await deliver(rows[1]) == (version, first)  # not written
    step = f"interval '{store.DELIVERED_STEP_SECONDS} seconds'"
    await db.execute(f"UPDATE endpoints SET last_delivered_at = last_delivered_at - {step}")
    version, stepped = await db.fetchrow("SELECT xmin::text, last_delivered_at FROM endpoints")
    later, latest = await deliver(rows[2])
    assert later != version and latest > stepped


async def test_a_retry_recorded_by_a_worker_that_lost_the_partition_notifies_its_owner(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=10)
    await _publish(db, 2)
    lost, kept = await _reserve(db)
    partition = await db.fetchval("SELECT partition FROM endpoints")

    def retry(r):
        return [store.Result.retry(r.id, r.attempts, retry_in=60.0, status=500, error="HTTP 500")]

    others = [p for p in ALL if p != partition]
    heard = await notified(db, lambda: store.complete(db, retry(lost), CircuitPolicy(), others))
    due = await db.fetchval("SELECT next_attempt_at FROM deliveries WHERE id = $1", lost.id)
    assert heard == [Wakeup(partition, due, (a,))]
    # its own partition's: the worker's ready list learns it from the result
    assert await notified(db, lambda: store.complete(db, retry(kept), CircuitPolicy(), ALL)) == []


async def test_complete_says_which_circuits_it_opened_and_which_endpoints_it_deactivated(db):
    policy = CircuitPolicy(threshold=3, step_seconds=60, cap_seconds=3600)
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=10)
    await _publish(db, 10)
    rows = await _reserve(db)

    def failed(r, status=500):
        return store.Result.retry(r.id, r.attempts, retry_in=30.0, status=status, error=f"HTTP {status}")

    async def flags(results):
        (touched,) = await _complete(db, results, policy)
        return touched.consecutive_failures, touched.opened, touched.deactivated

    assert await flags([failed(rows[0])]) == (1, False, False)
    # four failures in one batch take it from 1 to 5, past the threshold of
    # 3 without ever being at it
    assert await flags([failed(r) for r in rows[1:5]]) == (5, True, False)
    # open already: a further failure extends the pause, it opens nothing
    assert await flags([failed(rows[5])]) == (6, False, False)
    # a batch with a success in it closes the circuit, whatever failures it holds
    delivered = store.Result.delivered(rows[6].id, rows[6].attempts, status=200)
    assert await flags([failed(rows[7]), delivered, failed(rows[8])]) == (0, False, False)
    assert await flags([failed(rows[9])]) == (1, False, False)
    # a 410 deactivates it once; another one later deactivates nothing (and
    # the failure it also is opens the circuit)
    await _publish(db, 2)
    gone = [store.Result.dead(r.id, r.attempts, status=410, error="HTTP 410") for r in await _reserve(db)]
    assert await flags(gone[:1]) == (2, False, True)
    assert await flags(gone[1:]) == (3, True, False)


# --- under a held horizon ---------------------------------------------------


async def _entries_read(db, index: str, name: str, **params) -> int:
    """Index entries of ``index`` that the statement ``name`` walked (dead
    ones included: the scan returns them before the heap says so)."""
    sql, *args = QUERIES[name](**params)
    async with db.transaction():
        await db.fetch(sql, *args)
        return await db.fetchval("SELECT pg_stat_get_xact_tuples_returned($1::regclass)", index)


async def _scans_of_deliveries(db, name: str, **params) -> list[tuple[str, bool]]:
    """(index, probed by endpoint) of each scan of deliveries in the plan
    of the statement ``name``; a scan by no index is named "none"."""
    sql, *args = QUERIES[name](**params)
    (plan,) = json.loads(await db.fetchval("EXPLAIN (FORMAT JSON) " + sql, *args))
    scans, nodes = [], [plan["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", []))
        if node.get("Relation Name") == "deliveries" and "Scan" in node["Node Type"]:
            scans.append((node.get("Index Name", "none"), "endpoint_id =" in node.get("Index Cond", "")))
    return scans


async def test_rescue_and_sweep_read_no_dead_entries_from_before_since(dsn, db):
    """While another session holds the horizon, every lease and queue entry
    of a delivery sent stays in the indexes. Rescue and a sweep read from
    `since`: what the endpoint sent an hour before costs them nothing."""
    endpoint = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    for n in range(99):
        await add_endpoint(db, f"b{n}", f"http://127.0.0.1:1/b{n}", tenant=f"t{n}")
    partition = await db.fetchval("SELECT partition FROM endpoints WHERE id = $1", endpoint)
    report = await asyncpg.connect(dsn)
    try:
        await report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM events")
        # 3,000 deliveries sent an hour ago, each through pending and sending
        await db.execute(
            "INSERT INTO events (id, tenant, type, data, fanout)"
            " SELECT 'e' || i, 'acme', 't', '{}', 1 FROM generate_series(1, 3000) i"
        )
        await db.execute(
            "INSERT INTO deliveries (endpoint_id, event_tenant, event_id, next_attempt_at)"
            " SELECT $1, 'acme', 'e' || i, now() - interval '1 hour' + i * interval '1 ms'"
            " FROM generate_series(1, 3000) i",
            endpoint,
        )
        # analysed while nothing was in flight, as a table mostly is
        await db.execute("ANALYZE deliveries")
        await db.execute(
            "UPDATE deliveries SET state = 'sending', lease_expires_at = next_attempt_at + interval '15 s'"
        )
        await db.execute("UPDATE deliveries SET state = 'delivered', lease_expires_at = NULL")
        since = await db.fetchval("SELECT now() - interval '1 minute'")
        assert await _rescued(db, since) == 0
        assert (await store.pending_endpoints(db, ALL, since)).endpoints == []
        # The rescue probes each endpoint's leases from `since` and updates
        # by primary key, whatever the statistics say: with those of a
        # table analysed while nothing was in flight, the planner once
        # chose to scan every lease the index held, twice.
        scans = await _scans_of_deliveries(db, "rescue_expired", partitions=ALL, since=since)
        assert sorted(scans) == [("deliveries_leased", True), ("deliveries_pkey", False)]
        assert (
            await _entries_read(db, "deliveries_leased", "rescue_expired", partitions=ALL, since=since) == 0
        )
        # The sweep reads none of the dead entries before `since`...
        listing = {"partitions": ALL, "since": since}
        assert await _entries_read(db, "deliveries_queue", "pending_endpoints", **listing, whole=[]) == 0
        # ...but, read from the start, a whole partition walks them.
        walked = await _entries_read(
            db, "deliveries_queue", "pending_endpoints", **listing, whole=[partition]
        )
        assert walked == 3000
    finally:
        await report.close()


async def test_adaptive_concurrency_rises_again_after_clean_batches(db):
    # A batch of successes carries no overload signal (their failure class
    # is NULL): the limit an overload lowered comes back up, a step a batch.
    endpoint = await add_endpoint(
        db, "adaptive", "http://127.0.0.1:1/a", max_concurrency=8, delivery=DeliverySpec(adaptive=True)
    )
    await _publish(db, 3)
    first, second, third = await _reserve(db)
    refused = store.Result.retry(first.id, first.attempts, retry_in=60, status=429, error="HTTP 429")
    [row] = await store.complete(db, [refused], CircuitPolicy(), ALL, adapt_step_seconds=0)
    assert (row.effective_concurrency, row.lowered) == (5, True)
    for ok in (second, third):
        success = store.Result.delivered(ok.id, ok.attempts, status=204)
        await store.complete(db, [success], CircuitPolicy(), ALL, adapt_step_seconds=0)
    limit = await db.fetchval("SELECT effective_concurrency FROM endpoints WHERE id = $1", endpoint)
    assert limit == 7
