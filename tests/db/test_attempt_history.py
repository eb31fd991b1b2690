"""Every attempt recorded (delivery_attempts, migration 0010): written by the
statement that records results and by the rescue, fenced like the result,
and kept by dropping whole days."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

import hooklane
from hooklane import store
from hooklane.errors import InvalidInput
from hooklane.policies import CircuitPolicy, RetryPolicy
from hooklane.store.cursor import AttemptPosition, attempt_cursor
from testsupport.fixtures import ALL_PARTITIONS as ALL
from testsupport.fixtures import add_endpoint, flaky_history, reserve_round, wait_for
from testsupport.receivers import Answer

_ATTEMPTS = "SELECT * FROM delivery_attempts ORDER BY recorded_at, attempt"


async def _one(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await hooklane.publish(db, tenant="acme", type="order.created", data={})
    (row,) = await reserve_round(db)
    return row


async def test_each_recorded_result_leaves_its_attempt_with_what_the_worker_saw(db):
    first = await _one(db)
    started = datetime.now(UTC) - timedelta(seconds=2)
    timing = store.Timing(started, 1.25, "ab" * 16)
    await store.complete(
        db,
        [
            store.Result.retry(
                first.id,
                first.attempts,
                retry_in=120.0,
                status=None,
                error="timeout: no response within 5 s",
                failure=store.FailureClass.TIMEOUT,
                timing=timing,
            )
        ],
        CircuitPolicy(),
        ALL,
        "worker-1",
    )
    await db.execute("UPDATE deliveries SET next_attempt_at = now()")
    (second,) = await reserve_round(db)
    await store.complete(
        db,
        [store.Result.delivered(second.id, second.attempts, status=204)],
        CircuitPolicy(),
        ALL,
        "worker-2",
    )
    retried, delivered = await db.fetch(_ATTEMPTS)
    assert (retried["delivery_id"], retried["attempt"], retried["outcome"]) == (first.id, 1, "retry")
    assert (retried["status"], retried["failure"], retried["error"]) == (
        None,
        "timeout",
        "timeout: no response within 5 s",
    )
    assert (retried["attempted_by"], retried["duration_seconds"], retried["trace_id"]) == (
        "worker-1",
        1.25,
        "ab" * 16,
    )
    assert retried["started_at"] == started
    assert retried["next_attempt_at"] > retried["recorded_at"] + timedelta(seconds=100)
    assert (retried["endpoint_id"], retried["event_tenant"], retried["event_id"]) == (
        first.endpoint_id,
        "acme",
        first.event_id,
    )
    assert (delivered["attempt"], delivered["outcome"], delivered["status"]) == (2, "delivered", 204)
    assert (delivered["failure"], delivered["error"], delivered["next_attempt_at"]) == (None, None, None)
    # Untimed (a caller that did not measure): started when recorded.
    assert delivered["duration_seconds"] is None and delivered["attempted_by"] == "worker-2"
    row = await db.fetchrow("SELECT state, last_status, last_failure FROM deliveries")
    assert tuple(row) == ("delivered", 204, None)


async def test_a_late_result_of_a_worker_that_lost_the_delivery_leaves_no_attempt(db):
    lost = await _one(db)
    await db.execute("UPDATE deliveries SET lease_expires_at = now() - interval '1 second'")
    assert len((await store.rescue_expired(db, ALL)).endpoints) == 1
    (again,) = await reserve_round(db)
    await store.complete(
        db,
        [store.Result.retry(lost.id, lost.attempts, retry_in=60.0, status=500, error="HTTP 500")],
        CircuitPolicy(),
        ALL,
        "late",
    )
    # Only the rescue's record of the lost attempt: the late answer changed
    # nothing, and claims nothing.
    (rescued,) = await db.fetch(_ATTEMPTS)
    assert (rescued["attempt"], rescued["outcome"], rescued["failure"]) == (1, "retry", "lease_expired")
    assert rescued["error"] == "lease expired: the worker lost the delivery"
    assert rescued["duration_seconds"] is None
    assert await db.fetchval("SELECT last_failure FROM deliveries") == "lease_expired"
    await store.complete(
        db,
        [store.Result.dead(again.id, again.attempts, status=413, error="HTTP 413")],
        CircuitPolicy(),
        ALL,
        "w",
    )
    assert [(r["attempt"], r["outcome"], r["status"]) for r in await db.fetch(_ATTEMPTS)] == [
        (1, "retry", None),
        (2, "dead", 413),
    ]


async def test_a_failure_discarded_for_a_tenant_change_is_recorded_as_discarded(db):
    row = await _one(db)
    await db.execute("UPDATE endpoints SET tenant = 'globex'")
    await store.complete(
        db,
        [store.Result.retry(row.id, row.attempts, retry_in=30.0, status=503, error="HTTP 503")],
        CircuitPolicy(),
        ALL,
        "w",
    )
    (attempt,) = await db.fetch(_ATTEMPTS)
    assert (attempt["outcome"], attempt["status"], attempt["next_attempt_at"]) == ("discarded", 503, None)
    assert attempt["error"].startswith("discarded: the endpoint's tenant changed from acme to globex")


async def _partitions(db) -> list[str]:
    rows = await db.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'delivery_attempts'::regclass ORDER BY 1"
    )
    return [r["relname"] for r in rows]


def _day(offset: int) -> str:
    return (datetime.now(UTC).date() + timedelta(days=offset)).strftime("%Y%m%d")


async def test_partitions_are_made_ahead_and_whole_days_dropped_past_retention(db):
    # As migrated: today and three days ahead, and the default.
    assert await _partitions(db) == [f"delivery_attempts_{_day(i)}" for i in range(4)] + [
        "delivery_attempts_default"
    ]
    old = f"delivery_attempts_{_day(-40)}"
    low = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=40)
    await db.execute(
        f"CREATE TABLE {old} PARTITION OF delivery_attempts FOR VALUES FROM ('{low.isoformat()}')"
        f" TO ('{(low + timedelta(days=1)).isoformat()}')"
    )
    await db.execute(
        "INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,"
        " started_at, outcome, recorded_at) VALUES (1, 1, 1, 't', 'e', $1, 'delivered', $1)",
        low + timedelta(hours=1),
    )
    kept = await store.keep_attempt_partitions(db, 30 * 86400.0, ahead=5)
    assert kept.created == (f"delivery_attempts_{_day(4)}", f"delivery_attempts_{_day(5)}")
    assert kept.dropped == (old,) and kept.busy == () and kept.purged == 0
    assert old not in await _partitions(db)
    again = await store.keep_attempt_partitions(db, 30 * 86400.0, ahead=5)
    assert again == store.PartitionsKept()


async def test_a_step_whose_lock_is_held_is_busy_and_the_rest_goes_on(db, dsn):
    old = f"delivery_attempts_{_day(-40)}"
    low = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=40)
    await db.execute(
        f"CREATE TABLE {old} PARTITION OF delivery_attempts FOR VALUES FROM ('{low.isoformat()}')"
        f" TO ('{(low + timedelta(days=1)).isoformat()}')"
    )
    reader = await asyncpg.connect(dsn)
    try:
        # A long read of the history (a pg_dump, a support query) holds the
        # default partition and the old day: attaching needs the one,
        # dropping the other.
        reader_tx = reader.transaction()
        await reader_tx.start()
        await reader.execute(f"SELECT count(*) FROM delivery_attempts_default, {old}")
        kept = await store.keep_attempt_partitions(db, 30 * 86400.0, ahead=4)
        assert kept.busy == (f"delivery_attempts_{_day(4)}", old)
        assert kept.created == kept.dropped == ()
        # Meanwhile results are recorded: no step holds a lock past itself.
        row = await _one(db)
        await store.complete(
            db, [store.Result.delivered(row.id, row.attempts, status=204)], CircuitPolicy(), ALL, "w"
        )
        await reader_tx.rollback()
    finally:
        await reader.close()
    kept = await store.keep_attempt_partitions(db, 30 * 86400.0, ahead=4)
    assert (kept.created, kept.dropped, kept.busy) == ((f"delivery_attempts_{_day(4)}",), (old,), ())


async def test_a_day_with_rows_in_the_default_partition_gets_none_and_retention_deletes_them(db):
    far = datetime.now(UTC) + timedelta(days=10)
    # Rows for a day no partition covers go to the default one: recording
    # never fails for want of a partition.
    await db.execute(
        "INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,"
        " started_at, outcome, recorded_at) VALUES (1, 1, 1, 't', 'e', $1, 'delivered', $1)",
        far,
    )
    assert await db.fetchval("SELECT count(*) FROM delivery_attempts_default") == 1
    kept = await store.keep_attempt_partitions(db, 30 * 86400.0, ahead=12)
    day = far.strftime("%Y%m%d")
    assert f"delivery_attempts_{day}" not in kept.created
    assert f"delivery_attempts_{(far + timedelta(days=1)).strftime('%Y%m%d')}" in kept.created
    # Past retention (negative: the future is past it), the default's rows go.
    kept = await store.keep_attempt_partitions(db, -30 * 86400.0, ahead=0)
    assert kept.purged == 1
    assert await db.fetchval("SELECT count(*) FROM delivery_attempts_default") == 0


async def test_a_receiver_that_fails_twice_then_succeeds_shows_three_attempts(db, receiver, start_worker):
    url = receiver.on("flaky", lambda i: Answer(204) if i >= 2 else Answer(503, headers={"Retry-After": "1"}))
    await add_endpoint(db, "flaky", url)
    await hooklane.publish(db, tenant="acme", type="order.created", data={})
    start_worker(retry=RetryPolicy(base_seconds=0.2, cap_seconds=1.0))
    await wait_for(lambda: db.fetchval("SELECT state = 'delivered' FROM deliveries"), timeout=20)
    rows = await db.fetch(_ATTEMPTS)
    assert [(r["attempt"], r["outcome"], r["status"]) for r in rows] == [
        (1, "retry", 503),
        (2, "retry", 503),
        (3, "delivered", 204),
    ]
    assert [r["retry_after_seconds"] for r in rows] == [1.0, 1.0, None]
    assert all(r["duration_seconds"] > 0 and r["attempted_by"] for r in rows)
    # Each retry started no earlier than the time its attempt before said.
    for before, after in itertools.pairwise(rows):
        assert after["started_at"] >= before["next_attempt_at"] - timedelta(seconds=0.1)


# --------------------------------------------------------------------------
# The read side: what the admin API, the dashboard and the CLI show


async def test_a_delivery_is_shown_with_every_attempt_in_order(db, receiver, start_worker):
    delivery_id = await flaky_history(db, receiver, start_worker)
    detail = await store.delivery_detail(db, delivery_id)
    assert detail is not None
    assert (detail.tenant, detail.namespace, detail.name) == ("acme", "default", "flaky")
    assert (detail.delivery.state, detail.delivery.last_status, detail.delivery.event_id) == (
        "delivered",
        204,
        "evt-flaky",
    )
    assert [(a.attempt, a.outcome, a.status) for a in detail.attempts] == [
        (1, "retry", 503),
        (2, "retry", 500),
        (3, "delivered", 204),
    ]
    assert not detail.attempts_truncated
    assert all(a.delivery_id == delivery_id and a.event_id == "evt-flaky" for a in detail.attempts)
    # Asked through another endpoint, it is not there; through its own, it is.
    assert await store.delivery_detail(db, delivery_id, ("default", "other")) is None
    assert await store.delivery_detail(db, delivery_id, ("default", "flaky")) == detail
    assert await store.delivery_detail(db, delivery_id + 1) is None


async def test_a_delivery_shows_its_first_attempts_when_it_has_too_many(db, monkeypatch):
    row = await _one(db)
    monkeypatch.setattr("hooklane.store.attempts.MAX_ATTEMPTS_SHOWN", 2)
    for attempt in (1, 2, 3):
        await db.execute(
            """INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,
                                              started_at, outcome, status)
               VALUES ($1, $2, $3, 'acme', $4, now(), 'retry', 503)""",
            row.id,
            attempt,
            row.endpoint_id,
            row.event_id,
        )
    detail = await store.delivery_detail(db, row.id)
    assert detail is not None
    assert [a.attempt for a in detail.attempts] == [1, 2]
    assert detail.attempts_truncated


async def test_an_endpoints_attempts_page_newest_first_filtered_by_status_class(db, receiver, start_worker):
    delivery_id = await flaky_history(db, receiver, start_worker)
    now = datetime.now(UTC)
    hour = {"since": now - timedelta(hours=1), "until": now + timedelta(minutes=1)}

    failed = await store.endpoint_attempts(
        db, "default", "flaky", status=store.check_status_filter("5xx"), **hour
    )
    assert failed is not None
    assert [(a.attempt, a.status) for a in failed.attempts] == [(2, 500), (1, 503)]
    assert failed.cursor is None

    one = await store.endpoint_attempts(
        db, "default", "flaky", status=store.check_status_filter("503"), **hour
    )
    assert one is not None and [a.status for a in one.attempts] == [503]

    # Paged one at a time, every attempt once, newest first.
    seen, cursor = [], None
    while True:
        page = await store.endpoint_attempts(db, "default", "flaky", cursor=cursor, limit=1, **hour)
        assert page is not None
        seen += [(a.delivery_id, a.attempt) for a in page.attempts]
        if page.cursor is None:
            break
        cursor = page.cursor
    assert seen == [(delivery_id, 3), (delivery_id, 2), (delivery_id, 1)]

    delivered = await store.endpoint_attempts(db, "default", "flaky", outcomes=["delivered"], **hour)
    assert delivered is not None and [a.attempt for a in delivered.attempts] == [3]
    # Outside the time range: none, but the endpoint is there.
    earlier = await store.endpoint_attempts(
        db, "default", "flaky", since=now - timedelta(days=2), until=now - timedelta(days=1)
    )
    assert earlier is not None and earlier.attempts == []
    assert await store.endpoint_attempts(db, "default", "nobody", **hour) is None


async def test_deliveries_filter_on_their_last_status_and_failure(db):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    for n in range(3):
        await hooklane.publish(db, tenant="acme", type="order.created", data={}, id=f"e{n}")
    rows = await reserve_round(db)
    by_event = {r.event_id: r for r in rows}
    results = [
        store.Result.retry(by_event["e0"].id, 1, retry_in=60.0, status=503, error="HTTP 503"),
        store.Result.retry(
            by_event["e1"].id,
            1,
            retry_in=60.0,
            status=None,
            error="timeout: no response within 5 s",
            failure=store.FailureClass.TIMEOUT,
        ),
        store.Result.delivered(by_event["e2"].id, 1, status=204),
    ]
    await store.complete(db, results, CircuitPolicy(), ALL, "w")

    async def events(**filters):
        page = await store.endpoint_deliveries(db, "default", "a", **filters)
        assert page is not None
        return [(d.event_id, d.last_status, d.last_failure) for d in page.deliveries]

    assert await events(status=store.check_status_filter("5xx")) == [("e0", 503, None)]
    assert await events(status=store.check_status_filter("2xx")) == [("e2", 204, None)]
    assert await events(failure="timeout") == [("e1", None, "timeout")]
    assert len(await events()) == 3


async def test_a_resent_delivery_keeps_its_history_and_forgets_its_last_failure(db):
    row = await _one(db)
    dead = store.Result.dead(
        row.id, row.attempts, status=None, error="timeout", failure=store.FailureClass.TIMEOUT
    )
    await store.complete(db, [dead], CircuitPolicy(), ALL, "w")
    # Days later: the attempt is old, and the resend starts the delivery anew.
    await db.execute("UPDATE delivery_attempts SET recorded_at = recorded_at - interval '3 days'")
    assert await store.resend_dead(db, "default", "a") == 1
    detail = await store.delivery_detail(db, row.id)
    assert detail is not None
    assert (detail.delivery.state, detail.delivery.last_failure, detail.delivery.last_status) == (
        "pending",
        None,
        None,
    )
    assert [(a.attempt, a.outcome, a.failure) for a in detail.attempts] == [(1, "dead", "timeout")]
    page = await store.endpoint_deliveries(db, "default", "a", failure="timeout")
    assert page is not None and page.deliveries == []


async def test_a_rescued_delivery_shows_the_lease_not_the_status_before_it(db):
    row = await _one(db)
    retry = store.Result.retry(row.id, row.attempts, retry_in=0.0, status=503, error="HTTP 503")
    await store.complete(db, [retry], CircuitPolicy(), ALL, "w")
    (again,) = await reserve_round(db)
    await db.execute("UPDATE deliveries SET lease_expires_at = now() - interval '1 second'")
    await store.rescue_expired(db, ALL)
    detail = await store.delivery_detail(db, again.id)
    assert detail is not None
    assert (detail.delivery.last_status, detail.delivery.last_failure) == (None, "lease_expired")
    page = await store.endpoint_deliveries(db, "default", "a", status=store.check_status_filter("5xx"))
    assert page is not None and page.deliveries == []


@pytest.mark.parametrize("text", ["5XX", "600", "50", "5000", "xx5", "٥٠٣", "", " 503"])
def test_a_status_filter_is_a_status_or_a_class(text):
    with pytest.raises(InvalidInput, match="status"):
        store.check_status_filter(text)


def test_a_failure_or_outcome_filter_is_one_of_the_known():
    assert store.check_failure("tls_error") == "tls_error"
    with pytest.raises(InvalidInput, match="failure: must be among timeout"):
        store.check_failure("port closed")
    with pytest.raises(InvalidInput, match="outcome"):
        store.check_outcomes(["sent"])


@pytest.mark.parametrize(
    "cursor",
    # an empty one, garbage, raw text, a time out of range, an attempt past 32 bits
    ["", "x", "a1:1:1:1", "YTE6OTk5OTk5OTk5OTk5OTk5OTk5OToxOjE", "YTE6MToxOjk5OTk5OTk5OTk"],
)
def test_an_attempt_cursor_not_made_by_the_listing_is_refused(cursor):
    with pytest.raises(InvalidInput, match="cursor: is not a cursor this listing returned"):
        store.attempt_position(cursor)


def test_an_attempt_cursor_goes_back_to_its_position():
    position = AttemptPosition(datetime(2026, 12, 3, 14, 3, 7, 123456, tzinfo=UTC), 42, 3)
    assert store.attempt_position(attempt_cursor(position)) == position
