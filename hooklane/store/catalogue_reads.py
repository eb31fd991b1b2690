"""Reading the event catalogue (migration 0023): a page of its types with
their versions, one type, or all of them for the portal's page and the
OpenAPI export. What writes it is the operator's and the CLI's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import asyncpg

from hooklane.catalogue_view import CatalogueEntry, CatalogueVersion
from hooklane.errors import InvalidInput, shown
from hooklane.store.cursor import catalogue_cursor, catalogue_position
from hooklane.store.events import MAX_PAGE, check_page
from hooklane.store.queries import QUERIES

# A group's name and a prefix of a type's name, at most as long as a
# column allows.
_MAX_FILTER_CHARS = 255


@dataclass(frozen=True)
class CataloguePage:
    types: list[CatalogueEntry]
    # The next page's cursor; None when this page is the last.
    cursor: str | None


def check_catalogue_filter(value: str | None, field: str) -> str | None:
    """A group or name prefix a caller gave: None, or 1 to 255 characters
    and none a control character (no stored group or name holds one, and
    PostgreSQL's text cannot hold a NUL)."""
    if value is not None and (
        not 1 <= len(value) <= _MAX_FILTER_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in value)
    ):
        raise InvalidInput(
            field, f"must be 1 to {_MAX_FILTER_CHARS} characters, none a control one, not {shown(value)}"
        )
    return value


async def catalogue_page(
    conn: asyncpg.Connection,
    *,
    group: str | None = None,
    name_prefix: str | None = None,
    cursor: str | None = None,
    limit: int = MAX_PAGE,
) -> CataloguePage:
    """A page of the catalogue's types by name, with their versions, after
    ``cursor``. Keyset paging: a type is listed once however the pages
    are walked, unless it is deleted (then gone) or added behind the
    cursor meanwhile (then missing until asked again)."""
    check_page(limit)
    rows = await conn.fetch(
        *QUERIES["catalogue_page"](
            after=catalogue_position(cursor),
            type_group=check_catalogue_filter(group, "group"),
            name_prefix=check_catalogue_filter(name_prefix, "name_prefix"),
            limit=limit + 1,
        )
    )
    listed = rows[:limit]
    versions = await _versions(conn, [r["name"] for r in listed])
    types = [_entry(r, versions.get(r["name"], [])) for r in listed]
    more = catalogue_cursor(listed[-1]["name"]) if len(rows) > limit else None
    return CataloguePage(types, more)


async def catalogue_type(conn: asyncpg.Connection, name: str) -> CatalogueEntry | None:
    """The type ``name``, None when the catalogue has none of that name."""
    row = await conn.fetchrow(*QUERIES["catalogue_type"](name=name))
    if row is None:
        return None
    return _entry(row, (await _versions(conn, [name])).get(name, []))


async def catalogue_entries(conn: asyncpg.Connection) -> list[CatalogueEntry]:
    """Every type of the catalogue, by name: the portal's page and the
    export show it whole. Read a page at a time, each page's versions
    with it."""
    entries: list[CatalogueEntry] = []
    cursor: str | None = None
    while True:
        page = await catalogue_page(conn, cursor=cursor)
        entries.extend(page.types)
        if page.cursor is None:
            return entries
        cursor = page.cursor


async def _versions(conn: asyncpg.Connection, names: list[str]) -> dict[str, list[CatalogueVersion]]:
    if not names:
        return {}
    found: dict[str, list[CatalogueVersion]] = {}
    for r in await conn.fetch(*QUERIES["catalogue_versions_of"](types=names)):
        found.setdefault(r["type"], []).append(
            CatalogueVersion(r["version"], json.loads(r["schema"]), json.loads(r["example"]))
        )
    return found


def _entry(row: Any, versions: list[CatalogueVersion]) -> CatalogueEntry:
    return CatalogueEntry(
        name=row["name"],
        description=row["description"],
        group=row["type_group"],
        deprecated_since=row["deprecated_since"],
        archived=row["archived"],
        versions=tuple(versions),
    )
