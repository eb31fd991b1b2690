"""Ordering keys come and go: an idle key is forgotten after the events'
retention, unless a delivery of it is still kept, and comes back
numbered from 1."""

from __future__ import annotations

import asyncpg

from hooklane import store
from testsupport.fixtures import add_endpoint

PUBLISH = "SELECT stored FROM hooklane_try_publish_v3('acme', 'order.paid', '{}', $1, NULL, NULL, $2)"


async def _age_keys(db: asyncpg.Connection, days: int) -> None:
    await db.execute("UPDATE ordering_keys SET touched_at = now() - make_interval(days => $1)", days)


async def test_an_idle_key_is_forgotten_and_numbered_from_one_again(db):
    await add_endpoint(db, "orders", "http://127.0.0.1:9/orders")
    for i in range(3):
        assert await db.fetchval(PUBLISH, f"e-{i}", "order-7")
    # Settled, and its deliveries gone with their events' retention.
    await db.execute("UPDATE deliveries SET state = 'delivered'")
    await db.execute("UPDATE ordering_keys SET head_seq = NULL")
    await db.execute("DELETE FROM events")
    await _age_keys(db, 2)
    assert await store.purge_ordering_keys(db, retention_seconds=86400) == 1
    assert await db.fetchval("SELECT count(*) FROM ordering_keys") == 0
    assert await db.fetchval(PUBLISH, "e-9", "order-7")
    assert await db.fetch("SELECT ordering_seq, next_attempt_at < 'infinity' AS due FROM deliveries") == [
        (1, True)
    ]


async def test_a_key_is_kept_while_busy_recent_or_with_a_delivery_left(db):
    await add_endpoint(db, "orders", "http://127.0.0.1:9/orders")
    for key in ("busy", "dead", "recent"):
        assert await db.fetchval(PUBLISH, f"e-{key}", key)
    # 'dead': its head died and was skipped; the dead delivery is kept
    # (until resent or discarded), and so is its number.
    await db.execute(
        "UPDATE deliveries SET state = 'dead' WHERE ordering_key = 'dead';"
        "UPDATE ordering_keys SET head_seq = NULL WHERE key IN ('dead', 'recent')"
    )
    await _age_keys(db, 2)
    await db.execute("UPDATE ordering_keys SET touched_at = now() WHERE key = 'recent'")
    assert await store.purge_ordering_keys(db, retention_seconds=86400) == 0
    assert await db.fetchval("SELECT array_agg(key ORDER BY key) FROM ordering_keys") == [
        "busy",
        "dead",
        "recent",
    ]
    # The kept one moved to the back: the next batches reach the keys behind it.
    assert await db.fetchval(
        "SELECT touched_at > now() - interval '1 minute' FROM ordering_keys WHERE key = 'dead'"
    )
