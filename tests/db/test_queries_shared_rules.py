"""The rules migration 0008 writes once as functions give the answers of
the released functions that still spell them out (CONTRIBUTING.md,
"Changing SQL functions"): the next versions of those call the helpers, so
they must agree on every case.

The tenant-change discard is covered by behaviour as well:
tests/db/test_tenancy.py expects one message from upsert_endpoint (which calls
hooklane_tenant_discard) and from the reservation (hooklane_reserve_v2,
which spells it out)."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import asyncpg

# Which endpoints are deliverable (hooklane_deliverable): one of each way
# not to be, as (paused by hand, state, signed).
KINDS = {
    "deliverable": (False, "active", True),
    "paused": (True, "active", True),
    "deactivated": (False, "deactivated", True),
    "unsigned": (False, "active", False),
}
# The circuit's pause, and the earliest pending delivery, relative to now.
HOUR = timedelta(hours=1)
PAUSES = [None, -HOUR, HOUR, 3 * HOUR]
HEADS = [None, -2 * HOUR, 2 * HOUR]


async def _endpoint(
    db: asyncpg.Connection, name: str, kind: str, pause: timedelta | None, head: timedelta | None
) -> int:
    paused, state, signed = KINDS[kind]
    endpoint_id = await db.fetchval(
        """INSERT INTO endpoints (namespace, name, tenant, url, secret, paused, state, partition,
                                  max_concurrency, paused_until)
           VALUES ('default', $1, 'acme', 'http://127.0.0.1:1/', $2, $3, $4, 0, 1, now() + $5::interval)
           RETURNING id""",
        name,
        "whsec_c2VjcmV0" if signed else None,
        paused,
        state,
        pause,
    )
    if head is not None:
        # the head, and a later one that must not count
        await db.execute(
            """INSERT INTO deliveries (endpoint_id, event_tenant, event_id, next_attempt_at)
               SELECT $1, 'acme', 'e', now() + $2::interval + later
               FROM unnest(ARRAY[interval '0', interval '1 hour']) AS later""",
            endpoint_id,
            head,
        )
    return endpoint_id


async def _sending(db: asyncpg.Connection, endpoint_id: int) -> None:
    await db.execute(
        "INSERT INTO deliveries (endpoint_id, event_tenant, event_id, state, attempts)"
        " VALUES ($1, 'acme', 'e', 'sending', 1)",
        endpoint_id,
    )


# The helper's answer for each endpoint, from its row and deliveries as
# they are now; `slots_taken` as the reservation counts them.
HELPER = """
    SELECT c.id,
           hooklane_ready_at(ep.id IS NOT NULL AND hooklane_deliverable(ep), ep.paused_until, h.head,
                             $2 AND f.n >= ep.max_concurrency) AS ready_at
    FROM unnest($1::bigint[]) AS c(id)
    LEFT JOIN endpoints ep ON ep.id = c.id
    CROSS JOIN LATERAL (SELECT min(d.next_attempt_at) AS head FROM deliveries d
                        WHERE d.endpoint_id = c.id AND d.state = 'pending') h
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM deliveries d
                        WHERE d.endpoint_id = c.id AND d.state = 'sending') f
"""


async def _branches(db: asyncpg.Connection, decided: dict[int, datetime | None]) -> set[str]:
    """Which of the rule's answers the cases reached: a comparison that
    never reached one proves nothing about it."""
    return {
        r[0]
        for r in await db.fetch(
            """SELECT CASE WHEN at IS NULL THEN 'never' WHEN at = 'infinity' THEN 'infinity'
                           WHEN at = now() THEN 'now' ELSE 'later' END
               FROM unnest($1::timestamptz[]) AS at""",
            list(decided.values()),
        )
    }


async def _ready(db: asyncpg.Connection, ids: list[int]) -> dict[int, datetime | None]:
    rows = await db.fetch("SELECT endpoint_id, ready_at FROM ready_endpoints")
    found = {r["endpoint_id"]: r["ready_at"] for r in rows}
    return {i: found.get(i) for i in ids}


async def test_ready_at_is_what_the_reservations_rerate_decides(db):
    await db.execute("INSERT INTO events (id, tenant, type, data, fanout) VALUES ('e', 'acme', 't', '{}', 0)")
    async with db.transaction():  # one now() for the whole comparison
        ids = []
        cases = itertools.product(KINDS, PAUSES, HEADS, [False, True])
        for n, (kind, pause, head, full) in enumerate(cases):
            endpoint_id = await _endpoint(db, f"ep-{n}", kind, pause, head)
            if full:
                await _sending(db, endpoint_id)
            ids.append(endpoint_id)
        ids.append(max(ids) + 1000)  # a candidate whose endpoint is gone
        await db.execute(
            "INSERT INTO ready_endpoints (endpoint_id, partition, ready_at) SELECT id, 0, now() FROM unnest($1::bigint[]) id",
            ids,
        )
        expected = {r["id"]: r["ready_at"] for r in await db.fetch(HELPER, ids, True)}
        await db.execute("SELECT hooklane_rerate_v2($1::bigint[])", ids)
        assert await _ready(db, ids) == expected
        assert await _branches(db, expected) == {"never", "now", "later", "infinity"}


async def test_ready_at_is_what_complete_decides_after_a_retry(db):
    await db.execute("INSERT INTO events (id, tenant, type, data, fanout) VALUES ('e', 'acme', 't', '{}', 0)")
    async with db.transaction():
        ids, retry_ins = [], []
        cases = itertools.product(KINDS, PAUSES, HEADS, [30.0, 4 * 3600.0])
        for n, (kind, pause, head, retry_in) in enumerate(cases):
            endpoint_id = await _endpoint(db, f"ep-{n}", kind, pause, head)
            await _sending(db, endpoint_id)
            ids.append(endpoint_id)
            retry_ins.append(retry_in)
        sending = [
            r["id"]
            for r in await db.fetch("SELECT id FROM deliveries WHERE state = 'sending' ORDER BY endpoint_id")
        ]
        # A retry below the circuit's threshold: the pause stays as it was.
        rows = await db.fetch(
            "SELECT * FROM hooklane_complete_v2($1::bigint[], $2::int[], $3::text[], $4::float8[], $5::int[],"
            " $6::text[], 1000, 60, 3600)",
            sending,
            [1] * len(ids),
            ["retry"] * len(ids),
            retry_ins,
            [503] * len(ids),
            ["HTTP 503"] * len(ids),
        )
        # After the statement the retried delivery is pending like the rest;
        # a result frees a slot, so none counts as taken.
        expected = {r["id"]: r["ready_at"] for r in await db.fetch(HELPER, ids, False)}
        assert await _ready(db, ids) == expected
        now = await db.fetchval("SELECT now()")
        assert {r["id"]: r["ready"] for r in rows} == {
            i: at is not None and at <= now for i, at in expected.items()
        }
        assert await _branches(db, expected) == {"never", "now", "later"}


async def test_the_tenant_discard_names_both_tenants_and_only_when_they_differ(db):
    rows = await db.fetch(
        "SELECT hooklane_tenant_discard(e, t) FROM (VALUES ('acme', 'acme'), ('acme', 'globex')) AS x(e, t)"
    )
    assert [r[0] for r in rows] == [None, "discarded: the endpoint's tenant changed from acme to globex"]
