"""Events: the outbox write, reconciliation listing and retention."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import asyncpg

from hooklane.errors import CatalogueRefused, EventConflict, InvalidInput
from hooklane.store.cursor import event_cursor, event_position
from hooklane.store.queries import QUERIES

# The most rows one page of a listing returns (events, deliveries).
MAX_PAGE = 1000


# The SQLSTATE of a publish refused for an id the tenant already published
# with other content (migration 0012; docs/publishing.md); any other
# refusal (WH422) names the argument at fault.
REFUSED_CONFLICT = "WH409"


@dataclass(frozen=True)
class Published:
    """A publish the function took: the event's id, and its fan-out (0: no
    endpoint matched, kept and counted), None when the tenant had already
    stored this very event under this id and nothing more was stored."""

    event_id: str
    fanout: int | None


class PublishRow(Protocol):
    """A row of the publish function, as any driver returns it by name."""

    def __getitem__(self, key: str, /) -> Any: ...


def published(row: PublishRow, *, tenant: str, id: str | None) -> Published:
    """``hooklane_try_publish_v3``'s answer, or its refusal raised: the
    conflict as ``EventConflict``, any other as ``InvalidInput`` naming the
    argument. Every Python caller reads the answer here, whatever its
    driver."""
    code = row["error_code"]
    if code is None:
        return Published(row["event_id"], row["fanout"])
    if code == REFUSED_CONFLICT and id is not None:
        raise EventConflict(id, tenant)
    field, message = row["error_field"], row["error_message"]
    if catalogue_refusal(field, message):
        raise CatalogueRefused(field, message)
    raise InvalidInput(field, message)


# How the catalogue's check words its refusals (migration 0024): a type
# "... in the event catalogue ...", data "... (schema version N, rule R)".
# The rest of the function's WH422s are check_event's rules again.
_SCHEMA_RULE = re.compile(r" \(schema version \d+, rule [^()]*\)\Z")


def catalogue_refusal(field: str, message: str) -> bool:
    """Whether a WH422 of the publish function is the catalogue's check's:
    the same answer shape as every refusal, and the only one check_event
    cannot make before any SQL."""
    if field == "type":
        return " in the event catalogue" in message
    return field == "data" and _SCHEMA_RULE.search(message) is not None


async def insert_event(
    conn: asyncpg.Connection,
    *,
    id: str | None,
    tenant: str,
    type: str,
    data_json: str,
    coalesce_key: str | None,
    traceparent: str | None = None,
    ordering_key: str | None = None,
) -> Published:
    """Store the event and its deliveries on ``conn``, in whatever
    transaction it is in, through the publish function. ``id`` None: one is
    made. ``EventConflict`` when the tenant stored a different event under
    the id, ``InvalidInput`` when the function refuses an argument: nothing
    is stored, and the transaction is still usable. The caller's ``conn``
    raises its own errors (see :func:`hooklane.publish`). ``traceparent``:
    the W3C trace context it was published in; ``ordering_key``: the key
    its deliveries are ordered by (None: unordered)."""
    row = await conn.fetchrow(
        *QUERIES["publish"](
            id=id,
            tenant=tenant,
            type=type,
            data=data_json,
            coalesce_key=coalesce_key,
            traceparent=traceparent,
            ordering_key=ordering_key,
        )
    )
    assert row is not None, "publish returns one row, always"
    return published(row, tenant=tenant, id=id)


@dataclass(frozen=True, slots=True)
class Event:
    """An event ready to store: checked (``hooklane.publish.check_event``),
    its id made, its data as JSON text. ``traceparent``: the W3C trace
    context it was published in (hooklane/tracing.py); ``ordering_key``:
    the key its deliveries are ordered by (None: unordered)."""

    id: str
    tenant: str
    type: str
    data_json: str
    coalesce_key: str | None = None
    traceparent: str | None = None
    ordering_key: str | None = None


async def insert_events(conn: asyncpg.Connection, events: Sequence[Event]) -> dict[int, InvalidInput]:
    """Store many events as :func:`insert_event` stores one, in their order
    (the events of one ordering key take its numbers in it),
    on ``conn`` in whatever transaction it is in, in one round trip whatever
    their number. Returns the refused events by position (0-based), each
    with its refusal (``EventConflict`` for an id the tenant had stored
    with different content): nothing of those is stored, the others are
    (or were already, identical), and the transaction is still usable."""
    if not events:
        return {}
    ids, tenants = [e.id for e in events], [e.tenant for e in events]
    rows = await conn.fetch(
        *QUERIES["publish_many"](
            ids=ids,
            tenants=tenants,
            types=[e.type for e in events],
            data=[e.data_json for e in events],
            coalesce_keys=[e.coalesce_key for e in events],
            traceparents=[e.traceparent for e in events],
            ordering_keys=[e.ordering_key for e in events],
        )
    )
    refused: dict[int, InvalidInput] = {}
    for row in rows:
        position = row["position"] - 1
        try:
            published(row, tenant=tenants[position], id=ids[position])
        except InvalidInput as exc:
            refused[position] = exc
    return refused


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
