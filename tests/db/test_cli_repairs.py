"""The store's replay behind ``hooklane endpoint replay``, on a real
Postgres: whatever the page size, it replays the same events. The command
as a process: tests/processes/test_cli_repairs.py."""

from __future__ import annotations

from datetime import UTC, datetime

import hooklane
from hooklane import store
from testsupport.cli_repairs import published_while_a_was_deactivated


async def test_replay_pages_through_the_range(db):
    since = datetime.fromisoformat(await published_while_a_was_deactivated(db, "http://127.0.0.1:9/a"))
    for n in range(5):
        await hooklane.publish(db, tenant="acme", type="order.updated", data={"n": n})
    # whatever the page size, the same 7: o1, o2 and the five updates (their
    # deliveries from the fan-out deleted), never i1 nor g1
    for page in (1, 2, 3):
        await db.execute("DELETE FROM deliveries WHERE state = 'pending'")
        assert await store.replay_since(db, "default", "a", since, page=page) == 7, page
        replayed = await db.fetchval("SELECT array_agg(event_id ORDER BY id) FROM deliveries")
        assert replayed[:2] == ["o1", "o2"] and len(set(replayed)) == 7
    assert await store.replay_since(db, "default", "a", datetime.now(UTC)) == 0
    assert await store.replay_since(db, "default", "missing", since) is None
