"""Tenant grants: the single-use links the admin API hands out, the
sessions and tenant tokens they become, and the check every tenant route
starts with (the endpoint is the tenant's, or it does not exist).

A token is 32 random bytes, shown once; Postgres keeps only its SHA-256,
so that reading the table opens nothing. The grants live in Postgres, not
in one API process, so that every replica honours (and ends) the same
sessions.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum

import asyncpg

from hooklane.errors import InvalidInput, shown
from hooklane.store.queries import QUERIES

# What a token looks like, so that a leaked one is recognised (secret
# scanners, logs): a link, and a session or tenant token.
LINK_PREFIX = "hlpl_"
SESSION_PREFIX = "hlps_"


class Access(IntEnum):
    """What a tenant grant allows, each level everything below it too."""

    READ = 1  # see endpoints, deliveries, attempts and events
    RESEND = 2  # resend dead deliveries, replay, send a test event
    MANAGE = 3  # create, edit, pause, delete endpoints; rotate their secrets

    def __str__(self) -> str:
        return self.name.lower()


def check_access(value: object, field: str = "access") -> Access:
    if value is None:
        return Access.READ
    for level in Access:
        if value == str(level):
            return level
    raise InvalidInput(field, f"must be one of {', '.join(str(a) for a in Access)}, not {shown(value)}")


@dataclass(frozen=True)
class TenantGrant:
    """A live session's (or tenant token's) tenant and rights."""

    tenant: str
    access: Access
    expires_at: datetime

    def allows(self, wanted: Access) -> bool:
        return self.access >= wanted


@dataclass(frozen=True)
class Issued:
    """A new link or token: shown to the caller once, never stored."""

    token: str
    expires_at: datetime


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _new_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


async def issue(
    conn: asyncpg.Connection, tenant: str, access: Access, seconds: float, *, link: bool
) -> Issued:
    """A single-use link for ``tenant`` (``link``), good for ``seconds``,
    or a tenant token, good for requests until ``seconds`` pass."""
    token = _new_token(LINK_PREFIX if link else SESSION_PREFIX)
    expires_at = await conn.fetchval(
        *QUERIES["create_portal_grant"](
            digest=_digest(token),
            kind="link" if link else "session",
            tenant=tenant,
            access=str(access),
            seconds=seconds,
        )
    )
    return Issued(token, expires_at)


async def redeem(conn: asyncpg.Connection, link: str, seconds: float) -> tuple[Issued, TenantGrant] | None:
    """The session a link opens, good for ``seconds``; None when the link
    is unknown, expired or used already (which the caller cannot tell
    apart, and need not)."""
    if not link.startswith(LINK_PREFIX):
        return None
    session = _new_token(SESSION_PREFIX)
    row = await conn.fetchrow(
        *QUERIES["redeem_portal_link"](link=_digest(link), session=_digest(session), seconds=seconds)
    )
    if row is None:
        return None
    return Issued(session, row["expires_at"]), _grant(row)


async def session_grant(conn: asyncpg.Connection, token: str) -> TenantGrant | None:
    """The grant of a live session or tenant token; None for any other."""
    if not token.startswith(SESSION_PREFIX):
        return None
    row = await conn.fetchrow(*QUERIES["portal_session"](digest=_digest(token)))
    return None if row is None else _grant(row)


async def end_session(conn: asyncpg.Connection, token: str) -> None:
    await conn.execute(*QUERIES["end_portal_session"](digest=_digest(token)))


def _grant(row: asyncpg.Record) -> TenantGrant:
    return TenantGrant(row["tenant"], check_access(row["access"]), row["expires_at"])


@asynccontextmanager
async def tenant_endpoint(
    conn: asyncpg.Connection, tenant: str, namespace: str, name: str, *, change: bool = False
) -> AsyncIterator[int | None]:
    """A transaction in which the endpoint's id is given if it belongs to
    ``tenant``, None otherwise (another tenant's endpoint and none at all
    read the same). What is read or changed in it sees the endpoint with
    this tenant: a read in one snapshot with the check (repeatable read),
    a ``change`` with the endpoint share-locked, so that moving it to
    another tenant waits until the change is done."""
    if change:
        async with conn.transaction():
            yield await conn.fetchval(
                *QUERIES["lock_tenant_endpoint"](namespace=namespace, name=name, tenant=tenant)
            )
    else:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            yield await conn.fetchval(
                *QUERIES["tenant_endpoint"](namespace=namespace, name=name, tenant=tenant)
            )


async def send_test_event(conn: asyncpg.Connection, endpoint_id: int, tenant: str) -> int | None:
    """Queue a ``hooklane.test`` event for one endpoint only; the new
    delivery's id (None if the endpoint went meanwhile)."""
    event_id = "test_" + secrets.token_hex(12)
    data = {"test": True, "message": "A test event sent from the webhook portal.", "tenant": tenant}
    value: int | None = await conn.fetchval(
        *QUERIES["send_test_event"](endpoint_id=endpoint_id, id=event_id, data=json.dumps(data))
    )
    return value
