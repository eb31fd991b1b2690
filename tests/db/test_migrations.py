"""Upgrading a database that holds data, from version 1 through every later
migration, then delivering from it; and a worker of the previous release
still working against the new schema. `hooklane migrate` run concurrently:
tests/processes/test_migrations.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import asyncpg
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane import store
from hooklane.policies import CircuitPolicy
from testsupport.fixtures import SECRET, RunningWorker, add_endpoint, reserve_round, wait_for
from testsupport.migrations import AFTER_NEXT_RELEASE

ALL = list(range(32))

# Written the way version 1 wrote them: events named by id alone, deliveries
# without their event's tenant, no ready index. On partition 0, endpoint a:
# e-pending is due; e-lost was in flight on a worker that died (its lease ran
# out); e-sent was delivered; e-dead is dead until resent. On partition 1,
# endpoint g: e-later waits for its retry. On partition 7, endpoint q has
# only finished deliveries, so nothing to make ready.
VERSION_1_DATA = """
INSERT INTO endpoints (namespace, name, tenant, url, secret, partition) VALUES
    ('default', 'a', 'acme', $1, $2, 0),
    ('default', 'g', 'globex', $1 || '-g', $2, 1),
    ('default', 'q', 'acme', $1 || '-q', $2, 7);
INSERT INTO events (id, tenant, type, data, fanout) VALUES
    ('e-pending', 'acme', 'order.paid', '{"n": 1}', 1),
    ('e-lost', 'acme', 'order.paid', '{"n": 2}', 1),
    ('e-sent', 'acme', 'order.paid', '{"n": 3}', 1),
    ('e-dead', 'acme', 'order.paid', '{"n": 4}', 1),
    ('e-later', 'globex', 'order.paid', '{"n": 5}', 1),
    ('e-q-sent', 'acme', 'order.paid', '{"n": 6}', 1),
    ('e-q-dead', 'acme', 'order.paid', '{"n": 7}', 1),
    ('e-unrouted', 'initech', 'order.paid', '{}', 0);
INSERT INTO deliveries (endpoint_id, event_id, state, attempts, reserved_at, lease_expires_at, next_attempt_at, last_error)
SELECT ep.id, d.event_id, d.state, d.attempts, d.reserved_at, d.lease_expires_at, d.next_attempt_at, d.last_error
FROM (VALUES
    ('a', 'e-pending', 'pending', 0, NULL, NULL, now(), NULL),
    ('a', 'e-lost', 'sending', 1, now() - interval '1 hour', now() - interval '1 minute', now(), NULL),
    ('a', 'e-sent', 'delivered', 1, now(), NULL, now(), NULL),
    ('a', 'e-dead', 'dead', 20, now(), NULL, now(), 'HTTP 500'),
    ('g', 'e-later', 'pending', 3, now(), NULL, now() + interval '1 hour', 'HTTP 503'),
    ('q', 'e-q-sent', 'delivered', 1, now(), NULL, now(), NULL),
    ('q', 'e-q-dead', 'dead', 20, now(), NULL, now(), 'HTTP 500')
) AS d(endpoint, event_id, state, attempts, reserved_at, lease_expires_at, next_attempt_at, last_error)
JOIN endpoints ep ON ep.name = d.endpoint;
"""


async def test_version_1_data_survives_every_migration_and_is_delivered(fresh_dsn, settings, receiver):
    url = receiver.url("a")
    conn = await asyncpg.connect(fresh_dsn)
    try:
        assert [m.version for m in await store.migrate(conn, target=1)] == [1]
        await conn.execute(VERSION_1_DATA.replace("$1", f"'{url}'").replace("$2", f"'{SECRET}'"))

        # 0002: the endpoints with pending or in-flight deliveries are ready,
        # in their own partitions; q, with nothing left to send, is not.
        assert [m.version for m in await store.migrate(conn, target=2)] == [2]
        ready = await conn.fetch(
            "SELECT ep.name, r.partition, r.ready_at <= now() AS now"
            " FROM ready_endpoints r JOIN endpoints ep ON ep.id = r.endpoint_id ORDER BY ep.name"
        )
        assert [tuple(r) for r in ready] == [("a", 0, True), ("g", 1, True)]

        applied = await store.migrate(conn)
        assert [m.version for m in applied] == [
            m.version for m in store.available_migrations() if m.version > 2
        ]
        assert await store.migrate(conn) == []

        # 0003: each delivery names its event's tenant; events are (tenant, id)
        rows = await conn.fetch(
            "SELECT event_tenant, event_id, state, attempts, last_error, attempted_by"
            " FROM deliveries ORDER BY event_id"
        )
        assert [tuple(r) for r in rows] == [
            ("acme", "e-dead", "dead", 20, "HTTP 500", None),
            ("globex", "e-later", "pending", 3, "HTTP 503", None),
            ("acme", "e-lost", "sending", 1, None, None),
            ("acme", "e-pending", "pending", 0, None, None),
            ("acme", "e-q-dead", "dead", 20, "HTTP 500", None),
            ("acme", "e-q-sent", "delivered", 1, None, None),
            ("acme", "e-sent", "delivered", 1, None, None),
        ]
        keys = dict(
            await conn.fetch(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conname IN ('events_pkey', 'deliveries_event_fkey')"
            )
        )
        assert keys == {
            "events_pkey": "PRIMARY KEY (tenant, id)",
            "deliveries_event_fkey": "FOREIGN KEY (event_tenant, event_id) REFERENCES events(tenant, id) "
            "ON DELETE CASCADE",
        }
        assert await conn.fetchval("SELECT count(*) FROM events") == 8
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM endpoints WHERE previous_secret IS NULL AND secret = $1", SECRET
            )
            == 3
        )
        # 0005: events stored before it are listed first, in id order, and
        # those stored after it follow them
        assert await conn.fetchval("SELECT array_agg(DISTINCT xact::text) FROM events") == ["1"]
        await hooklane.publish(conn, tenant="acme", type="order.paid", data={}, id="a-after-0005")
        since = await conn.fetchval("SELECT now() - interval '1 hour'")
        listed = await store.list_events(conn, "acme", since)
        assert [e.id for e in listed.events] == [
            "e-dead",
            "e-lost",
            "e-pending",
            "e-q-dead",
            "e-q-sent",
            "e-sent",
            "a-after-0005",
        ]
        await conn.execute("DELETE FROM events WHERE id = 'a-after-0005'")
        # The new identity: another tenant may now use an id, and the
        # deliveries follow their own event only.
        await hooklane.publish(conn, tenant="globex", type="order.paid", data={"n": 6}, id="e-pending")
        await conn.execute("DELETE FROM events WHERE tenant = 'globex' AND id = 'e-pending'")
        assert await conn.fetchval("SELECT count(*) FROM deliveries WHERE event_id = 'e-pending'") == 1

        worker = RunningWorker(replace(settings, database_url=fresh_dsn, worker_id="upgraded"))
        try:
            # the pending one, and the one a dead worker lost (rescued)
            await wait_for(lambda: len(receiver.at("a")) == 2)
            assert await store.resend_dead(conn, "default", "a") == 1
            await wait_for(lambda: len(receiver.at("a")) == 3)
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT count(*) = 3 FROM deliveries"
                    " WHERE state = 'delivered' AND attempted_by = 'upgraded'"
                )
            )
        finally:
            await worker.stop()
        got = sorted(Webhook(SECRET).verify(r.body, r.headers)["id"] for r in receiver.at("a"))
        assert got == ["e-dead", "e-lost", "e-pending"]
        assert (
            await conn.fetchval("SELECT state FROM deliveries WHERE event_id = 'e-later'") == "pending"
        )  # not due yet, untouched
        assert receiver.at("a-q") == []
    finally:
        await conn.close()


# The statements a worker of the 0.1.0 release runs (tests/db/release_0_1_0.sql).
RELEASE_0_1_0 = store.parse_queries((Path(__file__).parent / "release_0_1_0.sql").read_text())


async def test_a_worker_of_the_previous_release_keeps_working_after_the_upgrade(db):
    circuit = CircuitPolicy()
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=2)
    for n in range(3):
        await hooklane.publish(db, tenant="acme", type="t", data={"n": n})

    # A publish of this release writes no wakeup row: the old worker finds
    # the endpoint by its sweep, which it runs every minute.
    assert await db.fetch(RELEASE_0_1_0["reserve"], ALL, 10, 10.0) == []
    assert len(await db.fetch(RELEASE_0_1_0["sweep_ready"], ALL)) == 1
    # It reserves through hooklane_reserve (3 arguments): its rows carry no
    # worker name, and the limit holds for both versions.
    old = await db.fetch(RELEASE_0_1_0["reserve"], ALL, 10, 10.0)
    assert len(old) == 2
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE attempted_by IS NOT NULL") == 0
    assert await reserve_round(db, 10, worker="new") == []

    # It records one success and one failure to retry at once with its own
    # complete, which frees both slots for whoever owns the partition next.
    first, second = sorted(old, key=lambda r: r["id"])
    touched = await db.fetch(
        RELEASE_0_1_0["complete"],
        [first["id"], second["id"]],
        [first["attempts"], second["attempts"]],
        ["delivered", "retry"],
        [None, 0.0],
        [200, 500],
        [None, "HTTP 500"],
        circuit.threshold,
        circuit.step_seconds,
        circuit.cap_seconds,
    )
    assert [r["name"] for r in touched] == ["a"]

    new = await reserve_round(db, 10, worker="new")
    third = await db.fetchval("SELECT max(id) FROM deliveries")
    assert sorted(r.id for r in new) == [second["id"], third]
    await store.complete(
        db, [store.Result(r.id, r.attempts, "delivered", None, 200, None) for r in new], circuit, ALL
    )
    rows = await db.fetch("SELECT id, state, attempts, attempted_by FROM deliveries ORDER BY id")
    assert [tuple(r) for r in rows] == [
        (first["id"], "delivered", 1, None),
        (second["id"], "delivered", 2, "new"),
        (third, "delivered", 1, "new"),
    ]


async def test_each_drop_after_the_next_release_applies_to_a_migrated_database(db):
    for path in sorted(AFTER_NEXT_RELEASE.iterdir()):
        tx = db.transaction()
        await tx.start()
        try:
            await db.execute(path.read_text())
        finally:
            await tx.rollback()
