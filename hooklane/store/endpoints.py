"""Endpoints: the local-mode CLI and the operator both write them here."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from hooklane.manifest import EndpointSpec
from hooklane.store.queries import QUERIES


@dataclass(frozen=True)
class Upserted:
    id: int
    partition: int
    created: bool


async def upsert_endpoint(conn: asyncpg.Connection, spec: EndpointSpec, secret: str | None) -> Upserted:
    """Create or update the endpoint named by the spec. ``secret`` is the
    ``whsec_`` signing secret, or None while it cannot be read: the endpoint
    then receives deliveries but none is sent until a secret arrives."""
    row = await conn.fetchrow(
        QUERIES["upsert_endpoint"],
        spec.namespace,
        spec.name,
        spec.tenant,
        spec.url,
        secret,
        spec.max_concurrency,
        list(spec.event_types),
        spec.timeout_seconds,
        spec.paused,
    )
    return Upserted(row["id"], row["partition"], row["created"])


async def list_endpoints(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(QUERIES["list_endpoints"])


async def reactivate_endpoint(conn: asyncpg.Connection, namespace: str, name: str) -> bool:
    return await conn.fetchval(QUERIES["reactivate_endpoint"], namespace, name) is not None


async def delete_endpoint(conn: asyncpg.Connection, namespace: str, name: str) -> bool:
    return await conn.fetchval(QUERIES["delete_endpoint"], namespace, name) is not None


async def endpoint_queues(
    conn: asyncpg.Connection, partitions: list[int] | None = None
) -> list[asyncpg.Record]:
    """Per endpoint: pending, in flight, oldest pending age and circuit state,
    most delayed first."""
    return await conn.fetch(QUERIES["endpoint_queues"], partitions)
