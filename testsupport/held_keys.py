"""Ordered deliveries held back, written as publishers and workers write
them (migration 0026): events published with an ordering key through
hooklane_try_publish_v3, and a key's head recorded dead through
hooklane_complete_v6, as a worker records an attempt that used up its
delivery. For the tests of what people see of ordering."""

from __future__ import annotations

import json

import asyncpg


async def publish_ordered(
    db: asyncpg.Connection, key: str, ids: list[str], *, tenant: str = "acme", type_: str = "order.paid"
) -> None:
    """Publish one event per id, in order, with ordering key ``key``."""
    for event_id in ids:
        row = await db.fetchrow(
            "SELECT * FROM hooklane_try_publish_v3($1, $2, $3::jsonb, $4, NULL, NULL, $5)",
            tenant,
            type_,
            json.dumps({"id": event_id}),
            event_id,
            key,
        )
        assert row["stored"], dict(row)


async def kill_head(
    db: asyncpg.Connection, endpoint: str, key: str, error: str = "HTTP 503", *, namespace: str = "default"
) -> int:
    """Reserve the due head of ``key`` on endpoint ``namespace``/``endpoint`` as
    a worker would, and record its attempt as the last one (dead, answered
    503 with ``error``); the key moves on or is held by the endpoint's
    ordering_on_dead. The head's delivery id."""
    head = await db.fetchrow(
        """UPDATE deliveries d
           SET state = 'sending', attempts = d.attempts + 1, attempted_by = 'test-worker',
               lease_expires_at = now() + interval '1 minute'
           FROM endpoints ep
           WHERE ep.id = d.endpoint_id AND ep.namespace = $3 AND ep.name = $1
             AND d.ordering_key = $2 AND d.state = 'pending' AND d.next_attempt_at < 'infinity'
           RETURNING d.id, d.attempts, d.endpoint_id""",
        endpoint,
        key,
        namespace,
    )
    assert head is not None, f"no due head of {key} on {endpoint}"
    await db.execute(
        """SELECT * FROM hooklane_complete_v6(
               ARRAY[$1::bigint], ARRAY[$2::int], ARRAY['dead'], ARRAY[NULL::float8], ARRAY[503],
               ARRAY[$3::text], ARRAY[NULL::text], ARRAY[now()], ARRAY[0.01::float8],
               ARRAY[NULL::float8], ARRAY[NULL::text], 'test-worker', 5, 1.0, 60.0, NULL,
               1.0, 1.0, ARRAY[$4::bigint], ARRAY[$5::text])""",
        head["id"],
        head["attempts"],
        error,
        head["endpoint_id"],
        key,
    )
    return head["id"]
