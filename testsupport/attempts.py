"""Attempt history written as the worker writes it (delivery_attempts, the
columns hooklane_complete_v5 fills), for the endpoint charts' tests:
rows of a time of the test's choosing, which no real attempt can have."""

from __future__ import annotations

from typing import Any

import asyncpg


async def record_attempts(
    db: asyncpg.Connection, endpoint: int, outcome: str, ago: str, n: int, **columns: Any
) -> None:
    """``n`` attempt rows of ``endpoint`` recorded ``ago`` (an interval, as
    Postgres reads it), as the worker's complete (or the rescue: a
    ``duration_seconds`` of None) writes them, into the day's partition or
    the default one for a day that has none. ``columns``:
    duration_seconds (0.25 unless given), status, failure."""
    await db.execute(
        """INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,
                                          attempted_by, started_at, duration_seconds, outcome, status,
                                          failure, recorded_at)
           SELECT 1000 + i, 1, $1, 'acme', 'evt-' || i, 'test-worker', now() - $3::text::interval,
                  $5::float8 * (1 + (i % 7) / 3.0), $2, $6, $7, now() - $3::text::interval
           FROM generate_series(1, $4) AS i""",
        endpoint,
        outcome,
        ago,
        n,
        columns.get("duration_seconds", 0.25),
        columns.get("status"),
        columns.get("failure"),
    )


async def a_week_of_attempts(db: asyncpg.Connection, endpoint: int) -> None:
    """A week of a receiver that mostly answers, slows down in the
    afternoons and failed for a few hours yesterday: something to look at."""
    for hours in [*range(1, 24), *range(24, 24 * 7, 3)]:
        slow = hours % 24 in (3, 6)
        await record_attempts(
            db,
            endpoint,
            "delivered",
            f"{hours} hours",
            20 + hours % 11,
            duration_seconds=0.4 if slow else 0.08,
        )
        if hours % 5 == 0:
            await record_attempts(
                db, endpoint, "retry", f"{hours} hours", 4, status=503, duration_seconds=1.2
            )
    for hours in (26, 27, 28):
        await record_attempts(
            db, endpoint, "retry", f"{hours} hours", 12, failure="timeout", duration_seconds=5.0
        )
        await record_attempts(db, endpoint, "dead", f"{hours} hours", 3, status=500)
    await record_attempts(db, endpoint, "discarded", "50 hours", 2)
