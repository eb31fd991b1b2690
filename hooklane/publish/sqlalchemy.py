"""Publishing through SQLAlchemy (2.0), sync and async, inside the caller's
transaction: on a ``Connection`` or a ``Session``, whichever driver is
under it (psycopg, psycopg2, asyncpg, pg8000).

The same call as :func:`hooklane.publish`: the arguments checked first,
then the publish function (``hooklane_try_publish_v3``), whose refusal is
raised as ``InvalidInput`` or ``EventConflict`` and leaves the transaction
usable::

    with Session(engine) as session, session.begin():
        session.add(order)
        publish(session, tenant="acme", type="order.created", data={...})
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from hooklane.publish import arguments
from hooklane.store.events import published
from hooklane.store.queries import QUERIES

_PUBLISH: TextClause = text(QUERIES["publish"].colon_named())


def publish(
    bind: Connection | Session,
    *,
    tenant: str,
    type: str,
    data: dict[str, Any],
    id: str | None = None,
    coalesce_key: str | None = None,
    traceparent: str | None = None,
    ordering_key: str | None = None,
) -> str:
    """:func:`hooklane.publish` on a SQLAlchemy ``Connection`` or
    ``Session``: returns the event id. A session begins its transaction
    here if none is open, and the event commits with it."""
    args = arguments(
        tenant=tenant,
        type=type,
        data=data,
        id=id,
        coalesce_key=coalesce_key,
        traceparent=traceparent,
        ordering_key=ordering_key,
    )
    row = bind.execute(_PUBLISH, args).mappings().one()
    return published(row, tenant=tenant, id=id).event_id


async def publish_async(
    bind: AsyncConnection | AsyncSession,
    *,
    tenant: str,
    type: str,
    data: dict[str, Any],
    id: str | None = None,
    coalesce_key: str | None = None,
    traceparent: str | None = None,
    ordering_key: str | None = None,
) -> str:
    """:func:`publish` on a SQLAlchemy ``AsyncConnection`` or
    ``AsyncSession``."""
    args = arguments(
        tenant=tenant,
        type=type,
        data=data,
        id=id,
        coalesce_key=coalesce_key,
        traceparent=traceparent,
        ordering_key=ordering_key,
    )
    row = (await bind.execute(_PUBLISH, args)).mappings().one()
    return published(row, tenant=tenant, id=id).event_id
