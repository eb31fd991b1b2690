"""The attempt history (delivery_attempts, migration 0010): its daily
partitions, kept by the worker's maintenance, and what the admin API, the
dashboard and the CLI read of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from hooklane.charts import SPANS, Bucket, Span
from hooklane.store.cursor import AttemptPosition, attempt_cursor, attempt_position
from hooklane.store.deliveries import DeliveryView, StatusRange, check_among, check_failure, delivery_view
from hooklane.store.events import check_page, check_time
from hooklane.store.queries import QUERIES

# Days of partitions made ahead of today: maintenance runs every few
# seconds and keeps these hourly, so a worker fleet down for three days
# still records into daily partitions, and past that into the default one.
PARTITIONS_AHEAD = 3


@dataclass(frozen=True)
class PartitionsKept:
    """What one pass did: partitions created, dropped, and skipped because
    their lock was not had in time (dropped by a later pass); rows deleted
    from the default partition."""

    created: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()
    purged: int = 0


async def keep_attempt_partitions(
    conn: asyncpg.Connection, retention_seconds: float, ahead: int = PARTITIONS_AHEAD
) -> PartitionsKept:
    """Create the daily partitions of today and ``ahead`` days on, drop
    those whose day ended more than ``retention_seconds`` ago: a step a
    statement, each its own transaction (call it outside one), so that no
    exclusive lock outlives its step."""
    done: dict[str, list[str]] = {"created": [], "dropped": [], "busy": []}
    while True:
        row = await conn.fetchrow(
            *QUERIES["attempt_partitions"](ahead=ahead, keep_seconds=retention_seconds, skip=done["busy"])
        )
        if row is None:
            return PartitionsKept(tuple(done["created"]), tuple(done["dropped"]), tuple(done["busy"]))
        if row["action"] == "purged":
            # the last step there is
            return PartitionsKept(
                tuple(done["created"]), tuple(done["dropped"]), tuple(done["busy"]), row["rows_deleted"]
            )
        done[row["action"]].append(row["partition_name"])


# What an attempt did to its delivery (the CHECK of delivery_attempts.outcome).
OUTCOMES = ("delivered", "retry", "dead", "discarded")
# A delivery shows at most this many of its attempts, the first ones: the
# contract's limit on attempts is far below, but resends start a delivery's
# count again, and a page must stay a page.
MAX_ATTEMPTS_SHOWN = 1000


def check_outcomes(outcomes: Sequence[str] | None, field: str = "outcome") -> list[str] | None:
    return check_among(outcomes, OUTCOMES, field)


@dataclass(frozen=True)
class AttemptView:
    """One recorded attempt, as the admin API, the dashboard and the CLI show
    it. ``status`` is the HTTP answer's, or None with ``failure`` saying why
    there was none; ``duration_seconds`` is None for a lease that ran out."""

    delivery_id: int
    event_id: str
    attempt: int
    attempted_by: str | None
    started_at: datetime
    duration_seconds: float | None
    outcome: str
    status: int | None
    failure: str | None
    error: str | None
    retry_after_seconds: float | None
    next_attempt_at: datetime | None
    trace_id: str | None
    recorded_at: datetime
    # Its delivery's ordering key and number, in an endpoint's listing
    # (None: unordered, or read with its delivery, which has them).
    ordering_key: str | None = None
    ordering_seq: int | None = None


def _attempt(row: asyncpg.Record, delivery_id: int) -> AttemptView:
    return AttemptView(
        delivery_id,
        row["event_id"],
        row["attempt"],
        row["attempted_by"],
        row["started_at"],
        row["duration_seconds"],
        row["outcome"],
        row["status"],
        row["failure"],
        row["error"],
        row["retry_after_seconds"],
        row["next_attempt_at"],
        row["trace_id"],
        row["recorded_at"],
        row.get("ordering_key"),
        row.get("ordering_seq"),
    )


@dataclass(frozen=True)
class DeliveryDetail:
    """A delivery with its endpoint, tenant and attempts, oldest first; at
    most MAX_ATTEMPTS_SHOWN of them (``attempts_truncated`` says there were
    more)."""

    delivery: DeliveryView
    tenant: str
    namespace: str
    name: str
    attempts: list[AttemptView]
    attempts_truncated: bool


async def delivery_detail(
    conn: asyncpg.Connection, delivery_id: int, endpoint: tuple[str, str] | None = None
) -> DeliveryDetail | None:
    """Delivery ``delivery_id`` with its attempts; None if there is none (or,
    with ``endpoint`` (namespace, name), none of that endpoint's)."""
    namespace, name = endpoint if endpoint is not None else (None, None)
    row = await conn.fetchrow(*QUERIES["delivery_of"](id=delivery_id, namespace=namespace, name=name))
    if row is None:
        return None
    rows = await conn.fetch(
        *QUERIES["delivery_attempts_of"](delivery_id=delivery_id, limit=MAX_ATTEMPTS_SHOWN + 1)
    )
    attempts = [_attempt(r, delivery_id) for r in rows[:MAX_ATTEMPTS_SHOWN]]
    return DeliveryDetail(
        delivery_view(row),
        row["tenant"],
        row["namespace"],
        row["name"],
        attempts,
        len(rows) > MAX_ATTEMPTS_SHOWN,
    )


@dataclass(frozen=True)
class AttemptPage:
    attempts: list[AttemptView]
    # The next page's cursor; None when this page is the last.
    cursor: str | None


async def endpoint_attempts(
    conn: asyncpg.Connection,
    namespace: str,
    name: str,
    *,
    since: datetime,
    until: datetime,
    outcomes: Sequence[str] | None = None,
    status: StatusRange | None = None,
    failure: str | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> AttemptPage | None:
    """A page of the endpoint's attempts recorded in [since, until), newest
    first, of ``outcomes``, ``status`` and ``failure`` (each: any when
    None); None if there is no such endpoint. The time range is required:
    it is what bounds the statement's walk over the history."""
    after = attempt_position(cursor)
    rows = await conn.fetch(
        *QUERIES["endpoint_attempts"](
            namespace=namespace,
            name=name,
            since=check_time(since, "since"),
            until=check_time(until, "until"),
            outcomes=check_outcomes(outcomes),
            status_min=status.low if status else None,
            status_max=status.high if status else None,
            failure=check_failure(failure),
            after_at=after.recorded_at if after else None,
            after_delivery=after.delivery_id if after else None,
            after_attempt=after.attempt if after else None,
            limit=check_page(limit),
        )
    )
    if not rows:
        return None
    page = [_attempt(r, r["delivery_id"]) for r in rows if r["delivery_id"] is not None]
    last = page[-1] if len(page) == limit else None
    return AttemptPage(
        page,
        attempt_cursor(AttemptPosition(last.recorded_at, last.delivery_id, last.attempt)) if last else None,
    )


async def endpoint_chart(
    conn: asyncpg.Connection, namespace: str, name: str, span: Span
) -> list[Bucket] | None:
    """The endpoint's attempts per bucket of ``span``, oldest first, the
    last bucket holding the database's now(); None if there is no such
    endpoint."""
    terms = SPANS[span]
    rows = await conn.fetch(
        *QUERIES["endpoint_chart"](
            namespace=namespace, name=name, bucket_seconds=terms.width.total_seconds(), buckets=terms.count
        )
    )
    if not rows:
        return None
    return [
        Bucket(
            r["bucket"],
            r["delivered"],
            r["retry"],
            r["dead"],
            r["discarded"],
            *(r["latency"] or (None, None)),
        )
        for r in rows
    ]
