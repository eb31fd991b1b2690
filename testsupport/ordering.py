"""Ordered delivery per key (issue 42) at the SQL level: a publish naming
an ordering key, a reservation round and a batch of results, each calling
the functions the worker and the publishers call (hooklane_publish_v3,
hooklane_reserve_v8, hooklane_complete_v6), and what a key's rows say.
Shared by tests/db/test_ordering.py and tests/processes/test_ordering.py."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from hooklane import store
from hooklane.policies import CircuitPolicy
from hooklane.results import Result
from hooklane.store.deliveries import ADAPT_STEP_SECONDS, DELIVERED_STEP_SECONDS, RATE_LOOKAHEAD_SECONDS
from testsupport.fixtures import ALL_PARTITIONS


async def publish(
    conn: asyncpg.Connection,
    key: str | None,
    *,
    tenant: str = "acme",
    type: str = "order.updated",
    id: str | None = None,
    coalesce_key: str | None = None,
    data: Mapping[str, object] | None = None,
) -> str:
    """Publish one event naming the ordering ``key`` as a publisher's
    transaction does (hooklane_publish_v3); its id."""
    event_id = await conn.fetchval(
        "SELECT hooklane_publish_v3($1, $2, $3::text::jsonb, $4, $5, NULL, $6)",
        tenant,
        type,
        json.dumps(dict(data or {})),
        id,
        coalesce_key,
        key,
    )
    assert isinstance(event_id, str)
    return event_id


async def reserve(
    conn: asyncpg.Connection,
    limit: int = 100,
    *,
    endpoints: Sequence[int] | None = None,
    worker: str = "test-worker",
) -> list[asyncpg.Record]:
    """One reservation round over the ``endpoints`` (None: every one), each
    read from the start of its queue, as a worker that has just taken every
    partition runs it (hooklane_reserve_v8): the deliveries reserved, with
    their ordering key and number."""
    candidates = (
        [r["id"] for r in await conn.fetch("SELECT id FROM endpoints ORDER BY id")]
        if endpoints is None
        else list(endpoints)
    )
    rows = await conn.fetch(
        "SELECT * FROM hooklane_reserve_v8($1::int[], $2::bigint[], $3::timestamptz[], NULL, NULL,"
        " $4, $5, $6, $7, NULL)",
        ALL_PARTITIONS,
        candidates,
        [None] * len(candidates),
        limit,
        10.0,
        worker,
        RATE_LOOKAHEAD_SECONDS,
    )
    return [r for r in rows if r["id"] is not None]


def delivered(row: asyncpg.Record) -> Result:
    return Result.delivered(row["id"], row["attempts"], status=204)


def retried(row: asyncpg.Record, retry_in: float = 3600.0) -> Result:
    return Result.retry(row["id"], row["attempts"], retry_in=retry_in, status=500, error="HTTP 500")


def died(row: asyncpg.Record) -> Result:
    return Result.dead(row["id"], row["attempts"], status=500, error="HTTP 500")


async def complete(
    conn: asyncpg.Connection, done: Iterable[tuple[Mapping[str, Any], Result]]
) -> list[asyncpg.Record]:
    """Record a batch of results of reserved rows as the worker does
    (hooklane_complete_v6, the ordered rows' keys given with them): the
    endpoints touched, each with its ``ordering_busy`` keys."""
    pairs = list(done)
    results = [r for _, r in pairs]
    ordered = [row for row, _ in pairs if row["ordering_key"] is not None]
    circuit = CircuitPolicy()
    return await conn.fetch(
        "SELECT * FROM hooklane_complete_v6($1::bigint[], $2::int[], $3::text[], $4::float8[],"
        " $5::int[], $6::text[], $7::text[], $8::timestamptz[], $9::float8[], $10::float8[],"
        " $11::text[], $12, $13, $14, $15, $16::int[], $17, $18, $19::bigint[], $20::text[])",
        [r.delivery_id for r in results],
        [r.attempts for r in results],
        [r.outcome.value for r in results],
        [r.retry_in for r in results],
        [r.status for r in results],
        [r.error for r in results],
        [None if r.failure is None else r.failure.value for r in results],
        [datetime.now(UTC)] * len(results),
        [None] * len(results),
        [r.retry_after for r in results],
        [None] * len(results),
        "test-worker",
        circuit.threshold,
        circuit.step_seconds,
        circuit.cap_seconds,
        ALL_PARTITIONS,
        DELIVERED_STEP_SECONDS,
        ADAPT_STEP_SECONDS,
        [row["endpoint_id"] for row in ordered],
        [row["ordering_key"] for row in ordered],
    )


async def advance(conn: asyncpg.Connection, keys: Sequence[tuple[int, str]]) -> list[asyncpg.Record]:
    """hooklane_ordering_advance_v1 on (endpoint, key) pairs, as a worker
    owning every partition calls it again for the busy keys."""
    return await conn.fetch(
        "SELECT * FROM hooklane_ordering_advance_v1($1::bigint[], $2::text[], $3::int[])",
        [e for e, _ in keys],
        [k for _, k in keys],
        ALL_PARTITIONS,
    )


async def sweep(conn: asyncpg.Connection, page: int = 2) -> list[tuple[int, str]]:
    """The worker's sweep over every partition, a whole walk of pages of
    ``page`` keys: the (endpoint, key) of each delivery made due."""
    woken: list[tuple[int, str]] = []
    after = None
    while True:
        swept = await store.sweep_ordering(conn, ALL_PARTITIONS, after, page)
        woken += [(endpoint_id, key) for endpoint_id, _, key, _ in swept.woken]
        if (after := swept.after) is None:
            return woken


async def sweep_v1(conn: asyncpg.Connection, max_keys: int = 100) -> list[tuple[int, str]]:
    """hooklane_ordering_sweep_v1, as a worker of release 26 calls it."""
    rows = await conn.fetch(
        "SELECT * FROM hooklane_ordering_sweep_v1($1::int[], $2)", ALL_PARTITIONS, max_keys
    )
    return [(r["endpoint_id"], r["key"]) for r in rows if r["due"] is not None]


async def resend(conn: asyncpg.Connection, namespace: str, name: str, ids: list[int]) -> None:
    """Resend dead deliveries as an operator does (``hooklane resend``):
    each page queued behind its keys in its transaction."""
    assert await store.resend_dead(conn, namespace, name, ids) == len(ids)


@dataclass(frozen=True)
class Ordered:
    """One ordered delivery as its row says."""

    id: int
    event_id: str
    seq: int
    state: str
    due: bool  # pending and due (not waiting behind its key)
    waiting: bool  # pending behind its key (next_attempt_at 'infinity')


async def deliveries_of(conn: asyncpg.Connection, endpoint_id: int, key: str) -> list[Ordered]:
    """The key's deliveries to the endpoint, by number."""
    rows = await conn.fetch(
        "SELECT id, event_id, ordering_seq, state,"
        " state = 'pending' AND next_attempt_at <= now() AS due,"
        " state = 'pending' AND next_attempt_at = 'infinity' AS waiting"
        " FROM deliveries WHERE endpoint_id = $1 AND ordering_key = $2 ORDER BY ordering_seq",
        endpoint_id,
        key,
    )
    return [
        Ordered(r["id"], r["event_id"], r["ordering_seq"], r["state"], r["due"], r["waiting"]) for r in rows
    ]


async def key_row(conn: asyncpg.Connection, endpoint_id: int, key: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT last_seq, head_seq, held_since, skipped FROM ordering_keys WHERE endpoint_id = $1 AND key = $2",
        endpoint_id,
        key,
    )
