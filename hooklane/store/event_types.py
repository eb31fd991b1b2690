"""The catalogue's event types as the operator (WebhookEventType
resources) and `hooklane eventtype apply` write them: a type and its
versions in one transaction, each under its source ('kubernetes' or
'local'), neither overwriting nor deleting the other's (docs/catalogue.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from enum import StrEnum

import asyncpg

from hooklane.catalogue import EventTypeSpec, stored_versions
from hooklane.store.queries import QUERIES


class EventTypeSource(StrEnum):
    KUBERNETES = "kubernetes"
    LOCAL = "local"


@dataclass(frozen=True)
class EventTypeApplied:
    """What applying a type did. ``held_by`` names the other source when it
    holds the type's name: then nothing was written."""

    created: bool = False
    written_versions: tuple[int, ...] = ()
    removed_versions: tuple[int, ...] = ()
    held_by: EventTypeSource | None = None


@dataclass(frozen=True)
class EventTypeRemoved:
    """What deleting a type did: ``found`` when its row (of this source) was
    removed; ``held_by`` names the other source when it holds the name."""

    found: bool
    held_by: EventTypeSource | None = None


@dataclass(frozen=True)
class AppliedType:
    """A row of `hooklane eventtype list`."""

    name: str
    group: str | None
    latest: int | None
    versions: int
    deprecated_since: date | None
    archived: bool
    source: EventTypeSource
    updated_at: datetime


async def apply_event_type(
    conn: asyncpg.Connection, spec: EventTypeSpec, source: EventTypeSource
) -> EventTypeApplied:
    """Store ``spec`` (checked, its schemas bundled) with every version it
    lists, and remove the versions it no longer lists, in one transaction."""
    versions = stored_versions(spec)
    numbers = [number for number, _, _ in versions]
    async with conn.transaction():
        row = await conn.fetchrow(
            *QUERIES["upsert_catalogue_type"](
                name=spec.name,
                description=spec.description,
                type_group=spec.group,
                deprecated_since=spec.deprecated_since,
                archived=spec.archived,
                source=str(source),
            )
        )
        if row is None:
            held = await conn.fetchval(*QUERIES["catalogue_type_source"](name=spec.name))
            return EventTypeApplied(held_by=EventTypeSource(held))
        written = await conn.fetch(
            *QUERIES["upsert_catalogue_versions"](
                name=spec.name,
                versions=numbers,
                schemas=[schema for _, schema, _ in versions],
                examples=[example for _, _, example in versions],
            )
        )
        removed = await conn.fetch(
            *QUERIES["delete_catalogue_versions_unlisted"](name=spec.name, versions=numbers)
        )
    return EventTypeApplied(
        created=bool(row["created"]),
        written_versions=tuple(sorted(r["version"] for r in written)),
        removed_versions=tuple(sorted(r["version"] for r in removed)),
    )


async def delete_event_type(conn: asyncpg.Connection, name: str, source: EventTypeSource) -> EventTypeRemoved:
    """Remove the type ``name`` with its versions if ``source`` wrote it."""
    async with conn.transaction():
        if await conn.fetchval(*QUERIES["delete_catalogue_type"](name=name, source=str(source))) is not None:
            return EventTypeRemoved(found=True)
        held = await conn.fetchval(*QUERIES["catalogue_type_source"](name=name))
    return EventTypeRemoved(found=False, held_by=None if held is None else EventTypeSource(held))


async def applied_event_types(conn: asyncpg.Connection) -> list[AppliedType]:
    """Every type of the catalogue, by name."""
    rows = await conn.fetch(*QUERIES["catalogue_types_applied"]())
    return [
        AppliedType(
            name=r["name"],
            group=r["type_group"],
            latest=r["latest"],
            versions=r["versions"],
            deprecated_since=r["deprecated_since"],
            archived=r["archived"],
            source=EventTypeSource(r["source"]),
            updated_at=r["updated_at"],
        )
        for r in rows
    ]
