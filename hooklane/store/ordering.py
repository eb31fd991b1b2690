"""What people see of ordered delivery (migration 0026): an endpoint's
keys, the ones held back by a dead head and why, for the admin and tenant
APIs, the dashboard, the portal and ``hooklane status``. Moving keys on is
the worker's and the repairs' (hooklane_ordering_advance_v1); nothing here
writes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from hooklane.store.cursor import HeldKeyPosition, held_key_cursor, held_key_position
from hooklane.store.events import check_page
from hooklane.store.queries import QUERIES

# The held keys an endpoint's page and the ordering route's first page show.
HELD_KEYS_SHOWN = 20


@dataclass(frozen=True)
class OrderingSummary:
    """An endpoint's ordering state. ``keys_outstanding``: keys with a
    delivery due, in flight or held; ``keys_held``: keys whose head died
    while the endpoint holds (``on_dead`` 'hold'), waiting for it to be
    resent or discarded, the oldest since ``oldest_held_since``;
    ``waiting``: deliveries queued behind an earlier one of their key;
    ``skipped``: dead deliveries their key went on past (``on_dead``
    'skip'), kept until resent or discarded."""

    on_dead: str
    keys_outstanding: int
    keys_held: int
    oldest_held_since: datetime | None
    waiting: int
    skipped: int
    observed_at: datetime


@dataclass(frozen=True)
class HeldKey:
    """A key held back, and why: its head, the dead delivery
    ``delivery_id`` (None if it went meanwhile) of event ``event_id``, with
    its last answer; ``waiting`` deliveries of the key queue behind it. A
    resend or a discard of the head releases the key."""

    key: str
    held_since: datetime
    head_seq: int
    delivery_id: int | None
    event_id: str | None
    event_type: str | None
    attempts: int | None
    last_status: int | None
    last_failure: str | None
    last_error: str | None
    waiting: int


@dataclass(frozen=True)
class HeldKeyPage:
    keys: list[HeldKey]
    # The next page's cursor; None when this page is the last.
    cursor: str | None


@dataclass(frozen=True)
class HeldKeyCount:
    """An endpoint with held keys: how many, and since when the oldest."""

    namespace: str
    name: str
    tenant: str
    keys_held: int
    oldest_held_since: datetime


async def endpoint_ordering(conn: asyncpg.Connection, namespace: str, name: str) -> OrderingSummary | None:
    """The endpoint's ordering state; None if there is no such endpoint."""
    row = await conn.fetchrow(*QUERIES["endpoint_ordering"](namespace=namespace, name=name))
    if row is None:
        return None
    return OrderingSummary(
        row["ordering_on_dead"],
        row["keys_outstanding"],
        row["keys_held"],
        row["oldest_held_since"],
        row["waiting"],
        row["skipped"],
        row["observed_at"],
    )


async def held_keys(
    conn: asyncpg.Connection, namespace: str, name: str, *, cursor: str | None = None, limit: int = 100
) -> HeldKeyPage | None:
    """A page of the endpoint's held keys, held longest first, after
    ``cursor``; None if there is no such endpoint."""
    after = held_key_position(cursor)
    rows = await conn.fetch(
        *QUERIES["held_keys"](
            namespace=namespace,
            name=name,
            after_at=after.held_since if after else None,
            after_key=after.key if after else None,
            limit=check_page(limit),
        )
    )
    if not rows:
        return None
    page = [_held(r) for r in rows if r["key"] is not None]
    last = page[-1] if len(page) == limit else None
    return HeldKeyPage(page, held_key_cursor(HeldKeyPosition(last.held_since, last.key)) if last else None)


def _held(row: asyncpg.Record) -> HeldKey:
    return HeldKey(
        row["key"],
        row["held_since"],
        row["head_seq"],
        row["delivery_id"],
        row["event_id"],
        row["event_type"],
        row["attempts"],
        row["last_status"],
        row["last_failure"],
        row["last_error"],
        row["waiting"],
    )


async def held_key_counts(conn: asyncpg.Connection, endpoint_ids: list[int]) -> list[HeldKeyCount]:
    """Of the endpoints ``endpoint_ids``, those with held keys, the most
    held first."""
    rows = await conn.fetch(*QUERIES["held_key_counts"](ids=endpoint_ids))
    return [
        HeldKeyCount(r["namespace"], r["name"], r["tenant"], r["keys_held"], r["oldest_held_since"])
        for r in rows
    ]
