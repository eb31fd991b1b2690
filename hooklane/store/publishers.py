"""Publishing scopes: which tenants a database role may publish for
(migration 0015, docs/publishing.md), checked by the publish functions
against the role a connection logged in as."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from hooklane.errors import InvalidInput, printable
from hooklane.store.queries import QUERIES


@dataclass(frozen=True)
class PublisherScope:
    """A role's tenants (``None`` among them: every tenant), and whether it
    holds EXECUTE on the publish functions of each version (``execute[0]``:
    v1, ...)."""

    role: str
    tenants: tuple[str | None, ...]
    execute: tuple[bool, ...]


async def _check_role(conn: asyncpg.Connection, role: str) -> None:
    if not await conn.fetchval(*QUERIES["publisher_role_exists"](role=role)):
        raise InvalidInput("role", f"no database role is named {printable(role)}")


async def grant_publisher(conn: asyncpg.Connection, role: str, tenants: Sequence[str | None]) -> int:
    """Let ``role`` publish for ``tenants`` (``None``: every tenant), with
    EXECUTE on the publish functions, in one transaction. Returns how many
    of the tenants are new to its scope."""
    async with conn.transaction():
        await _check_role(conn, role)
        added = await conn.fetchval(*QUERIES["grant_publisher_scopes"](role=role, tenants=list(tenants)))
        await conn.execute(
            await conn.fetchval(*QUERIES["publisher_execute_statement"](role=role, grant=True))
        )
    return int(added)


async def revoke_publisher(
    conn: asyncpg.Connection, role: str, tenants: Sequence[str | None] | None
) -> tuple[int, int]:
    """Take ``tenants`` from ``role``'s scope (``None``: all of them); once
    none is left, EXECUTE too. Returns how many were taken and how many
    are left."""
    async with conn.transaction():
        await _check_role(conn, role)
        row = await conn.fetchrow(
            *QUERIES["revoke_publisher_scopes"](
                role=role, tenants=list(tenants or []), all_scopes=tenants is None
            )
        )
        assert row is not None
        if row["remaining"] == 0:
            await conn.execute(
                await conn.fetchval(*QUERIES["publisher_execute_statement"](role=role, grant=False))
            )
    return int(row["removed"]), int(row["remaining"])


async def publisher_scopes(conn: asyncpg.Connection) -> list[PublisherScope]:
    """Every role with a scope or with EXECUTE on the publish functions,
    by name; the owner, its members and superusers are not listed (they
    publish for every tenant)."""
    rows = await conn.fetch(*QUERIES["publisher_scopes"]())
    return [PublisherScope(r["role"], tuple(r["tenants"]), tuple(r["execute"])) for r in rows]
