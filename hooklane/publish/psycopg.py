"""Publishing on a psycopg 3 connection (Django's among them), sync and
async, inside the caller's transaction.

The same call as :func:`hooklane.publish`, on psycopg's connections: the
arguments checked first, then the publish function
(``hooklane_try_publish_v3``), whose refusal is raised as ``InvalidInput``
or ``EventConflict`` and leaves the transaction usable. Django (4.2 and
later, on psycopg 3)::

    with transaction.atomic():
        order.save()
        publish(connection.connection, tenant="acme", type="order.created", data={...})
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from hooklane.publish import arguments
from hooklane.store.events import published
from hooklane.store.queries import QUERIES


def publish(
    conn: psycopg.Connection[Any],
    *,
    tenant: str,
    type: str,
    data: dict[str, Any],
    id: str | None = None,
    coalesce_key: str | None = None,
    traceparent: str | None = None,
    ordering_key: str | None = None,
) -> str:
    """:func:`hooklane.publish` on a psycopg ``Connection``: returns the
    event id. In autocommit mode the event commits by itself."""
    args = arguments(
        tenant=tenant,
        type=type,
        data=data,
        id=id,
        coalesce_key=coalesce_key,
        traceparent=traceparent,
        ordering_key=ordering_key,
    )
    with conn.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(QUERIES["publish"].written, args).fetchone()
    assert row is not None, "publish returns one row, always"
    return published(row, tenant=tenant, id=id).event_id


async def publish_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    tenant: str,
    type: str,
    data: dict[str, Any],
    id: str | None = None,
    coalesce_key: str | None = None,
    traceparent: str | None = None,
    ordering_key: str | None = None,
) -> str:
    """:func:`publish` on a psycopg ``AsyncConnection``."""
    args = arguments(
        tenant=tenant,
        type=type,
        data=data,
        id=id,
        coalesce_key=coalesce_key,
        traceparent=traceparent,
        ordering_key=ordering_key,
    )
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(QUERIES["publish"].written, args)
        row = await cursor.fetchone()
    assert row is not None, "publish returns one row, always"
    return published(row, tenant=tenant, id=id).event_id
