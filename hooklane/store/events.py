"""Events: the outbox write, reconciliation listing and retention."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from hooklane.errors import EventConflict, InvalidInput
from hooklane.store.cursor import event_cursor, event_position
from hooklane.store.queries import QUERIES

# The most rows one page of a listing returns (events, deliveries).
MAX_PAGE = 1000


async def insert_event(
    conn: asyncpg.Connection,
    *,
    id: str,
    tenant: str,
    type: str,
    data_json: str,
    coalesce_key: str | None,
    traceparent: str | None = None,
) -> int | None:
    """Store the event and its deliveries on ``conn``, in whatever
    transaction it is in. Returns the fan-out (0: no endpoint matched), or
    None when the tenant already stored this very event under this id.
    ``EventConflict`` when the tenant stored a different one under it:
    nothing is stored, and the transaction is still usable. The caller's
    ``conn`` raises its own errors (see :func:`hooklane.publish`).
    ``traceparent``: the W3C trace context it was published in, checked."""
    event = {"id": id, "tenant": tenant, "type": type, "data": data_json, "coalesce_key": coalesce_key}
    row = await conn.fetchrow(*QUERIES["publish"](**event, traceparent=traceparent))
    assert row is not None, "publish returns one row, always"
    if row["fanout"] is not None:
        return row["fanout"]
    conflict = row["conflict"]
    if conflict is None:
        conflict = await conn.fetchval(*QUERIES["event_conflict"](**event))
    if conflict:
        raise EventConflict(id, tenant)
    return None


# An event as insert_events takes it: id, tenant, type, data (JSON text),
# coalesce_key, traceparent.
EventRow = tuple[str, str, str, str, str | None, str | None]


async def insert_events(conn: asyncpg.Connection, events: Sequence[EventRow]) -> list[int]:
    """Store many events as :func:`insert_event` stores one, on ``conn`` in
    whatever transaction it is in, in two round trips whatever their number.
    Returns the positions (0-based) of the events the tenant had stored
    under their ids with different content: nothing of those is stored,
    the others are (or were already, identical), and the transaction is
    still usable."""
    if not events:
        return []
    publish = QUERIES["publish"]
    # Pipelined: one round trip for every execution.
    await conn.executemany(
        publish.sql,
        [
            publish.args(
                id=event_id,
                tenant=tenant,
                type=event_type,
                data=data_json,
                coalesce_key=key,
                traceparent=parent,
            )
            for event_id, tenant, event_type, data_json, key, parent in events
        ],
    )
    ids, tenants, types, data, keys, _ = (list(column) for column in zip(*events, strict=True))
    rows = await conn.fetch(
        *QUERIES["events_conflicting"](ids=ids, tenants=tenants, types=types, data=data, coalesce_keys=keys)
    )
    return [row["position"] - 1 for row in rows]


@dataclass(frozen=True)
class StoredEvent:
    """An event as reconciliation lists it; ``data`` is its JSON text."""

    id: str
    type: str
    data: str
    created_at: datetime
    fanout: int


@dataclass(frozen=True)
class EventPage:
    events: list[StoredEvent]
    # Where the next page starts: after the last event listed, or where
    # this page started when it is empty. Never None: a receiver keeps it
    # and asks again later for what committed meanwhile.
    cursor: str


def check_page(limit: int, field: str = "limit") -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(field, f"must be between 1 and {MAX_PAGE}, not {limit}")
    return limit


def check_time(value: datetime | None, field: str) -> datetime | None:
    """A time a caller gave, refused without a timezone: a naive time means
    a different instant on every machine that reads it."""
    if value is not None and value.utcoffset() is None:
        raise InvalidInput(field, "needs a timezone (RFC 3339: 2026-03-01T12:00:00Z)")
    return value


async def list_events(
    conn: asyncpg.Connection,
    tenant: str,
    since: datetime,
    until: datetime | None = None,
    *,
    limit: int = MAX_PAGE,
    cursor: str | None = None,
) -> EventPage:
    """A page of the tenant's events created in [since, until), after
    ``cursor`` (an :attr:`EventPage.cursor`). Paging on never skips an
    event that commits late: see ``list_events`` in queries.sql."""
    check_time(since, "since")
    check_time(until, "until")
    check_page(limit)
    xact, after = event_position(cursor)
    rows = await conn.fetch(
        *QUERIES["list_events"](
            tenant=tenant, cursor_xact=str(xact), cursor_id=after, since=since, until=until, limit=limit
        )
    )
    events = [StoredEvent(r["id"], r["type"], r["data"], r["created_at"], r["fanout"]) for r in rows]
    if rows:
        cursor = event_cursor(int(rows[-1]["xact"]), rows[-1]["id"])
    return EventPage(events, cursor or event_cursor(xact, after))


# Before every event: where a purge's first batch starts.
_BEFORE_EVENTS = datetime(1, 1, 1, tzinfo=UTC)


async def purge_events(conn: asyncpg.Connection, retention_seconds: float, batch: int = 1000) -> int:
    """Drop events past retention, a batch at a time, oldest first; returns
    how many. Each batch starts after the last one's last event, so the
    events kept (a delivery of theirs still pending or dead) are looked at
    once a purge, and the cost grows with what is purged."""
    purged = 0
    after: tuple[datetime, str, str] = (_BEFORE_EVENTS, "", "")
    while True:
        row = await conn.fetchrow(
            *QUERIES["purge_events"](
                retention_seconds=retention_seconds,
                after_at=after[0],
                after_tenant=after[1],
                after_id=after[2],
                batch_size=batch,
            )
        )
        assert row is not None, "a SELECT of aggregates returns one row"
        purged += row["deleted"]
        if row["scanned"] < batch:
            return purged
        after = (row["next_at"], row["next_tenant"], row["next_id"])
