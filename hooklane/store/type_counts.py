"""Per event type, what publishers sent that reached nobody or broke the
catalogue: the events kept unrouted, the publishes the catalogue's check
refused (table catalogue_refusals, migration 0023) and the events it
marked (warned, deprecated), for the dashboard."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from hooklane.store.queries import QUERIES


@dataclass(frozen=True)
class TypeCounts:
    """One type's counts: unrouted since the page's ``since`` and in all
    (retained), refused since ``since`` by reason, and stored since
    ``since`` marked by the catalogue's check: under 'warn', or of a
    deprecated type."""

    type: str
    unrouted_recent: int
    unrouted_total: int
    refused_unknown: int
    refused_archived: int
    refused_schema: int
    warned_recent: int
    deprecated_recent: int

    @property
    def refused_recent(self) -> int:
        return self.refused_unknown + self.refused_archived + self.refused_schema


@dataclass(frozen=True)
class TypeCountPage:
    counts: list[TypeCounts]
    # How many types have a count at all, on every page.
    types: int


async def event_type_counts(
    conn: asyncpg.Connection, since: datetime, *, limit: int, offset: int = 0
) -> TypeCountPage:
    """The types with the most unrouted or refused since ``since`` first,
    ``limit`` of them after the first ``offset``."""
    rows = await conn.fetch(*QUERIES["event_type_counts"](since=since, limit=limit, offset=offset))
    return TypeCountPage(
        [
            TypeCounts(
                r["type"],
                r["unrouted_recent"],
                r["unrouted_total"],
                r["refused_unknown"],
                r["refused_archived"],
                r["refused_schema"],
                r["warned_recent"],
                r["deprecated_recent"],
            )
            for r in rows
        ],
        rows[0]["types"] if rows else 0,
    )
