"""Operational notifications: what the notifications pass noticed of each
endpoint (circuit openings, deactivations, dead deliveries), and the
notices due, taken in a transaction that their publish shares."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from hooklane.store.queries import QUERIES

# The kinds of notice, as endpoint_notices.kind holds them.
NOTICE_PAUSED = "paused"
NOTICE_DEACTIVATED = "deactivated"
NOTICE_DELIVERIES_DEAD = "deliveries_dead"
NOTICE_KINDS = (NOTICE_PAUSED, NOTICE_DEACTIVATED, NOTICE_DELIVERIES_DEAD)


@dataclass(frozen=True)
class Noted:
    """What one pass noticed, by kind, and its cut: where the next pass's
    window starts."""

    cut: datetime
    paused: int = 0
    deactivated: int = 0
    deliveries_dead: int = 0


@dataclass(frozen=True)
class Notice:
    """A notice taken to be told: the endpoint as it is now and the
    transition it tells of.

    ``subject`` is what names the notice, for its event id: the failing
    episode whose circuit opened (``failing_since``), the deactivation
    (``deactivated_at``), or for dead deliveries the start of the range
    counted (``counted_since``), each unique per endpoint and kind.
    ``transitions``: openings or deactivations noticed since the last notice
    of the kind, this one included. ``dead``: dead attempts recorded from
    ``counted_since`` to ``counted_until``, the last at ``last_dead_at``
    with ``dead_error``, ``dead_status`` and ``dead_failure``."""

    kind: str
    endpoint_id: int
    namespace: str
    name: str
    tenant: str
    subject: datetime
    transitions: int
    last_notified_at: datetime | None
    consecutive_failures: int
    failing_since: datetime | None
    paused_until: datetime | None
    last_error: str | None
    deactivated_at: datetime | None
    deactivated_reason: str | None
    dead: int
    counted_since: datetime | None
    counted_until: datetime | None
    last_dead_at: datetime | None
    dead_error: str | None
    dead_status: int | None
    dead_failure: str | None
    noticed_at: datetime

    @classmethod
    def of(cls, row: asyncpg.Record) -> Notice:
        dead = row["kind"] == NOTICE_DELIVERIES_DEAD
        return cls(
            kind=row["kind"],
            endpoint_id=row["endpoint_id"],
            namespace=row["namespace"],
            name=row["name"],
            tenant=row["tenant"],
            subject=row["counted_until"] if dead else row["seen"],
            transitions=row["transitions"],
            last_notified_at=row["notified_at"],
            consecutive_failures=row["consecutive_failures"],
            failing_since=row["failing_since"],
            paused_until=row["paused_until"],
            last_error=row["last_error"],
            deactivated_at=row["deactivated_at"],
            deactivated_reason=row["deactivated_reason"],
            dead=row["dead"],
            counted_since=row["counted_until"] if dead else None,
            counted_until=row["cut"] if dead else None,
            last_dead_at=row["last_dead_at"],
            dead_error=row["dead_error"],
            dead_status=row["dead_status"],
            dead_failure=row["dead_failure"],
            noticed_at=row["noticed_at"],
        )


async def note_notices(
    conn: asyncpg.Connection,
    *,
    tenant: str,
    since: datetime | None,
    lookback_seconds: float,
    settle_seconds: float,
    interval_seconds: float,
) -> Noted:
    """Note what changed from ``since`` (the last pass's cut; None: none)
    on, at most ``lookback_seconds`` back, to ``settle_seconds`` ago, and
    make it due (see queries.sql). Safe to run twice over the same window,
    or by two workers at once."""
    row = await conn.fetchrow(
        *QUERIES["note_notices"](
            tenant=tenant,
            since=since,
            lookback_seconds=lookback_seconds,
            settle_seconds=settle_seconds,
            interval_seconds=interval_seconds,
        )
    )
    assert row is not None, "note_notices returns one row, always"
    return Noted(row["cut"], row["paused"], row["deactivated"], row["deliveries_dead"])


@asynccontextmanager
async def take_notices(
    conn: asyncpg.Connection, *, tenant: str, settle_seconds: float, limit: int
) -> AsyncIterator[list[Notice]]:
    """``async with take_notices(...) as notices:`` the notices due (at most
    ``limit``), taken in a transaction that commits when the block ends
    without an error: publish them inside it (``insert_events`` on the same
    ``conn``), so that a notice is taken if and only if it is published. A
    concurrent caller gets none of these."""
    async with conn.transaction():
        rows = await conn.fetch(
            *QUERIES["take_notices"](tenant=tenant, settle_seconds=settle_seconds, limit=limit)
        )
        yield [Notice.of(r) for r in rows]
