"""Upgrading a database that holds data: version 2 with events and
deliveries in every state, migrated to the head, then delivered from."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane import store
from hooklane.store import deliveries
from hooklane.store.migrations import available
from tests.conftest import SECRET, RunningWorker, Server, wait_for

# Written the way version 2 wrote them: deliveries name their event by id
# only. e-pending is due; e-lost was in flight on a worker that died (its
# lease ran out); e-sent was delivered; e-dead is dead until resent; e-later
# waits for its retry.
VERSION_2_DATA = """
INSERT INTO endpoints (namespace, name, tenant, url, secret, partition)
VALUES ('default', 'a', 'acme', $1, $2, 0), ('default', 'g', 'globex', $1 || '-g', $2, 1);
INSERT INTO events (id, tenant, type, data, fanout) VALUES
    ('e-pending', 'acme', 'order.paid', '{"n": 1}', 1),
    ('e-lost', 'acme', 'order.paid', '{"n": 2}', 1),
    ('e-sent', 'acme', 'order.paid', '{"n": 3}', 1),
    ('e-dead', 'acme', 'order.paid', '{"n": 4}', 1),
    ('e-later', 'globex', 'order.paid', '{"n": 5}', 1),
    ('e-unrouted', 'initech', 'order.paid', '{}', 0);
INSERT INTO deliveries (endpoint_id, event_id, state, attempts, reserved_at, lease_expires_at, next_attempt_at, last_error)
SELECT ep.id, d.event_id, d.state, d.attempts, d.reserved_at, d.lease_expires_at, d.next_attempt_at, d.last_error
FROM (VALUES
    ('a', 'e-pending', 'pending', 0, NULL, NULL, now(), NULL),
    ('a', 'e-lost', 'sending', 1, now() - interval '1 hour', now() - interval '1 minute', now(), NULL),
    ('a', 'e-sent', 'delivered', 1, now(), NULL, now(), NULL),
    ('a', 'e-dead', 'dead', 20, now(), NULL, now(), 'HTTP 500'),
    ('g', 'e-later', 'pending', 3, now(), NULL, now() + interval '1 hour', 'HTTP 503')
) AS d(endpoint, event_id, state, attempts, reserved_at, lease_expires_at, next_attempt_at, last_error)
JOIN endpoints ep ON ep.name = d.endpoint;
INSERT INTO ready_endpoints (endpoint_id, partition, ready_at) SELECT id, partition, now() FROM endpoints;
"""


@pytest.fixture
async def fresh_dsn(pg_server: Server) -> AsyncIterator[str]:
    """An empty database, without the migrated template's schema."""
    name = "hooklane_upgrade_" + uuid.uuid4().hex[:8]
    admin = await asyncpg.connect(
        host=pg_server.host, port=pg_server.port, user=pg_server.user, database="postgres"
    )
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://{pg_server.user}@{pg_server.host}:{pg_server.port}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


async def test_version_2_data_survives_the_upgrade_and_is_delivered(fresh_dsn, settings, receiver):
    url = receiver.url("a")
    conn = await asyncpg.connect(fresh_dsn)
    try:
        assert [m.version for m in await store.migrate(conn, target=2)] == [1, 2]
        await conn.execute(VERSION_2_DATA.replace("$1", f"'{url}'").replace("$2", f"'{SECRET}'"))

        applied = await store.migrate(conn)
        assert [m.version for m in applied] == [m.version for m in available() if m.version > 2]
        assert await store.migrate(conn) == []

        rows = await conn.fetch(
            "SELECT event_tenant, event_id, state, attempts, last_error FROM deliveries ORDER BY event_id"
        )
        assert [tuple(r) for r in rows] == [
            ("acme", "e-dead", "dead", 20, "HTTP 500"),
            ("globex", "e-later", "pending", 3, "HTTP 503"),
            ("acme", "e-lost", "sending", 1, None),
            ("acme", "e-pending", "pending", 0, None),
            ("acme", "e-sent", "delivered", 1, None),
        ]
        assert await conn.fetchval("SELECT count(*) FROM events") == 6
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM endpoints WHERE previous_secret IS NULL AND secret = $1", SECRET
            )
            == 2
        )
        # The new identity: another tenant may now use an id, and the
        # deliveries follow their own event only.
        await hooklane.publish(conn, tenant="globex", type="order.paid", data={"n": 6}, id="e-pending")
        await conn.execute("DELETE FROM events WHERE tenant = 'globex' AND id = 'e-pending'")
        assert await conn.fetchval("SELECT count(*) FROM deliveries WHERE event_id = 'e-pending'") == 1

        worker = RunningWorker(replace(settings, database_url=fresh_dsn))
        try:
            # the pending one, and the one a dead worker lost (rescued)
            await wait_for(lambda: len(receiver.at("a")) == 2)
            assert await deliveries.resend_dead(conn, "default", "a") == 1
            await wait_for(lambda: len(receiver.at("a")) == 3)
        finally:
            await worker.stop()
        got = sorted(Webhook(SECRET).verify(r.body, r.headers)["id"] for r in receiver.at("a"))
        assert got == ["e-dead", "e-lost", "e-pending"]
        assert (
            await conn.fetchval("SELECT state FROM deliveries WHERE event_id = 'e-later'") == "pending"
        )  # not due yet, untouched
    finally:
        await conn.close()
