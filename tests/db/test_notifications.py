"""Operational notifications (hooklane/worker/notifications.py): an
endpoint's circuit opening, its deactivation and its dead deliveries are
published to the notifications tenant and delivered, signed, by the
workers; once per transition, at most once per kind and interval per
endpoint, never about the notifications tenant's own endpoints, and once
whichever number of passes run at once.

The passes run by a real worker's maintenance where the test is about the
whole path; elsewhere the test runs them itself (``Notifications.run_once``)
beside a worker that delivers, so that it knows when one has run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane import store
from hooklane.policies import CircuitPolicy, RetryPolicy
from hooklane.settings import Settings
from hooklane.worker import notifications
from hooklane.worker.notifications import Notifications, Notified
from testsupport.fixtures import ALL_PARTITIONS, SECRET, add_endpoint, reserve_round, wait_for
from testsupport.notifications import OPS
from testsupport.receivers import Answer, Receiver

# Retries at once, and a circuit that opens at the second failure and stays
# open (a probe would renew it) for longer than any test.
QUICK_RETRY = RetryPolicy(base_seconds=0.1, cap_seconds=0.2)
OPENS_AT_TWO = CircuitPolicy(threshold=2, step_seconds=600, cap_seconds=600)


@pytest.fixture(autouse=True)
def settle_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass's window ends a fifth of a second ago rather than a minute:
    the margin for late commits, which a test's single worker does not
    need, would otherwise hold each dead-deliveries notice for a minute."""
    monkeypatch.setattr(notifications, "SETTLE_SECONDS", 0.2)


async def _inbox(db: asyncpg.Connection, receiver: Receiver) -> int:
    """The notifications tenant's endpoint, receiving every notice."""
    return await add_endpoint(
        db, "inbox", receiver.on("inbox", Answer(204)), tenant=OPS, event_types=("hooklane.endpoint.*",)
    )


async def _notices(db: asyncpg.Connection, type: str | None = None) -> list[dict]:
    """The notices stored for the notifications tenant, oldest first."""
    rows = await db.fetch(
        "SELECT id, type, data::text FROM events WHERE tenant = $1 AND type LIKE 'hooklane.endpoint.%'"
        " AND ($2::text IS NULL OR type = $2)"
        " ORDER BY created_at, id",
        OPS,
        type,
    )
    return [{"id": r["id"], "type": r["type"], "data": json.loads(r["data"])} for r in rows]


def _micros(at: datetime) -> int:
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _signed(receiver: Receiver, path: str) -> list[dict]:
    """What ``path`` received, each verified with the endpoint's secret."""
    return [Webhook(SECRET).verify(r.body, r.headers) for r in receiver.at(path)]


def _switch(failing: list[bool]) -> Callable[[int], Answer]:
    """A receiver that answers 503 while ``failing[0]``, else 204."""
    return lambda _i: Answer(503) if failing[0] else Answer(204)


async def _pass_until(
    db: asyncpg.Connection, notifier: Notifications, done: Callable[[Notified], bool]
) -> Notified:
    """Run passes until one's result satisfies ``done``; that one's."""
    seen: list[Notified] = []

    async def one() -> bool:
        notified = await notifier.run_once(db)
        assert notified is not None
        seen.append(notified)
        return done(notified)

    await wait_for(one, timeout=30, interval=0.1)
    return seen[-1]


def _notifier(settings: Settings, **overrides: object) -> Notifications:
    return Notifications(replace(settings, notifications_tenant=OPS, **overrides))


async def _last_dead(db: asyncpg.Connection) -> datetime:
    return await db.fetchval("SELECT max(recorded_at) FROM delivery_attempts WHERE outcome = 'dead'")


async def _past(db: asyncpg.Connection, notifier: Notifications, when: datetime) -> Notified:
    """Run passes until one's window ends after ``when``: it has seen, and
    counted, everything recorded until then."""
    return await _pass_until(db, notifier, lambda n: n.noted.cut > when)


async def _interval_ends(db: asyncpg.Connection) -> None:
    """The hour since each last notice passes, moved back rather than
    waited for."""
    await db.execute(
        "UPDATE endpoint_notices SET notified_at = notified_at - interval '1 hour',"
        " due_at = due_at - interval '1 hour'"
    )


# --- end to end: a worker's maintenance publishes, a worker delivers ----------


async def test_a_circuit_that_opens_is_told_signed_to_the_notifications_tenant(db, receiver, start_worker):
    await _inbox(db, receiver)
    orders = await add_endpoint(db, "orders", receiver.on("orders", Answer(503)))
    for n in range(2):
        await hooklane.publish(db, tenant="acme", type="order.created", data={"n": n})
    start_worker(notifications_tenant=OPS, circuit=OPENS_AT_TWO, retry=QUICK_RETRY)

    await wait_for(lambda: receiver.at("inbox"), timeout=30)
    got = receiver.at("inbox")[0]
    payload = Webhook(SECRET).verify(got.body, got.headers)
    failing_since, paused_until = await db.fetchrow(
        "SELECT failing_since, paused_until FROM endpoints WHERE id = $1", orders
    )
    assert payload["type"] == "hooklane.endpoint.paused"
    assert got.headers["webhook-id"] == f"hooklane.endpoint.paused.{orders}.{_micros(failing_since)}"
    data = payload["data"]
    assert data["endpoint"] == {"namespace": "default", "name": "orders"}
    assert data["tenant"] == "acme"
    assert "503" in data["reason"]
    assert data["consecutive_failures"] >= 2 and data["openings"] == 1
    assert datetime.fromisoformat(data["failing_since"]) == failing_since
    assert datetime.fromisoformat(data["paused_until"]) <= paused_until


async def test_an_endpoint_deactivated_by_maintenance_is_told(db, receiver, start_worker):
    await _inbox(db, receiver)
    orders = await add_endpoint(db, "orders", receiver.on("orders", Answer(503)))
    await hooklane.publish(db, tenant="acme", type="order.created", data={})
    start_worker(notifications_tenant=OPS, deactivate_after_seconds=1.0, retry=QUICK_RETRY)

    def deactivations() -> list[dict]:
        return [p for p in _signed(receiver, "inbox") if p["type"] == "hooklane.endpoint.deactivated"]

    await wait_for(deactivations, timeout=30)
    (payload,) = deactivations()
    deactivated_at, reason = await db.fetchrow(
        "SELECT deactivated_at, deactivated_reason FROM endpoints WHERE id = $1", orders
    )
    assert payload["id"] == f"hooklane.endpoint.deactivated.{orders}.{_micros(deactivated_at)}"
    data = payload["data"]
    assert data["endpoint"] == {"namespace": "default", "name": "orders"}
    assert (data["tenant"], data["reason"], data["deactivations"]) == ("acme", reason, 1)
    assert reason.startswith("failing since") and "503" in data["last_error"]
    assert datetime.fromisoformat(data["deactivated_at"]) == deactivated_at


async def test_nothing_is_published_without_a_notifications_tenant(db, receiver, settings, start_worker):
    await _inbox(db, receiver)
    orders = await add_endpoint(db, "orders", receiver.on("orders", Answer(503)))
    for n in range(2):
        await hooklane.publish(db, tenant="acme", type="order.created", data={"n": n})
    start_worker(circuit=OPENS_AT_TWO, deactivate_after_seconds=1.0, retry=QUICK_RETRY)
    # Its circuit opens, then maintenance deactivates it: a pass of the
    # housekeeper ran after the opening, and would have told both.
    await wait_for(
        lambda: db.fetchval(
            "SELECT state = 'deactivated' AND paused_until IS NOT NULL FROM endpoints WHERE id = $1", orders
        ),
        timeout=30,
    )
    assert await Notifications(settings).run_once(db) is None
    assert await db.fetchval("SELECT count(*) FROM events WHERE type LIKE 'hooklane.%'") == 0
    assert await db.fetchval("SELECT count(*) FROM endpoint_notices") == 0
    assert receiver.at("inbox") == []


# --- rate limits, counts and loops: passes run by the test ---------------------


async def test_dead_deliveries_are_counted_and_those_within_the_interval_go_in_the_next_notice(
    db, receiver, settings, start_worker
):
    await _inbox(db, receiver)
    orders = await add_endpoint(db, "orders", receiver.on("orders", Answer(503)))
    start_worker(retry=RetryPolicy(max_attempts=1))
    notifier = _notifier(settings)

    async def dead(count: int) -> bool:
        return await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'dead'") == count

    await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="e1")
    await wait_for(lambda: dead(1), timeout=30)
    first = await _pass_until(db, notifier, lambda n: bool(n.published))
    assert first.published[0].startswith(f"hooklane.endpoint.deliveries_dead.{orders}.")

    # Two more within the interval: noted, due when it ends, not told.
    for n in (2, 3):
        await hooklane.publish(db, tenant="acme", type="order.created", data={}, id=f"e{n}")
    await wait_for(lambda: dead(3), timeout=30)
    held = await _past(db, notifier, await _last_dead(db))
    assert held.published == ()
    assert await db.fetchval("SELECT due_at > now() + interval '50 minutes' FROM endpoint_notices")
    assert len(await _notices(db)) == 1

    await _interval_ends(db)
    second = await _pass_until(db, notifier, lambda n: bool(n.published))
    assert len(second.published) == 1
    told = await _notices(db, "hooklane.endpoint.deliveries_dead")
    assert [n["data"]["dead"] for n in told] == [1, 2]
    assert told[0]["data"]["until"] == told[1]["data"]["from"]
    assert told[1]["data"]["reason"] == "HTTP 503; gave up after 1 attempts"
    assert told[1]["data"]["status"] == 503
    await wait_for(lambda: len(receiver.at("inbox")) == 2, timeout=30)
    assert [p["data"]["dead"] for p in _signed(receiver, "inbox")] == [1, 2]


async def test_a_circuit_opening_again_within_the_interval_is_not_told_the_next_after_it_is(
    db, receiver, settings, start_worker
):
    await _inbox(db, receiver)
    failing = [True]
    orders = await add_endpoint(db, "orders", receiver.on("orders", _switch(failing)))
    start_worker(circuit=replace(OPENS_AT_TWO, step_seconds=0.2, cap_seconds=0.2), retry=QUICK_RETRY)
    notifier = _notifier(settings)
    published = 0

    async def episode() -> datetime:
        """Fail until the circuit opens; its failing episode."""
        nonlocal published
        failing[0] = True
        for _n in range(2):
            published += 1
            await hooklane.publish(db, tenant="acme", type="order.created", data={}, id=f"e{published}")
        return await wait_for(
            lambda: db.fetchval(
                "SELECT failing_since FROM endpoints WHERE id = $1 AND paused_until IS NOT NULL", orders
            ),
            timeout=30,
        )

    async def close() -> None:
        failing[0] = False
        await wait_for(
            lambda: db.fetchval(
                "SELECT failing_since IS NULL AND paused_until IS NULL FROM endpoints WHERE id = $1", orders
            ),
            timeout=30,
        )

    first = await episode()
    told = await _pass_until(db, notifier, lambda n: bool(n.published))
    assert told.published == (f"hooklane.endpoint.paused.{orders}.{_micros(first)}",)
    await close()

    second = await episode()
    held = await _pass_until(db, notifier, lambda n: n.noted.paused == 1)
    assert held.published == ()
    assert await db.fetchval("SELECT seen FROM endpoint_notices WHERE kind = 'paused'") == second
    assert len(await _notices(db)) == 1
    await close()

    # The interval ends while the circuit is closed: nothing to tell now.
    await _interval_ends(db)
    await _pass_until(db, notifier, lambda _n: True)
    assert await db.fetchval("SELECT due_at FROM endpoint_notices") is None
    assert len(await _notices(db)) == 1

    third = await episode()
    told = await _pass_until(db, notifier, lambda n: bool(n.published))
    assert told.published == (f"hooklane.endpoint.paused.{orders}.{_micros(third)}",)
    (_, last) = await _notices(db)
    # Both openings since the first notice: the one held, and this one.
    assert last["data"]["openings"] == 2


async def test_an_opening_held_by_the_interval_is_told_when_it_ends_if_still_open(db, settings):
    orders = await add_endpoint(db, "orders", "http://127.0.0.1:1/orders")
    notifier = _notifier(settings)

    async def opens(ago: timedelta) -> None:
        await db.execute(
            "UPDATE endpoints SET failing_since = now() - $1::interval, consecutive_failures = 20,"
            " paused_until = now() + interval '1 hour', last_error = 'HTTP 503' WHERE id = $2",
            ago,
            orders,
        )

    await opens(timedelta(minutes=10))
    assert len((await notifier.run_once(db)).published) == 1
    await opens(timedelta(minutes=1))  # another episode: closed and opened since
    assert (await notifier.run_once(db)).published == ()
    await _interval_ends(db)
    later = await notifier.run_once(db)
    seen = await db.fetchval("SELECT failing_since FROM endpoints WHERE id = $1", orders)
    assert later.published == (f"hooklane.endpoint.paused.{orders}.{_micros(seen)}",)


async def test_the_notifications_tenants_own_endpoints_never_notify(db, receiver, settings, start_worker):
    await _inbox(db, receiver)
    broken = await add_endpoint(
        db, "broken", receiver.on("broken", Answer(503)), tenant=OPS, event_types=("ops.*",)
    )
    orders = await add_endpoint(db, "orders", receiver.on("orders", Answer(503)))
    for n in range(2):
        await hooklane.publish(db, tenant=OPS, type="ops.report", data={"n": n})
        await hooklane.publish(db, tenant="acme", type="order.created", data={"n": n})
    # Every failure is a dead delivery, and the second opens the circuit.
    start_worker(circuit=OPENS_AT_TWO, retry=RetryPolicy(max_attempts=1))
    await wait_for(
        lambda: db.fetchval(
            "SELECT count(*) = 2 FROM endpoints WHERE paused_until IS NOT NULL AND id = ANY($1)",
            [broken, orders],
        ),
        timeout=30,
    )
    await wait_for(
        lambda: db.fetchval("SELECT count(*) = 4 FROM deliveries WHERE state = 'dead'"), timeout=30
    )
    notifier = _notifier(settings)
    await _past(db, notifier, await _last_dead(db))
    notices = await _notices(db)
    assert sorted(n["type"] for n in notices) == [
        "hooklane.endpoint.deliveries_dead",
        "hooklane.endpoint.paused",
    ]
    assert {n["data"]["endpoint"]["name"] for n in notices} == {"orders"}
    assert [n["data"]["dead"] for n in notices if n["type"].endswith("dead")] == [2]
    assert await db.fetchval("SELECT count(*) FROM endpoint_notices WHERE endpoint_id = $1", broken) == 0
    await wait_for(lambda: len(receiver.at("inbox")) == 2, timeout=30)


# --- passes at once ------------------------------------------------------------


async def test_passes_at_once_publish_each_notice_once(db, dsn, settings):
    """Twenty endpoints whose deliveries die at once, through complete:
    each circuit opens (a threshold of one), and every fifth is deactivated
    by a 410. Four passes run at once, until nothing is left."""
    await add_endpoint(db, "inbox", "http://127.0.0.1:1/inbox", tenant=OPS)
    ids = [await add_endpoint(db, f"ep-{i:02d}", f"http://127.0.0.1:1/{i}") for i in range(20)]
    await hooklane.publish(db, tenant="acme", type="order.created", data={})
    rows = await reserve_round(db)
    assert len(rows) == 20
    by_endpoint = {r.endpoint_id: r for r in rows}
    results = [
        store.Result.dead(
            by_endpoint[e].id,
            1,
            status=410 if n % 5 == 0 else 503,
            error="HTTP 410" if n % 5 == 0 else "HTTP 503",
        )
        for n, e in enumerate(ids)
    ]
    await store.complete(db, results, CircuitPolicy(threshold=1), ALL_PARTITIONS, "w")
    # Past the settle margin, so that every pass counts all of them.
    await wait_for(
        lambda: db.fetchval(
            "SELECT now() - interval '0.2 s' > max(recorded_at) FROM delivery_attempts WHERE outcome = 'dead'"
        )
    )
    connections = [await store.connect(dsn) for _ in range(4)]
    try:
        notifiers = [_notifier(settings) for _ in connections]
        published: list[str] = []
        while True:
            runs = await asyncio.gather(*(n.run_once(c) for n, c in zip(notifiers, connections, strict=True)))
            batch = [i for r in runs for i in r.published]
            if not batch:
                break
            published += batch
    finally:
        for c in connections:
            await c.close()
    notices = await _notices(db)
    assert len(published) == len(set(published)) == len(notices) == 20 + 20 + 4
    assert sorted(published) == sorted(n["id"] for n in notices)
    assert sum(n["data"]["dead"] for n in notices if n["type"].endswith("dead")) == 20

    # Taken again (as a pass that lost its claim would): the same ids, and
    # the publish function stores nothing more.
    await db.execute(
        "UPDATE endpoint_notices SET due_at = now(), transitions = 1 WHERE kind <> 'deliveries_dead'"
    )
    again = await _notifier(settings).run_once(db)
    assert again.published == ()
    assert len(await _notices(db)) == 44


# --- the pure parts -----------------------------------------------------------
